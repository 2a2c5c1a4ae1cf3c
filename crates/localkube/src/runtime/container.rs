//! Containers as host processes in their pod's network namespace and their own mount namespace.
//!
//! [`spawn`] runs, with util-linux tools and no unsafe code:
//!
//! ```text
//! nsenter --net=NETNS -- unshare --mount --uts --propagation private -- /bin/sh STATE/start.sh
//!   start.sh (host view):  mount overlay lowerdir=/,upperdir=STATE/upper,workdir=STATE/work on STATE/root
//!                          rbind /dev /proc /sys; bind every volume source to ROOT/.localkube-mnt/N
//!                          exec chroot STATE/root /bin/sh -c INNER
//!   INNER (container view): mkdir -p each mount target (in the overlay's upper layer, symlinks
//!                          resolved inside the container), mount --move the staged bind mount
//!                          onto it, remount read-only where asked, mkdir -p the working dir,
//!                          exec [setpriv --reuid --regid --groups --] env -i [-C WORKDIR] ENV... ARGV...
//! ```
//!
//! With [`ContainerSpec::user`] (`securityContext`), the program and every
//! [`RunningContainer::exec_in`]/[`RunningContainer::exec_spawn`] command run under `setpriv`
//! with that uid, gid and supplementary groups (a non-zero uid has no capabilities).
//!
//! Every step `exec`s, so the spawned pid *is* the container's main process: signals reach it
//! directly and its exit status is the program's. If the setup fails, the process exits with
//! [`SETUP_FAILED_EXIT_CODE`] and a `localkube: container setup failed: ...` line in the log; a
//! missing executable gives 127 (from `env`). Nothing is mounted in the host's mount namespace
//! and nothing is written to the host file system outside the state dir and the volume sources.
//! The mount namespace (and so the overlay) disappears with the last process in it.
//!
//! The overlay only shows the host's root file system: `PATH` directories on other mounts, and
//! the directories of the symlink targets in the image bin dir that are on other mounts, are
//! bind-mounted read-only at their own path (so a state dir or binary cache on another volume
//! works).
//!
//! The state dir holds `upper/`, `work/`, `root/`, `start.sh` and `container.pid` (pid + start
//! time, for [`super::cleanup::cleanup_leftovers`]). [`spawn`] resets `upper/` and `work/`, so a
//! restarted container starts from a clean file system, as with a real runtime.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tokio::sync::watch;

use super::cleanup;
use super::command::shell_quote;
use super::error::{Result, RuntimeError};
use super::images::BASE_PATH;
use super::pidfile::{self, PidRecord};

/// Exit code of a container whose namespace/mount setup failed (before the program started).
pub const SETUP_FAILED_EXIT_CODE: i32 = 121;

/// Staging directory (inside the container root) for volume bind mounts.
const STAGING: &str = "/.localkube-mnt";

/// util-linux `setpriv` (as seen inside the container, whose root is an overlay of `/`).
const SETPRIV: &str = "/usr/bin/setpriv";

/// Output kept from an [`RunningContainer::exec_in`] command.
const MAX_EXEC_OUTPUT: usize = 1 << 20;

/// A bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Host path (file or directory; symlinks are followed).
    pub source: PathBuf,
    /// Absolute path inside the container; created in the container's own layer if missing.
    pub target: PathBuf,
    /// Mount read-only.
    pub read_only: bool,
}

/// Everything needed to start one container process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// Identifier, for logs.
    pub id: String,
    /// Final argv (command/args already combined and expanded); `argv[0]` is an absolute path
    /// or a name looked up in the container's `PATH`.
    pub argv: Vec<String>,
    /// The complete environment (nothing is inherited). If it has no `PATH`,
    /// [`BASE_PATH`] is used.
    pub env: Vec<(String, String)>,
    /// Working directory inside the container (created if missing); default `/`.
    pub working_dir: Option<PathBuf>,
    /// Volume mounts, applied parents first (by depth of the target).
    pub mounts: Vec<Mount>,
    /// The pod's network namespace (`Sandbox::netns_path`); `None` = host network.
    pub netns_path: Option<PathBuf>,
    /// Hostname inside the container (own UTS namespace); `None` keeps the host's.
    pub hostname: Option<String>,
    /// Per-container state directory (overlay layers, pid file). Must not contain `,` or `:`.
    pub state_dir: PathBuf,
    /// File receiving stdout and stderr (appended).
    pub log_path: PathBuf,
    /// The identity of the process (and of [`RunningContainer::exec_in`] commands); `None`
    /// keeps root with the kubelet's groups.
    pub user: Option<ProcessUser>,
    /// `readOnlyRootFilesystem`: the container's root (its overlay) is remounted read-only
    /// once the mount points and the working directory exist; volumes keep their own mode.
    pub read_only_root: bool,
}

/// User, group and supplementary groups of a container's processes (`securityContext`),
/// applied with util-linux `setpriv` right before the program is executed. A non-zero uid
/// loses every capability, as in a container runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUser {
    /// Real and effective user id.
    pub uid: u32,
    /// Real and effective group id.
    pub gid: u32,
    /// Supplementary groups (empty: none).
    pub groups: Vec<u32>,
}

impl ProcessUser {
    /// `setpriv --reuid=U --regid=G --groups=...|--clear-groups --`.
    fn setpriv_argv(&self) -> Vec<String> {
        let groups = if self.groups.is_empty() {
            "--clear-groups".to_string()
        } else {
            let list: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            format!("--groups={}", list.join(","))
        };
        vec![
            SETPRIV.to_string(),
            format!("--reuid={}", self.uid),
            format!("--regid={}", self.gid),
            groups,
            "--".to_string(),
        ]
    }
}

/// How a container process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    /// Exit code, if it exited normally.
    pub code: Option<i32>,
    /// Signal number, if a signal killed it.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// The exit code Kubernetes reports: the code, or 128 + signal number.
    pub fn exit_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => -1,
        }
    }

    /// The terminating signal, if any.
    pub fn signal(&self) -> Option<Signal> {
        self.signal.and_then(|s| Signal::try_from(s).ok())
    }

    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    fn from_std(status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Self {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

impl std::fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal()) {
            (Some(c), _) => write!(f, "exit code {c}"),
            (None, Some(s)) => write!(f, "killed by {s}"),
            _ => write!(f, "unknown exit status"),
        }
    }
}

/// Result of [`RunningContainer::exec_in`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecResult {
    /// Exit code (128 + signal if killed).
    pub exit_code: i32,
    /// stdout and stderr interleaved (first MiB).
    pub output: String,
}

/// A started container. Cheap to clone; all clones observe the same process.
#[derive(Debug, Clone)]
pub struct RunningContainer {
    id: String,
    pid: i32,
    state_dir: PathBuf,
    user: Option<ProcessUser>,
    exit: watch::Receiver<Option<ExitStatus>>,
    /// Becomes `true` once the container's namespaces and mounts are set up (or it died).
    setup: watch::Receiver<bool>,
}

/// Starts a container (see the module docs). Returns once the process is forked; setup errors
/// show up as exit code [`SETUP_FAILED_EXIT_CODE`]. Blocking for a few milliseconds.
pub fn spawn(spec: &ContainerSpec) -> Result<RunningContainer> {
    validate(spec)?;
    let state = &spec.state_dir;
    let root = state.join("root");
    for dir in ["upper", "work", "root"] {
        let d = state.join(dir);
        if d.exists() {
            std::fs::remove_dir_all(&d).map_err(|e| RuntimeError::io("remove", &d, e))?;
        }
        std::fs::create_dir_all(&d).map_err(|e| RuntimeError::io("create directory", &d, e))?;
    }
    let _ = std::fs::remove_file(state.join(pidfile::PID_FILE));
    let script = start_script(&with_hidden_binary_dirs(spec), &root)?;
    let script_path = state.join("start.sh");
    std::fs::write(&script_path, script).map_err(|e| RuntimeError::io("write", &script_path, e))?;

    if let Some(parent) = spec.log_path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| RuntimeError::io("create directory", parent, e))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log_path)
        .map_err(|e| RuntimeError::io("open", &spec.log_path, e))?;
    let log2 = log
        .try_clone()
        .map_err(|e| RuntimeError::io("dup", &spec.log_path, e))?;

    // The container's stdin is the write end of a pipe until its setup is done: the inner
    // script replaces it with /dev/null right before exec'ing the program, so EOF on the read
    // end says "set up" (or "dead"). Exec'ing into the container earlier would see a half-made
    // root (the host's, before the overlay is mounted).
    let (setup_reader, setup_writer) =
        std::io::pipe().map_err(|e| RuntimeError::io("create pipe for", state, e))?;
    let mut cmd = Command::new(super::command::nsenter());
    if let Some(ns) = &spec.netns_path {
        let mut arg = std::ffi::OsString::from("--net=");
        arg.push(ns);
        cmd.arg(arg);
    }
    cmd.args(["--", "unshare", "--mount", "--propagation", "private"]);
    if spec.hostname.is_some() {
        cmd.arg("--uts");
    }
    cmd.args(["--", "/bin/sh"])
        .arg(&script_path)
        .env_clear()
        .env("PATH", BASE_PATH)
        .current_dir("/")
        .stdin(setup_writer)
        .stdout(log)
        .stderr(log2)
        // Own process group: a terminal's Ctrl-C must not hit the pods.
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
        program: "nsenter".into(),
        source,
    })?;
    // Our copy of the write end goes with the command.
    drop(cmd);
    let pid = child.id() as i32;
    if let Some(start_time) = pidfile::start_time(pid)
        && let Err(e) = pidfile::write(state, PidRecord { pid, start_time })
    {
        tracing::warn!(error = %e, pid, "cannot write container pid file");
    }
    let (tx, rx) = watch::channel(None);
    let (setup_tx, setup_rx) = watch::channel(false);
    let id = spec.id.clone();
    let waiter = std::thread::Builder::new()
        .name(format!("wait-{pid}"))
        .stack_size(64 * 1024)
        .spawn(move || {
            let mut reader = setup_reader;
            let mut buf = [0u8; 64];
            while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
            let _ = setup_tx.send(true);
            let status = match child.wait() {
                Ok(s) => ExitStatus::from_std(s),
                Err(e) => {
                    tracing::warn!(error = %e, pid, "waiting for container failed");
                    ExitStatus {
                        code: None,
                        signal: None,
                    }
                }
            };
            tracing::debug!(container = %id, pid, %status, "container exited");
            let _ = tx.send(Some(status));
        });
    if let Err(e) = waiter {
        let _ = signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        return Err(RuntimeError::io("start waiter thread for", state, e));
    }
    tracing::debug!(container = %spec.id, pid, argv = ?spec.argv, "container started");
    Ok(RunningContainer {
        id: spec.id.clone(),
        pid,
        state_dir: state.clone(),
        user: spec.user.clone(),
        exit: rx,
        setup: setup_rx,
    })
}

impl RunningContainer {
    /// The container's main process id (in the host pid namespace).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The container id given in the spec.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The state dir given in the spec.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The exit status, if the process has exited.
    pub fn try_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Waits for the process to exit.
    pub async fn wait(&self) -> ExitStatus {
        let mut rx = self.exit.clone();
        match rx.wait_for(|s| s.is_some()).await {
            Ok(s) => s.unwrap_or(ExitStatus {
                code: None,
                signal: None,
            }),
            Err(_) => ExitStatus {
                code: None,
                signal: None,
            },
        }
    }

    /// Waits (up to `timeout`) until the container's mount namespace and root are set up and
    /// its program is being exec'd; `false` on timeout. [`Self::exec_in`] does this itself;
    /// call it before [`Self::exec_spawn`].
    pub async fn wait_setup(&self, timeout: Duration) -> bool {
        let mut rx = self.setup.clone();
        // A closed channel (the waiter thread is gone) means the process is gone too.
        tokio::time::timeout(timeout, rx.wait_for(|done| *done))
            .await
            .is_ok()
    }

    /// Sends `sig` (SIGTERM, SIGKILL, SIGSTOP, SIGCONT, ...) to the main process.
    pub fn signal(&self, sig: Signal) -> Result<()> {
        if self.try_status().is_some() {
            return Err(RuntimeError::Exited(self.pid));
        }
        signal::kill(Pid::from_raw(self.pid), sig).map_err(|source| RuntimeError::Signal {
            pid: self.pid,
            source,
        })
    }

    /// Runs `argv` inside the container (its network and mount namespaces, root and working
    /// directory) with exactly `env` (plus [`BASE_PATH`] if it has no `PATH`), as exec probes
    /// and lifecycle hooks do. Fails with [`RuntimeError::ExecTimeout`] (after killing the
    /// command) if it runs longer than `timeout`.
    pub async fn exec_in(
        &self,
        argv: &[String],
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<ExecResult> {
        if !self.wait_setup(timeout).await {
            return Err(RuntimeError::ExecTimeout(timeout));
        }
        let mut cmd = self.exec_command(argv, env)?;
        let (reader, writer) =
            std::io::pipe().map_err(|e| RuntimeError::io("create pipe for", &self.state_dir, e))?;
        let writer2 = writer
            .try_clone()
            .map_err(|e| RuntimeError::io("dup pipe for", &self.state_dir, e))?;
        cmd.stdin(Stdio::null()).stdout(writer).stderr(writer2);
        let mut child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
            program: "nsenter".into(),
            source,
        })?;
        // The Command holds the write ends; drop them so EOF arrives when the command exits.
        drop(cmd);
        let output = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&output);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("exec-output".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                drain(reader, &sink);
                let _ = done_tx.send(());
            })
            .map_err(|e| RuntimeError::io("start reader thread for", &self.state_dir, e))?;
        let status = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) => ExitStatus::from_std(status),
            Ok(Err(e)) => {
                return Err(RuntimeError::io("wait for exec in", &self.state_dir, e));
            }
            Err(_) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(RuntimeError::ExecTimeout(timeout));
            }
        };
        // Background children of the command may hold the pipe open: don't wait for them long.
        let _ = tokio::time::timeout(Duration::from_millis(500), done_rx).await;
        let bytes = output.lock().map(|b| b.clone()).unwrap_or_default();
        Ok(ExecResult {
            exit_code: status.exit_code(),
            output: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}

impl RunningContainer {
    /// Starts `argv` inside the container like [`Self::exec_in`], for `kubectl exec`: stdout
    /// and stderr are pipes (`child.stdout`, `child.stderr`), stdin a pipe if `stdin` (else
    /// `/dev/null`). The command runs until it exits or the child is dropped (which kills it).
    pub fn exec_spawn(
        &self,
        argv: &[String],
        env: &[(String, String)],
        stdin: bool,
    ) -> Result<tokio::process::Child> {
        let mut cmd = self.exec_command(argv, env)?;
        cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().map_err(|source| RuntimeError::Spawn {
            program: "nsenter".into(),
            source,
        })
    }

    /// `nsenter` into the container's namespaces, root and working directory, running `argv`
    /// with exactly `env`; killed when dropped. Stdio is left to the caller.
    fn exec_command(
        &self,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<tokio::process::Command> {
        if argv.is_empty() {
            return Err(RuntimeError::invalid("exec argv", "empty"));
        }
        validate_env(env)?;
        validate_argv0(&argv[0])?;
        if self.try_status().is_some() {
            return Err(RuntimeError::Exited(self.pid));
        }
        if !*self.setup.borrow() {
            return Err(RuntimeError::invalid(
                "exec target",
                format!("container {} is still being set up", self.id),
            ));
        }
        let mut cmd = tokio::process::Command::new(super::command::nsenter());
        cmd.arg(format!("--target={}", self.pid))
            .args(["--net", "--mount", "--uts", "--root", "--wd", "--"])
            .args(env_argv(env, None, argv, self.user.as_ref()))
            .env_clear()
            .env("PATH", BASE_PATH)
            .kill_on_drop(true);
        Ok(cmd)
    }
}

fn drain(mut reader: std::io::PipeReader, sink: &Mutex<Vec<u8>>) {
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Ok(mut out) = sink.lock() {
                    let room = MAX_EXEC_OUTPUT.saturating_sub(out.len());
                    out.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
    }
}

/// `[setpriv ... --] /usr/bin/env -i [-C dir] K=V... argv...`, with a default `PATH` if `env`
/// has none.
fn env_argv(
    env: &[(String, String)],
    wd: Option<&Path>,
    argv: &[String],
    user: Option<&ProcessUser>,
) -> Vec<String> {
    let mut out = user.map(ProcessUser::setpriv_argv).unwrap_or_default();
    out.extend(["/usr/bin/env".to_string(), "-i".to_string()]);
    if let Some(wd) = wd {
        out.push(format!("--chdir={}", wd.display()));
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        out.push(format!("PATH={BASE_PATH}"));
    }
    out.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    out.extend(argv.iter().cloned());
    out
}

/// The container root is an overlay of the host's root *file system* only: directories on other
/// mounts (a state dir on a separate volume, a binary cache on a tmpfs, ...) would be empty
/// inside. So every `PATH` directory outside the root mount, and the directories of the symlink
/// targets in non-system `PATH` directories (the image bin dirs) that are outside it, are
/// bind-mounted read-only at their own path. So are those under one of the container's own
/// volumes (an emptyDir at `/tmp` would hide the image bin dirs of a state dir in `/tmp`):
/// their bind mount comes after the volume's, inside it.
fn with_hidden_binary_dirs(spec: &ContainerSpec) -> ContainerSpec {
    let mounts = cleanup::mount_points();
    let hidden = |p: &Path| {
        let Ok(p) = p.canonicalize() else {
            return None;
        };
        let on_root = mounts
            .iter()
            .filter(|m| p.starts_with(m))
            .max_by_key(|m| m.components().count())
            .is_none_or(|m| m == Path::new("/"));
        let under_volume = spec.mounts.iter().any(|m| p.starts_with(&m.target));
        (!on_root || under_volume).then_some(p)
    };
    let path_env = spec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(BASE_PATH, |(_, v)| v.as_str());
    let system: Vec<&str> = BASE_PATH.split(':').collect();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for dir in path_env.split(':').filter(|d| d.starts_with('/')) {
        let dir = Path::new(dir);
        dirs.extend(hidden(dir));
        if system.contains(&dir.to_string_lossy().as_ref()) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()).take(256) {
            for d in symlink_chain_dirs(&e.path()) {
                dirs.extend(hidden(&d));
            }
        }
    }
    dirs.sort();
    dirs.dedup();
    // Keep only outermost directories.
    let outermost: Vec<PathBuf> = dirs
        .iter()
        .filter(|d| !dirs.iter().any(|o| o != *d && d.starts_with(o)))
        .cloned()
        .collect();
    if outermost.is_empty() {
        return spec.clone();
    }
    tracing::debug!(container = %spec.id, dirs = ?outermost, "binding binary dirs from other mounts");
    let mut spec = spec.clone();
    let mut mounts: Vec<Mount> = outermost
        .into_iter()
        .map(|d| Mount {
            source: d.clone(),
            target: d,
            read_only: true,
        })
        .collect();
    mounts.append(&mut spec.mounts);
    spec.mounts = mounts;
    spec
}

/// The directories holding each hop of the symlink chain starting at `path` (not including
/// `path`'s own directory), up to 16 hops.
fn symlink_chain_dirs(path: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut current = path.to_path_buf();
    for _ in 0..16 {
        let Ok(target) = std::fs::read_link(&current) else {
            break;
        };
        let base = current.parent().unwrap_or(Path::new("/"));
        current = base.join(target);
        if let Some(parent) = current.parent() {
            dirs.push(parent.to_path_buf());
        }
    }
    dirs
}

fn validate(spec: &ContainerSpec) -> Result<()> {
    let Some(argv0) = spec.argv.first() else {
        return Err(RuntimeError::invalid("argv", "empty"));
    };
    validate_argv0(argv0)?;
    validate_env(&spec.env)?;
    let state = spec.state_dir.to_string_lossy();
    if !spec.state_dir.is_absolute() || state.contains([',', ':', '\\']) {
        return Err(RuntimeError::invalid(
            "state dir",
            format!("{state:?} must be absolute and free of ',', ':' and '\\' (overlay options)"),
        ));
    }
    if let Some(wd) = &spec.working_dir
        && !wd.is_absolute()
    {
        return Err(RuntimeError::invalid(
            "working dir",
            format!("{} is not absolute", wd.display()),
        ));
    }
    if let Some(h) = &spec.hostname
        && (h.is_empty()
            || h.len() > 64
            || !h
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    {
        return Err(RuntimeError::invalid("hostname", format!("{h:?}")));
    }
    for m in &spec.mounts {
        if !m.target.is_absolute() || m.target == Path::new("/") {
            return Err(RuntimeError::invalid(
                "mount target",
                format!("{} (must be absolute and not /)", m.target.display()),
            ));
        }
        if !m.source.exists() {
            return Err(RuntimeError::invalid(
                "mount source",
                format!("{} does not exist", m.source.display()),
            ));
        }
    }
    Ok(())
}

fn validate_argv0(argv0: &str) -> Result<()> {
    // `env` would take a first word with '=' for a variable.
    if argv0.is_empty() || argv0.contains('=') {
        return Err(RuntimeError::invalid(
            "argv[0]",
            format!("{argv0:?} (empty or contains '=')"),
        ));
    }
    Ok(())
}

fn validate_env(env: &[(String, String)]) -> Result<()> {
    if let Some((k, _)) = env.iter().find(|(k, _)| k.is_empty() || k.contains('=')) {
        return Err(RuntimeError::invalid(
            "environment variable name",
            format!("{k:?}"),
        ));
    }
    Ok(())
}

/// The script run by `/bin/sh` in the new mount namespace (see the module docs).
fn start_script(spec: &ContainerSpec, root: &Path) -> Result<String> {
    let q = |p: &Path| shell_quote(&p.to_string_lossy());
    let r = q(root);
    let mut mounts: Vec<&Mount> = spec.mounts.iter().collect();
    mounts.sort_by_key(|m| m.target.components().count());

    let mut outer = String::new();
    outer.push_str(&format!(
        "set -u\nfail() {{ echo \"localkube: container setup failed: $*\" >&2; exit {SETUP_FAILED_EXIT_CODE}; }}\n"
    ));
    if let Some(h) = &spec.hostname {
        outer.push_str(&format!(
            "hostname {} || fail 'cannot set hostname'\n",
            shell_quote(h)
        ));
    }
    outer.push_str(&format!(
        "mount -t overlay overlay -o lowerdir=/,upperdir={},workdir={} {r} || fail 'overlay root'\n",
        q(&spec.state_dir.join("upper")),
        q(&spec.state_dir.join("work")),
    ));
    for fs in ["dev", "proc", "sys"] {
        outer.push_str(&format!(
            "mount --rbind /{fs} {r}/{fs} || fail 'bind /{fs}'\n"
        ));
    }
    let mut inner = String::new();
    inner.push_str(&format!(
        "set -u\nfail() {{ echo \"localkube: container setup failed: $*\" >&2; exit {SETUP_FAILED_EXIT_CODE}; }}\n"
    ));
    if !mounts.is_empty() {
        outer.push_str(&format!("mkdir {r}{STAGING} || fail 'staging dir'\n"));
    }
    let mut read_only = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let staged = format!("{STAGING}/{i}");
        let is_dir = std::fs::metadata(&m.source)
            .map(|md| md.is_dir())
            .map_err(|e| RuntimeError::io("stat", &m.source, e))?;
        let src = q(&m.source);
        let tgt = q(&m.target);
        let what = shell_quote(&format!(
            "mount {} at {}",
            m.source.display(),
            m.target.display()
        ));
        if is_dir {
            outer.push_str(&format!("mkdir {r}{staged} || fail {what}\n"));
            inner.push_str(&format!("mkdir -p {tgt} || fail {what}\n"));
        } else {
            outer.push_str(&format!(": > {r}{staged} || fail {what}\n"));
            let parent = m.target.parent().unwrap_or(Path::new("/"));
            inner.push_str(&format!(
                "mkdir -p {} && {{ [ -e {tgt} ] || : > {tgt}; }} || fail {what}\n",
                q(parent)
            ));
        }
        outer.push_str(&format!("mount --bind {src} {r}{staged} || fail {what}\n"));
        inner.push_str(&format!("mount --move {staged} {tgt} || fail {what}\n"));
        if m.read_only {
            read_only.push((tgt, what));
        }
    }
    // The directories above the mount points are searchable by any user, as a container
    // runtime creates them: the container's root is the host's, whose directories may be
    // private (`/etc/valkey` of a host package, mode 0750); only the container's own layer
    // changes.
    let mut ancestors: Vec<&Path> = mounts
        .iter()
        .flat_map(|m| m.target.ancestors().skip(1))
        .filter(|a| *a != Path::new("/"))
        .collect();
    ancestors.sort();
    ancestors.dedup();
    if !ancestors.is_empty() {
        let list: Vec<String> = ancestors.iter().map(|a| q(a)).collect();
        inner.push_str(&format!(
            "chmod a+rx {} || fail 'mount point directories'\n",
            list.join(" ")
        ));
    }
    // Read-only only once every mount point exists: a mount nested in a read-only volume
    // (a Secret at /config/users under a ConfigMap at /config) needs its directory created
    // first, as a container runtime does.
    for (tgt, what) in read_only {
        inner.push_str(&format!("mount -o remount,bind,ro {tgt} || fail {what}\n"));
    }
    if !mounts.is_empty() {
        inner.push_str(&format!(
            "rmdir {STAGING}/* 2>/dev/null; rm -f {STAGING}/* 2>/dev/null; rmdir {STAGING} || fail 'remove staging dir'\n"
        ));
    }
    if let Some(wd) = &spec.working_dir {
        inner.push_str(&format!("mkdir -p {} || fail 'working dir'\n", q(wd)));
    }
    if spec.read_only_root {
        inner.push_str("mount -o remount,ro / || fail 'read-only root filesystem'\n");
    }
    let exec: Vec<String> = env_argv(
        &spec.env,
        spec.working_dir.as_deref(),
        &spec.argv,
        spec.user.as_ref(),
    )
    .iter()
    .map(|a| shell_quote(a))
    .collect();
    // Setup done: closing the setup pipe (stdin) tells the kubelet (see `spawn`).
    inner.push_str(&format!("exec {} </dev/null\n", exec.join(" ")));
    outer.push_str(&format!(
        "exec chroot {r} /bin/sh -c {}\n",
        shell_quote(&inner)
    ));
    Ok(outer)
}
