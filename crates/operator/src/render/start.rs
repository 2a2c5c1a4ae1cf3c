//! The server container's start script, shipped in the cluster's ConfigMap.
//!
//! Without persistence a restarted server process (a crash, an OOM kill)
//! finds its old `nodes.conf` in the pod's emptyDir but none of its data. If
//! it rejoined under its old identity it would come back as the primary of
//! its slots with an empty dataset, and its replica would resync from it:
//! every acknowledged write of the shard would be lost. So when a primary
//! that has replicas restarts without persistence, the script empties the
//! data directory, `nodes.conf` and any RDB/AOF file a former life as a replica
//! left there (the process comes back as a new, empty node the operator can
//! attach as a replica) and waits past the failure-detection time so that
//! Valkey promotes the replica before anything listens on the old address.
//! A primary without replicas keeps its identity (its data is gone either
//! way, and a new identity would orphan its slots); replicas and persistent
//! nodes start unchanged.

use super::config::{CONFIG_DIR, CONFIG_FILE, DATA_DIR};

/// ConfigMap key of the start script.
pub const START_KEY: &str = "start.sh";

/// Environment variable telling the script whether `/data` is persistent.
pub const PERSISTENT_ENV: &str = "VALKEY_DATA_PERSISTENT";

/// Command of the `server` container.
pub fn start_command() -> Vec<String> {
    vec!["sh".into(), format!("{CONFIG_DIR}/{START_KEY}")]
}

/// The script (POSIX sh + awk, both in the Valkey images).
pub fn start_script() -> String {
    format!(
        r#"#!/bin/sh
# Rendered by valkey-operator: start valkey-server; see the operator's render/start.rs.
conf={DATA_DIR}/nodes.conf
if [ "${PERSISTENT_ENV}" != "true" ] && [ -f "$conf" ]; then
  me=$(awk '$3 ~ /myself/ {{print $1}}' "$conf")
  role=$(awk '$3 ~ /myself/ {{print $3}}' "$conf")
  case "$role" in
    *master*|*primary*)
      if [ -n "$me" ] && awk -v me="$me" '$4 == me {{found=1}} END {{exit !found}}' "$conf"; then
        timeout=$(awk '$1 == "cluster-node-timeout" {{t=$2}} END {{print t+0}}' {CONFIG_FILE})
        [ "$timeout" -gt 0 ] || timeout=15000
        wait=$(( timeout * 2 / 1000 + 2 ))
        echo "restart without persistence: leaving the cluster as $me, waiting ${{wait}}s for a replica to take over"
        rm -rf {DATA_DIR}/* {DATA_DIR}/.[!.]*
        sleep "$wait"
      fi
      ;;
  esac
fi
exec docker-entrypoint.sh valkey-server {CONFIG_FILE} --cluster-announce-ip "$POD_IP"
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs the script with `valkey-server`/`docker-entrypoint.sh` replaced by
    /// an `echo`, against a fake data directory, and returns its output.
    fn run(nodes_conf: Option<&str>, persistent: bool) -> (String, bool) {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let cfg = dir.path().join("config");
        std::fs::create_dir_all(&data).expect("data");
        std::fs::create_dir_all(&cfg).expect("config");
        std::fs::write(
            cfg.join("valkey.conf"),
            "port 6379\ncluster-node-timeout 100\n",
        )
        .expect("conf");
        if let Some(n) = nodes_conf {
            std::fs::write(data.join("nodes.conf"), n).expect("nodes");
            // What a former life as a replica leaves behind.
            std::fs::write(data.join("dump.rdb"), "REDIS0011").expect("rdb");
        }
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        std::fs::write(
            bin.join("docker-entrypoint.sh"),
            "#!/bin/sh\necho exec \"$@\"\n",
        )
        .expect("shim");
        Command::new("chmod")
            .arg("+x")
            .arg(bin.join("docker-entrypoint.sh"))
            .status()
            .expect("chmod");
        let script = start_script()
            .replace(DATA_DIR, &data.display().to_string())
            .replace(CONFIG_FILE, &cfg.join("valkey.conf").display().to_string());
        let out = Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("POD_IP", "10.0.0.7")
            .env(PERSISTENT_ENV, if persistent { "true" } else { "false" })
            .output()
            .expect("sh");
        let kept = data.join("nodes.conf").exists();
        assert_eq!(
            kept,
            data.join("dump.rdb").exists(),
            "the data files go with nodes.conf"
        );
        (String::from_utf8_lossy(&out.stdout).into_owned(), kept)
    }

    const PRIMARY_WITH_REPLICA: &str = "\
aaa 10.0.0.7:6379@16379 myself,master - 0 0 1 connected 0-5460
bbb 10.0.0.8:6379@16379 slave aaa 0 1 1 connected
ccc 10.0.0.9:6379@16379 master - 0 1 2 connected 5461-16383
vars currentEpoch 2 lastVoteEpoch 0
";

    #[test]
    fn first_start_execs_the_server() {
        let (out, kept) = run(None, false);
        assert!(out.contains("exec valkey-server"), "{out}");
        assert!(out.contains("--cluster-announce-ip 10.0.0.7"), "{out}");
        assert!(!kept);
    }

    #[test]
    fn restarted_ephemeral_primary_with_replicas_leaves_and_waits() {
        let (out, kept) = run(Some(PRIMARY_WITH_REPLICA), false);
        assert!(
            out.contains("leaving the cluster as aaa, waiting 2s"),
            "{out}"
        );
        assert!(out.contains("exec valkey-server"), "{out}");
        assert!(!kept, "nodes.conf must be dropped");
    }

    #[test]
    fn persistent_or_replica_or_lonely_primary_keeps_identity() {
        let (_, kept) = run(Some(PRIMARY_WITH_REPLICA), true);
        assert!(kept, "persistent node keeps nodes.conf");
        let replica = PRIMARY_WITH_REPLICA
            .replace("myself,master", "master")
            .replace("slave aaa", "myself,slave aaa");
        let (out, kept) = run(Some(&replica), false);
        assert!(kept && !out.contains("leaving"), "{out}");
        let lonely = "aaa 10.0.0.7:6379@16379 myself,master - 0 0 1 connected 0-16383\n";
        let (out, kept) = run(Some(lonely), false);
        assert!(kept && !out.contains("leaving"), "{out}");
    }
}
