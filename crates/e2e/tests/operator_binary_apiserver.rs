//! The `valkey-operator` binary (built beforehand: `cargo build -p valkey-operator`) as its own
//! processes against a real kube-apiserver:
//!
//! * started before the CRDs exist, it waits (logging once), then reconciles once they are
//!   installed;
//! * with `--leader-elect`, only the Lease holder reconciles; a standby takes over when the
//!   leader is SIGKILLed (at the lease's expiry) or SIGTERMed (at once, the Lease released),
//!   and a leader whose Lease is taken away, or that cannot renew it (the apiserver paused),
//!   exits non-zero before another could take over.
//!
//! Takeover times are printed as `MEASURE` lines (`-- --nocapture`).

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use support::{Fixture, NS};
use valkey_api::ValkeyNode;

/// The two tests each start a kube-apiserver; on 2 cores they run one after the other so the
/// measured takeover times are not inflated by the other test.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Lease duration used by the election test, in seconds.
const LEASE_SECS: u64 = 5;

/// The operator binary next to this test's `deps/` directory (or `$VALKEY_OPERATOR_BIN`),
/// checked to know `--leader-elect` (a stale build does not).
fn operator_binary() -> anyhow::Result<PathBuf> {
    let bin = match std::env::var_os("VALKEY_OPERATOR_BIN") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .context("test executable has no target directory")?
            .join("valkey-operator"),
    };
    ensure!(
        bin.exists(),
        "{} missing: build it first with `cargo build -p valkey-operator`",
        bin.display()
    );
    let help = Command::new(&bin).args(["run", "--help"]).output()?;
    ensure!(
        String::from_utf8_lossy(&help.stdout).contains("--leader-elect"),
        "{} is stale (no --leader-elect): rebuild it with `cargo build -p valkey-operator`",
        bin.display()
    );
    Ok(bin)
}

/// A free TCP port on loopback.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One `valkey-operator run` process, its stderr echoed with a `[name]` prefix and kept;
/// SIGKILLed and reaped when dropped (a failing test leaves no process behind).
struct OperatorProcess {
    name: String,
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl OperatorProcess {
    /// Starts the operator as `$POD_NAME=name` with text logs and its own HTTP port.
    fn spawn(name: &str, kubeconfig: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let port = free_port()?;
        let mut child = Command::new(operator_binary()?)
            .args(["run", "--log-format", "text", "--metrics-address"])
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env("POD_NAME", name)
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the operator binary")?;
        let stderr = child.stderr.take().context("stderr")?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (sink, prefix) = (log.clone(), name.to_owned());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{prefix} {:.1}s] {line}", support::clock());
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        eprintln!("[{name}] started, pid {}, port {port}", child.id());
        Ok(Self {
            name: name.to_owned(),
            child,
            port,
            log,
        })
    }

    /// Lines of its log containing `needle`.
    fn log_count(&self, needle: &str) -> usize {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Still running.
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn signal(&self, sig: Signal) -> anyhow::Result<()> {
        let pid = i32::try_from(self.child.id())?;
        nix::sys::signal::kill(Pid::from_raw(pid), sig)?;
        Ok(())
    }

    /// Waits for the process to exit.
    async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ensure!(
                Instant::now() < deadline,
                "{} still running after {timeout:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Status code and body of `GET path` on its HTTP port.
    async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await?;
        let code = buf
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("bad HTTP answer {buf:?}"))?;
        let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        Ok((code, body))
    }

    /// Waits until `/readyz` answers `code` with `body`.
    async fn wait_readyz(&self, code: u16, body: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.get("/readyz").await;
            if let Ok((c, b)) = &now
                && *c == code
                && b == body
            {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{}: /readyz is {now:?}, not {code} {body} after {timeout:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A metric's value summed over its label sets (0 when absent).
    async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let (code, text) = self.get("/metrics").await?;
        ensure!(code == 200, "{}: /metrics answered {code}", self.name);
        Ok(text
            .lines()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// Reconcile passes so far, both controllers.
    async fn reconciles(&self) -> anyhow::Result<f64> {
        self.metric("valkey_operator_reconciles_total").await
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates a ValkeyCluster of one shard without replicas (no pods run here: the operator
/// only writes its children).
async fn create_small_cluster(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<valkey_api::ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let vc = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
        "metadata": {"name": name},
        "spec": {"shards": 1, "replicas": 0}
    }))?;
    api.create(&Default::default(), &vc).await?;
    Ok(())
}

/// Waits until the operator created the ValkeyNode of `name`; returns the time it took.
async fn wait_children(client: &Client, name: &str, timeout: Duration) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let api: Api<ValkeyNode> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().labels(&format!("valkey.io/cluster={name}"));
    loop {
        if !api.list(&lp).await?.items.is_empty() {
            return Ok(t0.elapsed());
        }
        ensure!(
            t0.elapsed() < timeout,
            "no ValkeyNode of {name} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Lease's holder (`None`: no Lease or no holder).
async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    Ok(leases
        .get_opt("valkey-operator")
        .await?
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Waits until the Lease is held by the process started as `name`; returns the time it took.
async fn wait_holder(
    leases: &Api<Lease>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let prefix = format!("{name}_");
    let mut last = None;
    loop {
        let h = holder(leases).await?;
        if h.as_deref().is_some_and(|h| h.starts_with(&prefix)) {
            return Ok(t0.elapsed());
        }
        if h != last {
            eprintln!("[test {:.1}s] Lease holder {h:?}", support::clock());
            last = h;
        }
        ensure!(
            t0.elapsed() < timeout,
            "{name} does not hold the Lease after {timeout:?} (holder {last:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `op` has reconciled at least once; returns the time it took.
async fn wait_reconciling(op: &OperatorProcess, timeout: Duration) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    while op.reconciles().await? == 0.0 {
        ensure!(
            t0.elapsed() < timeout,
            "{} did not reconcile within {timeout:?}",
            op.name
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_binary_waits_for_crds_then_reconciles() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let Some(fx) = Fixture::start_without_crds(localkube::Options::apiserver_only()).await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let kubeconfig = fx.env.kubeconfig_path();
    let mut op = OperatorProcess::spawn("op-crd", &kubeconfig, &[])?;

    // No CRDs: alive, healthy, not ready, and the wait is logged once, not per retry.
    let t0 = Instant::now();
    while op.log_count("CRD not installed yet") == 0 {
        ensure!(op.alive(), "the operator exited without CRDs");
        ensure!(
            t0.elapsed() < Duration::from_secs(30),
            "no 'CRD not installed yet' log"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    ensure!(op.alive(), "the operator exited while waiting for the CRDs");
    assert_eq!(op.get("/healthz").await?, (200, "ok".to_owned()));
    assert_eq!(op.get("/readyz").await?, (503, "starting".to_owned()));
    assert_eq!(op.log_count("CRD not installed yet"), 1, "logged per retry");

    // The CRDs arrive (as with a Helm install): the operator starts its controllers.
    let t_crds = Instant::now();
    support::install_crds(&client).await?;
    op.wait_readyz(200, "ok", Duration::from_secs(30)).await?;
    eprintln!(
        "MEASURE CRDs applied → controllers running: {:.1}s",
        t_crds.elapsed().as_secs_f64()
    );
    create_small_cluster(&client, "late").await?;
    let took = wait_children(&client, "late", Duration::from_secs(60)).await?;
    eprintln!(
        "MEASURE ValkeyCluster created → ValkeyNode written: {:.1}s",
        took.as_secs_f64()
    );
    ensure!(op.alive(), "the operator exited");
    assert_eq!(
        op.log_count("CRD established"),
        valkey_api::crds().len(),
        "one line per CRD"
    );
    // The pass that wrote the ValkeyNode is counted when it ends, a moment later.
    wait_reconciling(&op, Duration::from_secs(10)).await?;
    assert_eq!(op.metric("valkey_operator_leader").await?, 1.0);

    op.signal(Signal::SIGTERM)?;
    let status = op.wait_exit(Duration::from_secs(20)).await?;
    assert!(status.success(), "exit after SIGTERM: {status}");
    drop(op);
    fx.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_binary_leader_election_takeover() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let Some(fx) = Fixture::start_with(localkube::Options::apiserver_only(), false).await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let kubeconfig = fx.env.kubeconfig_path();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let duration = LEASE_SECS.to_string();
    let elect = ["--leader-elect", "--lease-duration", duration.as_str()];
    let lease = Duration::from_secs(LEASE_SECS);

    // A leads, B waits: only A reconciles.
    let mut a = OperatorProcess::spawn("op-a", &kubeconfig, &elect)?;
    wait_holder(&leases, "op-a", Duration::from_secs(30)).await?;
    a.wait_readyz(200, "ok", Duration::from_secs(10)).await?;
    let b = OperatorProcess::spawn("op-b", &kubeconfig, &elect)?;
    b.wait_readyz(200, "standby", Duration::from_secs(30))
        .await?;
    create_small_cluster(&client, "first").await?;
    wait_children(&client, "first", Duration::from_secs(60)).await?;
    // Several renewals of A, so B has seen the Lease renewed and kept waiting.
    tokio::time::sleep(lease).await;
    ensure!(a.alive(), "the leader exited");
    assert!(a.reconciles().await? > 0.0);
    assert_eq!(a.metric("valkey_operator_leader").await?, 1.0);
    assert_eq!(b.reconciles().await?, 0.0, "the standby reconciled");
    assert_eq!(b.metric("valkey_operator_leader").await?, 0.0);
    assert_eq!(b.get("/healthz").await?, (200, "ok".to_owned()));
    assert_eq!(b.log_count("became leader"), 0);
    assert_eq!(a.log_count("became leader"), 1);
    assert_eq!(
        b.log_count("standby: the Lease is held by another instance"),
        1
    );

    // SIGKILL A: B takes over when A's term expires.
    a.signal(Signal::SIGKILL)?;
    let took = wait_holder(&leases, "op-b", lease * 3).await?;
    let reconciling = wait_reconciling(&b, Duration::from_secs(30)).await? + took;
    eprintln!(
        "MEASURE leader SIGKILL → standby holds the Lease: {:.2}s, → reconciles: {:.2}s (lease {LEASE_SECS}s)",
        took.as_secs_f64(),
        reconciling.as_secs_f64()
    );
    ensure!(
        took <= lease + Duration::from_secs(2),
        "takeover after SIGKILL took {took:?}, more than the lease duration {lease:?} + 2 s"
    );
    create_small_cluster(&client, "second").await?;
    wait_children(&client, "second", Duration::from_secs(60)).await?;
    assert_eq!(b.log_count("became leader"), 1);
    drop(a);

    // SIGTERM B with C waiting: B stops, releases, C takes over at once.
    let mut b = b;
    let c = OperatorProcess::spawn("op-c", &kubeconfig, &elect)?;
    c.wait_readyz(200, "standby", Duration::from_secs(30))
        .await?;
    // Let C settle into waiting for B's expiry (the crate's candidate sleeps until then).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(c.reconciles().await?, 0.0, "the standby reconciled");
    b.signal(Signal::SIGTERM)?;
    let took = wait_holder(&leases, "op-c", lease * 3).await?;
    let reconciling = wait_reconciling(&c, Duration::from_secs(30)).await? + took;
    eprintln!(
        "MEASURE leader SIGTERM → standby holds the Lease: {:.2}s, → reconciles: {:.2}s (lease {LEASE_SECS}s)",
        took.as_secs_f64(),
        reconciling.as_secs_f64()
    );
    let status = b.wait_exit(Duration::from_secs(20)).await?;
    assert!(status.success(), "leader exit after SIGTERM: {status}");
    assert_eq!(b.log_count("released the Lease"), 1);
    ensure!(
        took < lease,
        "takeover after a release took {took:?}, not faster than the lease duration {lease:?}"
    );
    create_small_cluster(&client, "third").await?;
    wait_children(&client, "third", Duration::from_secs(60)).await?;

    // Fence: the Lease taken away from C (another holder written): C stops and exits non-zero.
    let mut c = c;
    let patch = serde_json::json!({"spec": {"holderIdentity": "intruder"}});
    leases
        .patch(
            "valkey-operator",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let taken = Instant::now();
    let status = c.wait_exit(lease * 2).await?;
    eprintln!(
        "MEASURE Lease taken away → leader exited: {:.2}s",
        taken.elapsed().as_secs_f64()
    );
    ensure!(!status.success(), "the fenced leader exited with {status}");
    assert_eq!(c.log_count("lost leadership"), 1);
    if holder(&leases).await?.as_deref() != Some("intruder") {
        bail!("the fenced leader rewrote the Lease");
    }

    // Fence without the apiserver: D leads, E waits, the apiserver is paused. D cannot renew,
    // so it must stop before its term ends; once the apiserver is back, E takes over.
    let mut d = OperatorProcess::spawn("op-d", &kubeconfig, &elect)?;
    wait_holder(&leases, "op-d", lease * 3).await?;
    d.wait_readyz(200, "ok", Duration::from_secs(10)).await?;
    let e = OperatorProcess::spawn("op-e", &kubeconfig, &elect)?;
    e.wait_readyz(200, "standby", Duration::from_secs(30))
        .await?;
    let (_, apiserver) = fx
        .env
        .control_plane_pids()
        .into_iter()
        .find(|(n, _)| n.contains("apiserver"))
        .context("no kube-apiserver pid")?;
    let paused = Paused::new(apiserver)?;
    let status = d.wait_exit(lease * 2).await?;
    let exited = paused.since.elapsed();
    drop(paused);
    eprintln!(
        "MEASURE apiserver paused → leader exited: {:.2}s (lease {LEASE_SECS}s)",
        exited.as_secs_f64()
    );
    ensure!(!status.success(), "the fenced leader exited with {status}");
    ensure!(
        exited < lease,
        "the leader cut off from the apiserver ran {exited:?}, not less than the lease {lease:?}"
    );
    let resumed = Instant::now();
    wait_holder(&leases, "op-e", lease * 3).await?;
    eprintln!(
        "MEASURE apiserver resumed → standby holds the Lease: {:.2}s",
        resumed.elapsed().as_secs_f64()
    );
    assert_eq!(d.log_count("lost leadership"), 1);
    wait_reconciling(&e, Duration::from_secs(30)).await?;

    drop((b, c, d, e));
    fx.stop().await;
    Ok(())
}

/// A process stopped with SIGSTOP, continued when dropped.
struct Paused {
    pid: Pid,
    since: Instant,
}

impl Paused {
    fn new(pid: u32) -> anyhow::Result<Self> {
        let pid = Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, Signal::SIGSTOP)?;
        Ok(Self {
            pid,
            since: Instant::now(),
        })
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, Signal::SIGCONT);
    }
}
