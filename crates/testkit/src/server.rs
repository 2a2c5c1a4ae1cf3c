//! One running `valkey-server` (killed on drop).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use valkey_ops::commands::{SystemUsers, acl, system_acl_rules};

use crate::REPLICATION_PASSWORD;
use crate::bins::Flavor;
use crate::tls::TlsFiles;
use crate::{ACL_REVISION, APP_PASSWORD, APP_USER, EXPORTER_PASSWORD, OPERATOR_PASSWORD};

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// ACL file lines used by every harness cluster server: the system users, an application
/// user for data traffic, and the revision marker.
pub fn acl_lines(flavor: Flavor, revision: &str) -> Vec<String> {
    let mut lines = system_acl_rules(
        &SystemUsers {
            operator_password: OPERATOR_PASSWORD,
            replication_password: REPLICATION_PASSWORD,
            exporter_password: EXPORTER_PASSWORD,
        },
        flavor.major(),
    );
    lines.push(format!(
        "user {APP_USER} reset on >{APP_PASSWORD} ~* &* +@all"
    ));
    lines.push(acl::revision_marker_line(revision));
    lines
}

/// A running server.
pub struct Server {
    child: Option<Child>,
    /// Which binary (`None` for a server started from a given binary and config).
    pub flavor: Option<Flavor>,
    /// Client port (the TLS port with TLS).
    pub port: u16,
    /// Cluster bus port.
    pub bus_port: u16,
    /// Its working directory (config, ACL file, log, data).
    pub dir: tempfile::TempDir,
    /// Whether it serves TLS.
    pub tls: bool,
}

/// Spawns `bin` with `args` in `dir` and waits until it accepts TCP connections on `port`;
/// the log's content when it exits or never listens.
fn spawn_ready(
    bin: &Path,
    args: &[String],
    dir: &Path,
    port: u16,
    log: &Path,
) -> Result<Child, String> {
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "exited with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "did not listen on {port}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    /// `ip:port` to dial.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The ACL file.
    pub fn acl_path(&self) -> PathBuf {
        self.dir.path().join("users.acl")
    }

    /// Starts a cluster-enabled server with the harness ACL (retrying on port collisions).
    pub fn start(flavor: Flavor, tls: Option<&TlsFiles>) -> Self {
        let mut last_log = String::new();
        for _ in 0..5 {
            match Self::try_start(flavor, tls) {
                Ok(s) => return s,
                Err(log) => last_log = log,
            }
        }
        panic!("valkey-server {flavor:?} did not start:\n{last_log}");
    }

    fn try_start(flavor: Flavor, tls: Option<&TlsFiles>) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = free_port();
        let bus_port = free_port();
        let d = dir.path().display().to_string();
        std::fs::write(
            dir.path().join("users.acl"),
            acl_lines(flavor, ACL_REVISION).join("\n") + "\n",
        )
        .map_err(|e| e.to_string())?;
        let mut conf = vec![
            "bind 127.0.0.1".to_owned(),
            "cluster-enabled yes".into(),
            format!("cluster-port {bus_port}"),
            "cluster-config-file nodes.conf".into(),
            "cluster-node-timeout 2000".into(),
            "cluster-allow-replica-migration no".into(),
            format!("dir {d}"),
            format!("aclfile {d}/users.acl"),
            "save \"\"".into(),
            "appendonly no".into(),
            "repl-diskless-sync-delay 0".into(),
            "masteruser _replication".into(),
            format!("masterauth {REPLICATION_PASSWORD}"),
            format!("logfile {d}/valkey.log"),
            "loglevel notice".into(),
        ];
        if let Some(t) = tls {
            conf.extend([
                "port 0".into(),
                format!("tls-port {port}"),
                format!("tls-cert-file {}", t.path("tls.crt")),
                format!("tls-key-file {}", t.path("tls.key")),
                format!("tls-ca-cert-file {}", t.path("ca.crt")),
                "tls-auth-clients no".into(),
                "tls-cluster yes".into(),
                "tls-replication yes".into(),
            ]);
        } else {
            conf.push(format!("port {port}"));
        }
        let conf_path = dir.path().join("valkey.conf");
        std::fs::write(&conf_path, conf.join("\n") + "\n").map_err(|e| e.to_string())?;
        let log = dir.path().join("valkey.log");
        let child = spawn_ready(
            &flavor.binary(),
            &[conf_path.display().to_string()],
            dir.path(),
            port,
            &log,
        )?;
        Ok(Self {
            child: Some(child),
            flavor: Some(flavor),
            port,
            bus_port,
            dir,
            tls: tls.is_some(),
        })
    }

    /// Starts `bin` with the config file `conf` (which must listen on loopback `port`) and
    /// `extra` arguments, logging to `<conf>.log`. Panics with the server's log when it exits
    /// or never listens: the test of a config the server must accept.
    pub fn start_config(bin: &Path, conf: &Path, port: u16, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = conf.with_extension("log");
        let mut args = vec![conf.display().to_string()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args.extend(["--logfile".to_owned(), log.display().to_string()]);
        match spawn_ready(bin, &args, dir.path(), port, &log) {
            Ok(child) => Self {
                child: Some(child),
                flavor: None,
                port,
                bus_port: 0,
                dir,
                tls: false,
            },
            Err(e) => panic!("valkey-server {}: {e}", bin.display()),
        }
    }

    /// SIGKILLs the server (simulates a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its process id (`None` once killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// Freezes the process (`SIGSTOP`): it answers nothing until [`Server::resume`].
    pub fn freeze(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a frozen process run again (`SIGCONT`).
    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self
            .pid()
            .and_then(|p| i32::try_from(p).ok())
            .expect("a running server");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).expect("signal sent");
    }

    /// Whether it was not killed.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("valkey.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `n` cluster servers in parallel threads.
pub fn start_servers(flavor: Flavor, n: usize, tls: Option<&TlsFiles>) -> Vec<Server> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|_| s.spawn(move || Server::start(flavor, tls)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("server thread"))
            .collect()
    })
}
