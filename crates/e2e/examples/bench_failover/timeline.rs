//! Where a primary change's write gap goes, from the Valkey servers' own logs.
//!
//! A coordinated `CLUSTER FAILOVER` logs, with millisecond timestamps: the replica accepting
//! the request, the primary pausing its writers ("Manual failover requested by replica"), the
//! replica winning the election, and the old primary reconfiguring itself as a replica (which
//! unpauses its clients and answers them `MOVED`). Matched with the writer's stalls, each
//! primary change splits into:
//!
//! - *handshake*: pause → election won (the replica catching up with the paused primary's
//!   offset, then collecting the votes of a majority of primaries);
//! - *announce*: election won → old primary demoted (the winner's `PONG` reaching it);
//! - *client*: old primary demoted → the last stalled writer's next success (the `MOVED`, the
//!   client's slot-map refresh and its retry on the new primary).
//!
//! localkube writes each container's log under its state directory; [`LogTail`] copies them
//! as they grow, so a pod deleted during a phase keeps its log.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

/// One log line of a Valkey server: its time (Unix seconds) and message.
#[derive(Clone, Debug)]
pub struct Line {
    /// The file it came from (one per container run).
    pub file: usize,
    /// Unix time in seconds.
    pub at: f64,
    /// The message after the level marker.
    pub msg: String,
}

/// Parses `1234:M 05 Dec 2026 19:51:26.347 * message`; the timestamp is in the server's
/// (this machine's) local time zone.
pub fn parse_line(line: &str) -> Option<(f64, &str)> {
    let (_pid_role, rest) = line.split_once(' ')?;
    // "05 Dec 2026 19:51:26.347" is 24 bytes, then " <level> ".
    let stamp = rest.get(..24)?;
    let msg = rest.get(27..)?;
    let civil = jiff::civil::DateTime::strptime("%d %b %Y %H:%M:%S%.f", stamp).ok()?;
    let at = civil
        .to_zoned(jiff::tz::TimeZone::system())
        .ok()?
        .timestamp();
    Some((at.as_millisecond() as f64 / 1000.0, msg))
}

/// Copies the server containers' logs of a localkube directory every 100 ms.
pub struct LogTail {
    lines: Arc<Mutex<Vec<Line>>>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LogTail {
    /// Starts tailing `dir/kubelet/pods/*/logs/server/*.log`.
    pub fn start(dir: &Path) -> Self {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (stop, rx) = watch::channel(false);
        let pods = dir.join("kubelet").join("pods");
        let out = lines.clone();
        let thread = std::thread::spawn(move || {
            // Per file: its index and how many bytes were consumed (whole lines only).
            let mut seen: HashMap<PathBuf, (usize, usize)> = HashMap::new();
            while !*rx.borrow() {
                for path in server_logs(&pods) {
                    let Ok(text) = std::fs::read_to_string(&path) else {
                        continue;
                    };
                    let next = seen.len();
                    let (file, done) = seen.entry(path).or_insert((next, 0));
                    let Some(end) = text.rfind('\n').map(|i| i + 1).filter(|e| e > done) else {
                        continue;
                    };
                    let new: Vec<Line> = text[*done..end]
                        .lines()
                        .filter_map(parse_line)
                        .map(|(at, msg)| Line {
                            file: *file,
                            at,
                            msg: msg.to_owned(),
                        })
                        .collect();
                    *done = end;
                    out.lock().expect("log lines").extend(new);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self {
            lines,
            stop,
            thread: Some(thread),
        }
    }

    /// The lines logged from `from` (Unix seconds) on, in time order.
    pub fn since(&self, from: f64) -> Vec<Line> {
        let mut out: Vec<Line> = self
            .lines
            .lock()
            .expect("log lines")
            .iter()
            .filter(|l| l.at >= from)
            .cloned()
            .collect();
        out.sort_by(|a, b| a.at.total_cmp(&b.at));
        out
    }
}

impl Drop for LogTail {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The server containers' log files under a kubelet's pods directory.
fn server_logs(pods: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(pods) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|pod| std::fs::read_dir(pod.path().join("logs").join("server")).ok())
        .flat_map(|runs| runs.flatten().map(|r| r.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect()
}

/// One coordinated failover as the servers logged it; times in Unix seconds.
#[derive(Clone, Debug)]
pub struct Election {
    /// `operator` or `hand` (the request's client library).
    pub by: &'static str,
    /// The replica accepted `CLUSTER FAILOVER`.
    pub requested: f64,
    /// The primary paused its writers.
    pub paused: Option<f64>,
    /// The replica won the election.
    pub won: Option<f64>,
    /// The old primary reconfigured itself as a replica.
    pub demoted: Option<f64>,
}

impl Election {
    /// Pause → election won, in ms.
    pub fn handshake_ms(&self) -> Option<f64> {
        Some((self.won? - self.paused?) * 1000.0)
    }

    /// Election won → old primary demoted, in ms.
    pub fn announce_ms(&self) -> Option<f64> {
        Some((self.demoted? - self.won?) * 1000.0)
    }
}

/// The coordinated failovers in `lines` (time-ordered).
pub fn failovers(lines: &[Line]) -> Vec<Election> {
    let within = |from: f64, secs: f64, pred: &dyn Fn(&Line) -> bool| {
        lines
            .iter()
            .find(|l| l.at >= from && l.at <= from + secs && pred(l))
            .map(|l| l.at)
    };
    lines
        .iter()
        .filter(|l| l.msg.starts_with("Manual failover user request accepted"))
        .map(|req| Election {
            by: if req.msg.contains("lib-name=valkey-operator") {
                "operator"
            } else {
                "hand"
            },
            requested: req.at,
            paused: within(req.at, 0.5, &|l| {
                l.msg.starts_with("Manual failover requested by replica")
            }),
            won: within(req.at, 1.0, &|l| {
                l.file == req.file && l.msg.starts_with("Failover election won")
            }),
            demoted: within(req.at, 1.0, &|l| {
                l.file != req.file && l.msg.starts_with("Configuration change detected")
            }),
        })
        .collect()
}

/// Maps the writer's `Instant`s to Unix seconds through one pair taken at the same moment.
#[derive(Clone, Copy)]
pub struct Clock {
    /// The pair.
    pub at: (Instant, SystemTime),
}

impl Clock {
    /// Now.
    pub fn now() -> Self {
        Self {
            at: (Instant::now(), SystemTime::now()),
        }
    }

    /// Unix seconds of `t`.
    pub fn unix(&self, t: Instant) -> f64 {
        let base = self
            .at
            .1
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        if t >= self.at.0 {
            base + t.duration_since(self.at.0).as_secs_f64()
        } else {
            base - self.at.0.duration_since(t).as_secs_f64()
        }
    }
}

/// A primary change with the writer's view of it.
#[derive(Clone, Debug)]
pub struct Change {
    /// What the servers logged.
    pub failover: Election,
    /// The longest probe stall that started around the change (see [`changes`]), in ms
    /// (`None`: no stall of at least the writer's episode length).
    pub stall_ms: Option<f64>,
    /// Old primary demoted → the end of the last such stall, in ms.
    pub client_ms: Option<f64>,
}

/// Matches failovers with the writer's probe stalls (start, length in Unix seconds): a stall
/// belongs to a failover if it started between 50 ms before its request and 100 ms after its
/// demotion (a write sent to the old primary by a client that has not refreshed yet).
pub fn changes(failovers: &[Election], stalls: &[(f64, f64)]) -> Vec<Change> {
    failovers
        .iter()
        .map(|f| {
            let until = f.demoted.unwrap_or(f.requested + 0.2) + 0.1;
            let mine: Vec<&(f64, f64)> = stalls
                .iter()
                .filter(|(s, _)| *s >= f.requested - 0.05 && *s <= until)
                .collect();
            let stall_ms = mine.iter().map(|(_, l)| l * 1000.0).reduce(f64::max);
            let end = mine.iter().map(|(s, l)| s + l).reduce(f64::max);
            Change {
                failover: f.clone(),
                stall_ms,
                client_ms: f.demoted.zip(end).map(|(d, e)| (e - d) * 1000.0),
            }
        })
        .collect()
}

/// The median of `v` (`None` when empty).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// `12ms` or `?`.
pub fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "?".into(), |v| format!("{v:.0}ms"))
}
