//! The process of a test object store (SeaweedFS, fake-gcs-server, Azurite): spawned in its
//! own process group with its output in a log file, waited for until a probe succeeds, killed
//! with its whole group on drop. Shared by [`S3Server`](crate::S3Server),
//! [`GcsServer`](crate::GcsServer) and [`AzureServer`](crate::AzureServer).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// A running store process.
pub(crate) struct StoreProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl StoreProcess {
    /// Spawns `cmd` in its own process group, stdin closed, stdout and stderr to `log`.
    pub(crate) fn spawn(cmd: &mut Command, log: PathBuf) -> Result<Self, String> {
        let file = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_err(|e| e.to_string())?)
            .stderr(file)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("spawn {:?}: {e}", cmd.get_program()))?;
        Ok(Self {
            child: Some(child),
            log,
        })
    }

    /// Polls `probe` every 100 ms until it succeeds. When the process exits, or `timeout`
    /// after `t0` (the process is then killed), the error holds the last probe's error and
    /// the log's last lines.
    pub(crate) fn wait_ready(
        &mut self,
        t0: Instant,
        timeout: Duration,
        mut probe: impl FnMut() -> Result<(), String>,
    ) -> Result<(), String> {
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("exited with {status}:\n{}", self.log_tail()));
            }
            let last = match probe() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if t0.elapsed() > timeout {
                self.kill();
                return Err(format!(
                    "not ready after {timeout:?} (last probe: {last}):\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log (stdout and stderr).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Kills the process group and reaps the process.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Spawned with process_group(0): the group id is its pid.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for StoreProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Calls `try_start` up to three times (a port taken in between, a slow start); panics with
/// `what` and the last error when none succeeds.
pub(crate) fn start_with_retries<T>(
    what: &str,
    mut try_start: impl FnMut() -> Result<T, String>,
) -> T {
    let mut last = String::new();
    for _ in 0..3 {
        match try_start() {
            Ok(s) => return s,
            Err(e) => last = e,
        }
    }
    panic!("{what} did not start:\n{last}");
}

/// `found`, or a panic naming the binary, its override variable and its install step.
pub(crate) fn require(found: Option<PathBuf>, name: &str, env: &str, step: &str) -> PathBuf {
    found.unwrap_or_else(|| {
        panic!(
            "no `{name}` ({env}, {}, PATH): install it with `bash hack/install-deps.sh {step}`",
            crate::bins::bin_dir().display()
        )
    })
}
