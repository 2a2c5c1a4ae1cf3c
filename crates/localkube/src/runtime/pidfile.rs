//! Pid files of container processes, tied to the process start time so a recycled pid is never
//! mistaken for one of ours.

use std::path::Path;

/// File name of a container's pid file inside its state dir.
pub const PID_FILE: &str = "container.pid";

/// A recorded container process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidRecord {
    /// Process id.
    pub pid: i32,
    /// Start time (clock ticks after boot, field 22 of `/proc/PID/stat`).
    pub start_time: u64,
}

impl PidRecord {
    /// Whether the process recorded here is still alive (same pid *and* start time).
    pub fn is_alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }
}

/// The start time of `pid`, if it exists.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain anything: skip past it.
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ')' come field 3 (state) ... field 22 (starttime) => index 19.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Writes `dir/container.pid` atomically.
pub fn write(dir: &Path, record: PidRecord) -> std::io::Result<()> {
    let tmp = dir.join(format!("{PID_FILE}.tmp"));
    std::fs::write(&tmp, format!("{} {}\n", record.pid, record.start_time))?;
    std::fs::rename(tmp, dir.join(PID_FILE))
}

/// Reads a pid file written by [`write`].
pub fn read(path: &Path) -> Option<PidRecord> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut it = text.split_whitespace();
    let pid = it.next()?.parse().ok()?;
    let start_time = it.next()?.parse().ok()?;
    (pid > 1).then_some(PidRecord { pid, start_time })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_round_trip() {
        let pid = std::process::id() as i32;
        let st = start_time(pid).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            PidRecord {
                pid,
                start_time: st,
            },
        )
        .unwrap();
        let rec = read(&dir.path().join(PID_FILE)).unwrap();
        assert!(rec.is_alive());
        assert!(
            !PidRecord {
                pid,
                start_time: st + 1
            }
            .is_alive()
        );
    }
}
