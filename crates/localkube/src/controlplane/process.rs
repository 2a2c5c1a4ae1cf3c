//! A supervised control-plane process: spawned with its output in a log file,
//! stopped with SIGTERM (then SIGKILL), killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A running control-plane component.
#[derive(Debug)]
pub struct Component {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Component {
    /// Starts `bin args…` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, bin: &Path, args: &[String], log: &Path) -> std::io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()?;
        tracing::debug!(component = name, pid = child.id(), "started");
        if let (Some(pid), Some(dir)) = (child.id(), log.parent()) {
            // Recorded so that `localkube down` can find processes a crashed run left.
            let _ = std::fs::write(dir.join(format!("{name}.pid")), pid.to_string());
        }
        Ok(Component {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
        })
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Returns an error naming the component and the tail of its log if it exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited ({status}); last log lines:\n{}",
                self.name,
                log_tail(&self.log, 20)
            )),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if tokio::time::timeout(grace, self.child.wait())
                .await
                .is_err()
            {
                let _ = self.child.kill().await;
            }
        }
    }
}

/// The last `n` lines of a log file (empty if unreadable).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A free TCP port on loopback (bound and released; a tiny race is accepted).
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// Kills processes recorded by [`Component::spawn`] in `log_dir` whose command
/// line still mentions `marker` (so a recycled pid is never killed).
pub fn kill_recorded(log_dir: &Path, marker: &str) -> Vec<u32> {
    let mut killed = Vec::new();
    let Ok(entries) = std::fs::read_dir(log_dir) else {
        return killed;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("pid") {
            continue;
        }
        let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed.push(pid);
        }
        let _ = std::fs::remove_file(&path);
    }
    killed
}
