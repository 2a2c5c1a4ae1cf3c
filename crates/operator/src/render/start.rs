//! The server container's start script, shipped in the cluster's ConfigMap.
//!
//! # A restarted primary holds until its replica took over
//!
//! A primary's server that restarts in place (a crash, an OOM kill, a liveness restart, a node
//! reboot) finds its `nodes.conf` but, at best, the data of its last save: with an RDB
//! schedule or an AOF fsync policy it is older than what its replicas acknowledged, and
//! without persistence it is empty. If it rejoined under its identity it would be the primary
//! of its slots again at once (it comes back faster than `cluster-node-timeout`), and its
//! replica would resynchronise from it: every acknowledged write newer than its files would
//! be gone. Valkey itself has no guard against this (valkey-io/valkey#579).
//!
//! So when `nodes.conf` says the node was a primary owning slots with replicas, the script
//! does not start the server: it **holds**, and every 200 ms asks the other nodes (their
//! addresses from `nodes.conf`, as the read-only `_exporter` user of the probes):
//!
//! - a former replica of this node now owns its first slot: the shard failed over (the
//!   operator's `FORCE`/`TAKEOVER`, which it drives because nothing listens at this pod's
//!   address, or Valkey's own election). The old files are superseded; the script empties the
//!   data directory and starts the server as a new, empty node, which the operator attaches
//!   as a replica of the new primary;
//! - no former replica streamed from this node in its current life (each one restarted too,
//!   `master_link_down_since_seconds` is -1: the same rule as the operator's failover), or
//!   none has answered for twice `cluster-node-timeout` ([`MIN_UNREACHABLE_HOLD_SECONDS`] at
//!   least): no copy newer than this node's
//!   files exists, so the server starts with its identity and its files (the loss is then
//!   bounded by the persistence settings; without persistence the shard is empty);
//! - otherwise it keeps holding, however long that takes: with one or two shards only the
//!   operator can promote the replica, and if the operator is down the shard waits for it
//!   rather than serving older data.
//!
//! While it holds, a marker file in the data directory keeps the liveness probe passing (the
//! readiness probe fails: nothing listens). Replicas and primaries without replicas or slots
//! start at once.

use super::paths::{CONFIG_DIR, CONFIG_FILE, DATA_DIR};
use super::probes::cli_prelude;

/// ConfigMap key of the start script.
pub const START_KEY: &str = "start.sh";

/// Marker file (in the data directory) present while a restarted primary holds; the liveness
/// probe passes while it exists.
pub const HOLD_MARKER: &str = "valkey-operator-holding";

/// How long a holding primary waits when no former replica answers (they may be restarting,
/// or cut off) before it starts from its own files: twice `cluster-node-timeout`, at least
/// this many seconds. With three or more shards Valkey would have elected a live replica by
/// then; a whole cluster restarted at new pod IPs reaches nobody at the old addresses and
/// waits this long.
pub const MIN_UNREACHABLE_HOLD_SECONDS: u32 = 10;

/// Command of the `server` container.
pub fn start_command() -> Vec<String> {
    vec!["sh".into(), format!("{CONFIG_DIR}/{START_KEY}")]
}

/// The script (POSIX sh, awk, tr, date, sleep, timeout and valkey-cli: all in the Valkey images).
pub fn start_script(tls: bool) -> String {
    SCRIPT
        .replace("@PRELUDE@", &cli_prelude(tls))
        .replace("@DATA@", DATA_DIR)
        .replace("@CONFIG_FILE@", CONFIG_FILE)
        .replace("@HOLD@", HOLD_MARKER)
        .replace(
            "@MIN_UNREACHABLE@",
            &MIN_UNREACHABLE_HOLD_SECONDS.to_string(),
        )
        .replace("@ADDRS@", ADDRS_AWK)
}

/// Awk program printing "host port" for each `CLUSTER NODES`/`nodes.conf` line. The address
/// field is `host:port@bus[,hostname][,aux=value...]`; IPv6 hosts keep their colons. With TLS
/// the plaintext port is 0 and the client port is the `tls-port` aux field.
const ADDRS_AWK: &str = r#"{
    a = $2; tls = ""
    if (match(a, /tls-port=[0-9]+/)) tls = substr(a, RSTART + 9, RLENGTH - 9)
    sub(/@.*/, "", a); n = split(a, p, ":"); port = p[n]
    if (port + 0 == 0 && tls != "") port = tls
    print substr(a, 1, length(a) - length(p[n]) - 1), port
  }"#;

const SCRIPT: &str = r#"#!/bin/sh
# Rendered by valkey-operator: start valkey-server; see the operator's render/start.rs.
data=@DATA@
conf=$data/nodes.conf
rm -f "$data/@HOLD@"
start() {
  rm -f "$data/@HOLD@"
  exec docker-entrypoint.sh valkey-server @CONFIG_FILE@ --cluster-announce-ip "$POD_IP"
}
[ -f "$conf" ] || start
me=$(awk '$3 ~ /myself/ && $3 ~ /master/ {print $1}' "$conf")
slot=$(awk '$3 ~ /myself/ {for (i = 9; i <= NF; i++) if ($i ~ /^[0-9]/) {split($i, r, "-"); print r[1]; exit}}' "$conf")
replicas=$(awk -v me="$me" 'me != "" && $4 == me {printf " %s ", $1}' "$conf")
[ -n "$me" ] && [ -n "$slot" ] && [ -n "$replicas" ] || start

@PRELUDE@# peer HOST PORT ARGS...: valkey-cli against another node, bounded in time.
peer() {
  h=$1; p=$2; shift 2
  timeout 3 valkey-cli $cli_flags -t 1 -h "$h" -p "$p" "$@"
}
# "host port" of each CLUSTER NODES line on stdin.
addrs() {
  awk '@ADDRS@'
}
# The first view of the cluster any other node gives.
view() {
  awk '$3 !~ /myself/' "$conf" | addrs | while read -r h p; do
    v=$(peer "$h" "$p" CLUSTER NODES 2>/dev/null | tr -d '\r')
    case "$v" in *myself*) printf '%s\n' "$v"; break ;; esac
  done
}
# The former replica (of $replicas) that owns slot $slot as a live primary in view $1.
successor() {
  printf '%s\n' "$1" | awk -v s="$slot" -v reps="$replicas" '
    index(reps, " " $1 " ") && $3 ~ /master/ && $3 !~ /fail/ {
      for (i = 9; i <= NF; i++) {
        if ($i !~ /^[0-9]/) continue
        n = split($i, r, "-"); lo = r[1] + 0; hi = (n > 1 ? r[2] : r[1]) + 0
        if (s + 0 >= lo && s + 0 <= hi) { print $1; exit }
      }
    }'
}
# How the replicas still following $me in view $1 stand: "streamed" when one has streamed
# from this node in its current life, "restarted" when every one answers and none has,
# "unknown" when some do not answer.
replicas_state() {
  printf '%s\n' "$1" | awk -v me="$me" '$4 == me' | addrs | {
    state=restarted
    while read -r h p; do
      info=$(peer "$h" "$p" INFO replication 2>/dev/null | tr -d '\r')
      case "$info" in
        *role:slave*|*role:replica*) ;;
        *) state=unknown; continue ;;
      esac
      down=$(printf '%s\n' "$info" | awk -F: '$1 == "master_link_down_since_seconds" {print $2}')
      case "$info" in *master_link_status:up*) down=0 ;; esac
      if [ -n "$down" ] && [ "$down" -ge 0 ]; then state=streamed; break; fi
    done
    echo "$state"
  }
}

timeout_ms=$(awk '$1 == "cluster-node-timeout" {t = $2} END {print t + 0}' @CONFIG_FILE@)
unreachable=$((timeout_ms * 2 / 1000))
[ "$unreachable" -ge @MIN_UNREACHABLE@ ] || unreachable=@MIN_UNREACHABLE@
echo "restarted as primary $me of slot $slot with replicas:$replicas; holding until one of them takes over"
touch "$data/@HOLD@"
trap 'rm -f "$data/@HOLD@"; exit 0' TERM INT
silent_since=$(date +%s)
while :; do
  v=$(view)
  state=unknown
  if [ -n "$v" ]; then
    new=$(successor "$v")
    if [ -n "$new" ]; then
      echo "replica $new took over slot $slot: starting as a new, empty node"
      rm -rf "$data"/* "$data"/.[!.]*
      start
    fi
    state=$(replicas_state "$v")
  fi
  case "$state" in
    streamed) silent_since=$(date +%s) ;;
    restarted)
      echo "no replica streamed from this node since it started: starting from its own files"
      start
      ;;
    *)
      if [ $(($(date +%s) - silent_since)) -ge "$unreachable" ]; then
        echo "no replica answered for ${unreachable}s: starting from its own files"
        start
      fi
      ;;
  esac
  sleep 0.2
done
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::paths::SYSTEM_DIR;
    use crate::render::secrets::EXPORTER_PASSWORD_KEY;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// The script pointed at a scratch directory, with `docker-entrypoint.sh` replaced by an
    /// `echo` of its arguments.
    struct Sandbox {
        dir: tempfile::TempDir,
    }

    impl Sandbox {
        fn new(node_timeout_ms: u32) -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            for d in ["data", "config", "system", "bin"] {
                std::fs::create_dir_all(dir.path().join(d)).expect("dir");
            }
            let p = dir.path();
            std::fs::write(
                p.join("config/valkey.conf"),
                format!("port 6379\ncluster-node-timeout {node_timeout_ms}\n"),
            )
            .expect("conf");
            std::fs::write(
                p.join("system").join(EXPORTER_PASSWORD_KEY),
                valkey_testkit::EXPORTER_PASSWORD,
            )
            .expect("password");
            let shim = p.join("bin/docker-entrypoint.sh");
            std::fs::write(&shim, "#!/bin/sh\necho exec \"$@\"\n").expect("shim");
            Command::new("chmod")
                .arg("+x")
                .arg(&shim)
                .status()
                .expect("chmod");
            Self { dir }
        }

        fn data(&self) -> PathBuf {
            self.dir.path().join("data")
        }

        fn spawn(&self) -> Child {
            let p = self.dir.path();
            let script = start_script(false)
                .replace(
                    CONFIG_FILE,
                    &p.join("config/valkey.conf").display().to_string(),
                )
                .replace(SYSTEM_DIR, &p.join("system").display().to_string())
                .replace(DATA_DIR, &self.data().display().to_string());
            Command::new("sh")
                .arg("-c")
                .arg(script)
                .env("PATH", format!("{}:/usr/bin:/bin", p.join("bin").display()))
                .env("POD_IP", "10.0.0.7")
                .stdout(Stdio::piped())
                .spawn()
                .expect("sh")
        }

        /// Runs the script to its end (at most `limit`) and returns its output.
        fn run(&self, limit: Duration) -> String {
            finish(self.spawn(), Instant::now() + limit)
        }

        fn holding(&self) -> bool {
            self.data().join(HOLD_MARKER).exists()
        }
    }

    /// Waits for the script to end (it must before `deadline`) and returns its output.
    fn finish(mut child: Child, deadline: Instant) -> String {
        while child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "the script still holds");
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).expect("write");
    }

    const PRIMARY_WITH_REPLICA: &str = "\
aaa 10.0.0.7:6379@16379 myself,master - 0 0 1 connected 0-5460
bbb 10.0.0.8:6379@16379 slave aaa 0 1 1 connected
ccc 10.0.0.9:6379@16379 master - 0 1 2 connected 5461-16383
vars currentEpoch 2 lastVoteEpoch 0
";

    #[test]
    fn addresses_of_plain_tls_and_ipv6_lines() {
        let lines = "\
a 10.0.0.7:6379@16379 myself,master - 0 0 1 connected 0-5460
b 10.244.0.13:0@16379,,tls-port=6379,shard-id=a29 slave a 0 1 8 connected
c 10.0.0.9:6379@16379,host-c master - 0 1 2 connected 5461-16383
d 2001:db8::1:6379@16379 slave c 0 1 2 connected
";
        let out = Command::new("awk")
            .arg(ADDRS_AWK)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().expect("stdin").write_all(lines.as_bytes())?;
                c.wait_with_output()
            })
            .expect("awk");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "10.0.0.7 6379\n10.244.0.13 6379\n10.0.0.9 6379\n2001:db8::1 6379\n"
        );
    }

    #[test]
    fn first_start_execs_the_server() {
        let sb = Sandbox::new(100);
        let out = sb.run(Duration::from_secs(5));
        assert!(out.contains("exec valkey-server"), "{out}");
        assert!(out.contains("--cluster-announce-ip 10.0.0.7"), "{out}");
    }

    #[test]
    fn replicas_and_primaries_without_replicas_or_slots_start_at_once() {
        let replica = PRIMARY_WITH_REPLICA
            .replace("myself,master", "master")
            .replace("slave aaa", "myself,slave aaa");
        let lonely = "aaa 10.0.0.7:6379@16379 myself,master - 0 0 1 connected 0-16383\n";
        let slotless = PRIMARY_WITH_REPLICA.replace(" 0-5460", "");
        for conf in [replica.as_str(), lonely, &slotless] {
            let sb = Sandbox::new(100);
            write(&sb.data().join("nodes.conf"), conf);
            write(&sb.data().join("dump.rdb"), "REDIS0011");
            let out = sb.run(Duration::from_secs(5));
            assert!(
                out.contains("exec valkey-server") && !out.contains("holding"),
                "{out}"
            );
            assert!(sb.data().join("nodes.conf").exists() && sb.data().join("dump.rdb").exists());
        }
    }

    /// A restarted primary whose peers are all unreachable holds (here: nothing listens at the
    /// loopback addresses of its `nodes.conf`), then starts from its files.
    #[test]
    fn restarted_primary_with_replicas_holds() {
        let sb = Sandbox::new(100);
        write(
            &sb.data().join("nodes.conf"),
            &PRIMARY_WITH_REPLICA.replace("10.0.0.", "127.0.0."),
        );
        let mut child = sb.spawn();
        let t0 = Instant::now();
        while !sb.holding() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(sb.holding(), "no hold marker");
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the script stopped holding"
        );
        // Nobody answers: after the bound (in seconds, however long each round of asking
        // takes) it starts from its own files.
        let bound = Duration::from_secs(u64::from(MIN_UNREACHABLE_HOLD_SECONDS));
        let out = finish(child, t0 + bound + Duration::from_secs(15));
        // `date +%s` counts whole seconds.
        assert!(
            t0.elapsed() + Duration::from_secs(1) >= bound,
            "stopped holding before the bound"
        );
        assert!(
            out.contains("no replica answered for 10s") && out.contains("exec valkey-server"),
            "{out}"
        );
        assert!(
            sb.data().join("nodes.conf").exists() && !sb.holding(),
            "{out}"
        );
    }

    /// Against real servers: a 3-shard cluster whose shard-0 primary is killed. Its restarted
    /// start script holds until the replica takes over, then starts as a new empty node; a
    /// second time, with the replica restarted too (it holds nothing newer), it starts at once
    /// from its own files.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn holds_against_real_servers_until_the_replica_takes_over() {
        use valkey_testkit::{Flavor, Server, form_cluster, operator_pool, start_servers};
        let flavor = if Flavor::V9.installed().is_some() {
            Flavor::V9
        } else if Flavor::V8.installed().is_some() {
            Flavor::V8
        } else {
            eprintln!("skipped: no valkey-server installed");
            return;
        };
        if !Path::new("/usr/bin/valkey-cli").exists() {
            eprintln!("skipped: valkey-cli not installed");
            return;
        }
        let mut servers = start_servers(flavor, 4, None);
        let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
        let pool = operator_pool(None);
        form_cluster(&pool, &addrs[..3], &addrs[3..]).await;
        let nodes_conf = |s: &Server| {
            std::fs::read_to_string(s.dir.path().join("nodes.conf")).expect("nodes.conf")
        };

        // The replica streamed from the primary: the script holds until it took over.
        let sb = Sandbox::new(2000);
        write(&sb.data().join("nodes.conf"), &nodes_conf(&servers[0]));
        servers[0].kill();
        let mut child = sb.spawn();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            child.try_wait().expect("wait").is_none() && sb.holding(),
            "not holding"
        );
        valkey_ops::commands::failover(
            &pool,
            &addrs[3],
            valkey_ops::commands::FailoverMode::Takeover,
            Duration::from_secs(10),
        )
        .await
        .expect("takeover");
        let out = finish(child, Instant::now() + Duration::from_secs(10));
        assert!(
            out.contains("took over slot 0") && out.contains("exec valkey-server"),
            "{out}"
        );
        assert!(
            !sb.data().join("nodes.conf").exists(),
            "the old identity must go: {out}"
        );

        // Shard 1's primary dies and its only replica restarts before anything took over:
        // no copy is newer than the primary's files, so it starts from them at once.
        let id1 = valkey_ops::commands::node_id(&pool, &addrs[1])
            .await
            .expect("id");
        let mut replica_of_1 = Server::start(flavor, None);
        valkey_testkit::join_nodes(&pool, &addrs[1], &[replica_of_1.addr()]).await;
        valkey_testkit::attach_replica(&pool, &replica_of_1.addr(), &id1).await;
        valkey_testkit::eventually("replica synced", Duration::from_secs(20), || async {
            let o = valkey_ops::commands::observe_node(&pool, &replica_of_1.addr())
                .await
                .ok()?;
            o.replication?.is_synced_replica().then_some(())
        })
        .await;
        let sb = Sandbox::new(2000);
        write(&sb.data().join("nodes.conf"), &nodes_conf(&servers[1]));
        let conf = replica_of_1.dir.path().join("valkey.conf");
        let port = replica_of_1.port;
        servers[1].kill();
        replica_of_1.kill();
        let _restarted = Server::start_config(&flavor.binary(), &conf, port, &[]);
        let out = sb.run(Duration::from_secs(10));
        assert!(
            out.contains("no replica streamed") && out.contains("exec valkey-server"),
            "{out}"
        );
        assert!(
            sb.data().join("nodes.conf").exists(),
            "it keeps its identity: {out}"
        );
    }
}
