//! Removing whatever a (possibly crashed) environment left behind.
//!
//! [`cleanup_leftovers`] is idempotent and safe to run when nothing is left. It kills
//! (SIGKILL) every process recorded in a `container.pid` under the state dir whose start time
//! still matches, and every process inside a network namespace named `{bridge}-*`; unmounts
//! everything mounted under the state dir (deepest first, lazily if busy); deletes those
//! namespaces, every veth whose alias is `localkube:{bridge}` or that is attached to the bridge,
//! the bridge itself and our iptables rule. It does not delete the state dir's files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::command::{ip, ip_quiet};
use super::error::Result;
use super::network::{NETNS_DIR, link_exists, remove_iptables_rule, veth_alias};
use super::pidfile::{self, PidRecord};

/// What [`cleanup_leftovers`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Pids killed.
    pub killed: Vec<i32>,
    /// Mount points unmounted.
    pub unmounted: Vec<PathBuf>,
    /// Network namespaces deleted.
    pub netns: Vec<String>,
    /// Network interfaces deleted (veths and the bridge).
    pub links: Vec<String>,
}

impl CleanupReport {
    /// Whether nothing had to be removed.
    pub fn is_empty(&self) -> bool {
        self.killed.is_empty()
            && self.unmounted.is_empty()
            && self.netns.is_empty()
            && self.links.is_empty()
    }
}

/// Removes processes, mounts, namespaces, veths and the bridge left by an environment whose
/// state lives in `state_dir` and whose bridge is `bridge`. Blocking (up to a few seconds while
/// killed processes die).
pub fn cleanup_leftovers(state_dir: &Path, bridge: &str) -> Result<CleanupReport> {
    let mut report = CleanupReport::default();
    let prefix = format!("{bridge}-");
    let namespaces = list_netns(&prefix);

    // 1. Processes: recorded containers, then anything else inside our namespaces.
    let mut victims: Vec<PidRecord> = Vec::new();
    if state_dir.exists() {
        for path in find_files(state_dir, pidfile::PID_FILE) {
            if let Some(rec) = pidfile::read(&path).filter(PidRecord::is_alive) {
                victims.push(rec);
            }
        }
    }
    for ns in &namespaces {
        victims.extend(netns_processes(ns));
    }
    victims.sort_by_key(|r| r.pid);
    victims.dedup();
    let own = std::process::id() as i32;
    for rec in victims.iter().filter(|r| r.pid != own && r.pid > 1) {
        if kill(Pid::from_raw(rec.pid), Signal::SIGKILL).is_ok() {
            report.killed.push(rec.pid);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while victims.iter().any(PidRecord::is_alive_not_zombie) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }

    // 2. Mounts under the state dir, deepest first.
    if let Ok(canonical) = state_dir.canonicalize() {
        let mut points: Vec<PathBuf> = mount_points()
            .into_iter()
            .filter(|p| p.starts_with(&canonical))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let ok =
                umount2(&p, MntFlags::empty()).is_ok() || umount2(&p, MntFlags::MNT_DETACH).is_ok();
            if ok {
                report.unmounted.push(p);
            } else {
                tracing::warn!(path = %p.display(), "cannot unmount leftover");
            }
        }
    }

    // 3. Network namespaces (deleting one deletes the veth peer inside it).
    for ns in namespaces {
        if ip_quiet(&["netns", "del", &ns]) {
            report.netns.push(ns);
        }
    }

    // 4. Veths (ours by alias or by master) and the bridge.
    for link in our_links(bridge) {
        if link_exists(&link) && ip_quiet(&["link", "del", "dev", &link]) {
            report.links.push(link);
        }
    }
    if link_exists(bridge) && ip_quiet(&["link", "del", "dev", bridge]) {
        report.links.push(bridge.to_string());
    }
    remove_iptables_rule(bridge);
    if !report.is_empty() {
        tracing::info!(?report, "removed leftovers");
    }
    Ok(report)
}

impl PidRecord {
    /// Alive and not merely a zombie waiting to be reaped.
    fn is_alive_not_zombie(&self) -> bool {
        if !self.is_alive() {
            return false;
        }
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .unwrap_or("");
        state != "Z" && state != "X"
    }
}

/// Names of network namespaces starting with `prefix`.
pub fn list_netns(prefix: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// Processes inside network namespace `netns` (by `ip netns pids`).
pub fn netns_processes(netns: &str) -> Vec<PidRecord> {
    let Ok(out) = ip(&["netns", "pids", netns]) else {
        return Vec::new();
    };
    out.split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter_map(|pid| pidfile::start_time(pid).map(|start_time| PidRecord { pid, start_time }))
        .collect()
}

/// SIGKILLs every process inside network namespace `netns` (e.g. children a container left
/// behind when a pod is deleted); returns the pids signalled.
pub fn kill_netns_processes(netns: &str) -> Vec<i32> {
    let own = std::process::id() as i32;
    netns_processes(netns)
        .into_iter()
        .filter(|r| r.pid != own && r.pid > 1)
        .filter(|r| kill(Pid::from_raw(r.pid), Signal::SIGKILL).is_ok())
        .map(|r| r.pid)
        .collect()
}

/// Host interfaces created for `bridge`: veths with our alias or attached to the bridge.
fn our_links(bridge: &str) -> Vec<String> {
    let alias = veth_alias(bridge);
    let Ok(out) = ip(&["-o", "link", "show"]) else {
        return Vec::new();
    };
    let mut links = Vec::new();
    for line in out.lines() {
        // "7: lk0123@if2: <...> mtu 1500 master BR ... \    alias localkube:BR"
        let Some(name) = line.split(':').nth(1).map(str::trim) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        let words: Vec<&str> = line.split_whitespace().collect();
        let has = |key: &str, value: &str| words.windows(2).any(|w| w[0] == key && w[1] == value);
        if name != bridge && (has("alias", &alias) || has("master", bridge)) {
            links.push(name.to_string());
        }
    }
    links
}

/// Mount points of the host mount namespace (from `/proc/self/mountinfo`).
pub fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .collect()
}

/// Undoes the octal escapes (`\040` for a space, ...) of mountinfo.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// All files named `name` below `dir` (not following symlinks, not crossing into `root/`
/// overlay mount points, which are empty on the host anyway).
fn find_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() && e.file_name() == name {
                found.push(e.path());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/x\\"), "/x\\");
    }

    #[test]
    fn finds_pid_files() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b").join(pidfile::PID_FILE), "1 2").unwrap();
        assert_eq!(find_files(d.path(), pidfile::PID_FILE).len(), 1);
    }
}
