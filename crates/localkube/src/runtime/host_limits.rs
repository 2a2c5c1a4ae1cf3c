//! Kernel limits every pod shares with the host, sized for the pods an environment runs.
//!
//! A real node gives each pod its own kernel budget only in part; localkube runs every pod in
//! a network namespace of one host, so what the kernel keeps globally is shared by all of
//! them. With the defaults, about 40 pods in a full mesh (a Valkey cluster bus) overflow the
//! neighbour table ("neighbor table overflow"), and the host stops reaching pods. So an
//! environment raises, never lowers:
//!
//! - the IPv4 and IPv6 neighbour tables (`gc_thresh1..3`, global across namespaces): `n` pods
//!   in a full mesh plus the host hold about `(n + 1)²` entries; the hard limit is 4 times
//!   that, room for a few such environments side by side;
//! - connection tracking (`nf_conntrack_max`, global, when the module is loaded: bridged
//!   traffic goes through the host's netfilter with `br_netfilter`): two connections per pair;
//! - inotify instances and watches (per user: every non-root pod runs as the same user);
//! - the open-file limit of localkube itself, which its containers inherit (raised to the hard
//!   limit).
//!
//! Not shared, so left alone: ephemeral ports (`ip_local_port_range` is per network
//! namespace), `somaxconn` (per namespace). Bounded by the pod CIDR instead: a bridge takes at
//! most 1024 ports, a `/24` slice holds 253 pods.

use std::path::Path;

/// Ports a Linux bridge takes (`BR_MAX_PORTS`): no environment runs more pods.
pub const MAX_BRIDGE_PORTS: u64 = 1024;

/// A limit raised for the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised {
    /// The sysctl path under `/proc/sys`, or `RLIMIT_NOFILE`.
    pub what: String,
    /// The value before.
    pub from: u64,
    /// The value after.
    pub to: u64,
}

/// The sysctl minimums for `pods` pods: `(path under /proc/sys, minimum)`, in the order they
/// must be raised (each `gc_thresh` below the next).
pub fn minimums(pods: u64) -> Vec<(String, u64)> {
    let mesh = (pods + 1) * (pods + 1);
    let mut v = Vec::new();
    for table in ["net/ipv4/neigh/default", "net/ipv6/neigh/default"] {
        // Raised top down: the kernel does not check the order, but a reader expects it.
        v.push((format!("{table}/gc_thresh3"), 4 * mesh));
        v.push((format!("{table}/gc_thresh2"), 2 * mesh));
        v.push((format!("{table}/gc_thresh1"), mesh));
    }
    v.push(("net/netfilter/nf_conntrack_max".into(), 4 * mesh));
    v.push(("fs/inotify/max_user_instances".into(), 8192.max(16 * pods)));
    v.push((
        "fs/inotify/max_user_watches".into(),
        524_288.max(4096 * pods),
    ));
    v
}

/// Raises the shared limits for an environment of `pods` pods (best effort: a limit that
/// cannot be read or written is logged and skipped). Returns what changed.
pub fn size_for(pods: u64) -> Vec<Raised> {
    let mut raised = Vec::new();
    for (path, min) in minimums(pods) {
        let full = Path::new("/proc/sys").join(&path);
        let Ok(text) = std::fs::read_to_string(&full) else {
            continue; // Not on this kernel (no conntrack module, no IPv6).
        };
        let Ok(now) = text.trim().parse::<u64>() else {
            continue;
        };
        if now >= min {
            continue;
        }
        match std::fs::write(&full, min.to_string()) {
            Ok(()) => raised.push(Raised {
                what: path,
                from: now,
                to: min,
            }),
            Err(e) => tracing::warn!(sysctl = %path, error = %e, "cannot raise a shared limit"),
        }
    }
    match raise_nofile() {
        Ok(Some(r)) => raised.push(r),
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    for r in &raised {
        tracing::info!(what = %r.what, from = r.from, to = r.to, pods, "shared limit raised");
    }
    raised
}

/// Raises the soft open-file limit to the hard one.
fn raise_nofile() -> nix::Result<Option<Raised>> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= hard {
        return Ok(None);
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    Ok(Some(Raised {
        what: "RLIMIT_NOFILE".into(),
        from: soft,
        to: hard,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_mesh_of_200_pods_fits_the_neighbour_table() {
        let m = minimums(200);
        let get = |p: &str| m.iter().find(|(k, _)| *k == p).unwrap().1;
        let entries = 201 * 201;
        assert!(get("net/ipv4/neigh/default/gc_thresh3") >= 2 * entries);
        assert!(get("net/ipv4/neigh/default/gc_thresh2") >= entries);
        assert!(
            get("net/ipv4/neigh/default/gc_thresh1") <= get("net/ipv4/neigh/default/gc_thresh2")
        );
        assert!(get("net/netfilter/nf_conntrack_max") >= 2 * 200 * 199);
        assert!(get("fs/inotify/max_user_instances") >= 8192);
    }
}
