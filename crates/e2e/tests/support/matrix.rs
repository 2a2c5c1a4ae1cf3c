//! The fault × configuration matrix: one cell is a `ValkeyCluster` of a given persistence,
//! shape and Valkey version, a continuous cluster-aware writer ([`TagWriter`]: `SET` +
//! `WAIT 1`, every acknowledged write read back), one fault, and the exact end state: Ready
//! with the layout, one primary per shard with its replicas in every node's view, and a clean
//! `valkey-cli --cluster check` (a tool nobody here wrote).
//!
//! Cells that share the operator and the localkube nodes harmlessly run in parallel, each
//! with its own cluster; the faults that stop the operator or a whole localkube node run
//! alone ([`Fault::exclusive`]).

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams};
use valkey_api::ValkeyCluster;
use valkey_api::status::ClusterState;

use super::tagwriter::TagWriter;
use super::*;

/// What `/data` keeps across a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persistence {
    /// No PersistentVolumeClaim, no saves.
    Off,
    /// A PVC with an hourly RDB save (`save 3600 1`): the files lag far behind.
    Rdb,
    /// A PVC with `appendonly yes` (`appendfsync everysec`).
    Aof,
}

impl Persistence {
    fn tag(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Rdb => "rdb",
            Self::Aof => "aof",
        }
    }
}

/// The fault a cell injects into shard 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `SIGKILL` of the primary's server (the container restarts in place, same pod IP).
    Kill,
    /// `SIGKILL` of every server of the shard at once: no copy survives in memory.
    KillShard,
    /// `SIGSTOP` of the primary for 3× `cluster-node-timeout`, then `SIGCONT`.
    Freeze,
    /// The primary's network cut for 3× `cluster-node-timeout`, then restored.
    Partition,
    /// The operator stopped, the primary's server killed, the operator back 30 s later.
    OperatorDown,
    /// The primary's localkube node stops as if it crashed, and starts again 20 s later.
    NodeStop,
    /// `SIGKILL` of shard 0's replica, then again while it is in its full sync (the cell's
    /// primary waits 5 s before streaming one, `repl-diskless-sync-delay 5`). Only a replica
    /// whose files lack the replication offset (AOF) needs a full sync after a restart.
    ReplicaSync,
    /// One shard more, and `SIGKILL` of shard 0's primary (a source of the slot moves) once
    /// `status.operation` shows slots moved.
    MigrationSource,
    /// One shard more, and `SIGKILL` of the new shard's primary (the target) once
    /// `status.operation` shows slots moved.
    MigrationTarget,
}

impl Fault {
    fn tag(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::KillShard => "killshard",
            Self::Freeze => "freeze",
            Self::Partition => "part",
            Self::OperatorDown => "opdown",
            Self::NodeStop => "nodestop",
            Self::ReplicaSync => "replsync",
            Self::MigrationSource => "migsrc",
            Self::MigrationTarget => "migdst",
        }
    }

    /// Shards added by the fault (a scale-out under way).
    fn added_shards(self) -> i32 {
        i32::from(matches!(
            self,
            Self::MigrationSource | Self::MigrationTarget
        ))
    }

    /// Whether the fault touches what every cell shares (the operator, a localkube node).
    pub fn exclusive(self) -> bool {
        matches!(self, Self::OperatorDown | Self::NodeStop)
    }

    /// Whether acknowledged writes may be lost by Valkey's design: every copy of the shard
    /// restarts, and only what its files hold comes back.
    pub fn loses_by_design(self) -> bool {
        matches!(self, Self::KillShard)
    }
}

/// One configuration × fault.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    pub persistence: Persistence,
    pub shards: i32,
    pub replicas: i32,
    /// Valkey major version: 9 (9.1, no TLS here) or 8 (8.0).
    pub version: u32,
    pub fault: Fault,
    /// TLS for clients, the bus and replication (Valkey 8.0 only here).
    pub tls: bool,
}

impl Cell {
    pub const fn new(
        fault: Fault,
        persistence: Persistence,
        shards: i32,
        replicas: i32,
        version: u32,
    ) -> Self {
        Self {
            persistence,
            shards,
            replicas,
            version,
            fault,
            tls: false,
        }
    }

    /// The same cell with TLS on (its version must be 8).
    pub const fn with_tls(self) -> Self {
        Self { tls: true, ..self }
    }

    /// The cell's name, also its cluster's: `kill-rdb-3x1-v9`.
    pub fn name(&self) -> String {
        format!(
            "{}-{}-{}x{}-v{}{}",
            self.fault.tag(),
            self.persistence.tag(),
            self.shards,
            self.replicas,
            self.version,
            if self.tls { "-tls" } else { "" }
        )
    }

    fn spec(&self) -> serde_json::Value {
        let image = if self.version >= 9 {
            "valkey/valkey:9.1.0"
        } else {
            "valkey/valkey:8.0.1"
        };
        let mut config = serde_json::json!({"cluster-node-timeout": NODE_TIMEOUT_MS.to_string()});
        let mut spec = serde_json::json!({"image": image});
        match self.persistence {
            Persistence::Off => {}
            Persistence::Rdb => {
                config["save"] = "3600 1".into();
                spec["persistence"] = serde_json::json!({"size": "1Gi"});
            }
            Persistence::Aof => {
                config["appendonly"] = "yes".into();
                spec["persistence"] = serde_json::json!({"size": "1Gi"});
            }
        }
        if self.fault == Fault::NodeStop {
            // A node's loss must not take every copy of the shard (the production advice);
            // with all of them on the stopped node the loss would be real, and reported.
            spec["scheduling"] =
                serde_json::json!({"node": {"spread": {"shard": {"mode": "Required"}}}});
        }
        if self.fault == Fault::ReplicaSync {
            config["repl-diskless-sync-delay"] = "5".into();
        }
        spec["config"] = config;
        if self.tls {
            spec["networking"] =
                serde_json::json!({"tls": {"certificate": {"secretName": self.tls_secret()}}});
        }
        spec
    }

    fn tls_secret(&self) -> String {
        format!("{}-certs", self.name())
    }
}

/// The `cluster-node-timeout` of every cell (the operator's default).
pub const NODE_TIMEOUT_MS: u64 = 5000;

/// What a cell measured.
#[derive(Clone, Debug)]
pub struct Row {
    pub cell: String,
    pub acked: usize,
    pub lost: usize,
    pub write_gap: Duration,
    pub durable_gap: Duration,
    /// From the fault to Ready with the exact layout.
    pub ready_after: Duration,
    /// The distinct status reasons seen while the cluster was not Ready, in order.
    pub seen: Vec<String>,
}

impl Row {
    /// A Markdown table row.
    pub fn markdown(&self) -> String {
        format!(
            "| {} | {} | {} | {:.2} s | {:.1} s | {:.1} s | {} |",
            self.cell,
            self.acked,
            self.lost,
            self.write_gap.as_secs_f64(),
            self.durable_gap.as_secs_f64(),
            self.ready_after.as_secs_f64(),
            self.seen.join(", ")
        )
    }
}

/// The Markdown table's header.
pub const HEADER: &str = "| cell | acknowledged | lost | write gap | durable gap | Ready after | status while disrupted |\n|---|---|---|---|---|---|---|";

const PW: &str = "matrix-app-pw";

/// The reason that reports a shard whose every copy was down at once.
const SHARD_RESTARTED: &str = valkey_api::status::reason::SHARD_RESTARTED;

/// Whether every pod of the layout exists, and the status is Ready with the exact live
/// topology.
async fn settled(
    client: &Client,
    cell: &Cell,
    shards: i32,
    name: &str,
    op_pw: &str,
) -> anyhow::Result<()> {
    let vc = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .get(name)
        .await?;
    let s = vc.status.unwrap_or_default();
    let current = s.observed_generation == vc.metadata.generation;
    // A shard that lost every copy serves again but stays reported as such for a while.
    let serving = s.state == ClusterState::Ready
        || (cell.fault.loses_by_design()
            && s.state == ClusterState::Degraded
            && s.reason.as_deref() == Some(SHARD_RESTARTED)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True"));
    ensure!(
        current && serving && s.ready_shards == shards,
        "{:?} {:?} {:?}",
        s.state,
        s.reason,
        s.message
    );
    check_topology_as(
        client,
        name,
        shards as usize,
        cell.replicas as usize,
        "_operator",
        op_pw,
        cell.tls,
    )
    .await
}

/// `valkey-cli --cluster check` against a pod of the cluster: every slot covered, every node
/// agreeing, no open slot.
pub async fn cluster_check(
    client: &Client,
    name: &str,
    op_pw: &str,
    tls: bool,
) -> anyhow::Result<()> {
    let pods = pods_of(client, name).await?;
    let ip = pods.iter().find_map(pod_ip).context("a pod IP")?;
    let tls_args: &[&str] = if tls { &["--tls", "--insecure"] } else { &[] };
    let out = tokio::process::Command::new("valkey-cli")
        .args(tls_args)
        .args([
            "--no-auth-warning",
            "--user",
            "_operator",
            "--pass",
            op_pw,
            "--cluster",
            "check",
            &format!("{ip}:6379"),
        ])
        .output()
        .await
        .context("valkey-cli")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success()
            && text.contains("[OK] All nodes agree about slots configuration.")
            && text.contains("[OK] All 16384 slots covered.")
            && !text.contains("[ERR]")
            && !text.contains("[WARNING]"),
        "valkey-cli --cluster check {ip}: {}\n{text}",
        out.status
    );
    Ok(())
}

/// The cell's TLS Secret: a certificate for the cluster's headless Service names, as
/// cert-manager issues one.
async fn create_cell_tls_secret(client: &Client, cell: &Cell) -> anyhow::Result<()> {
    let svc = format!("valkey-{}.{NS}.svc", cell.name());
    let tls = valkey_testkit::TlsFiles::generate_for(&[
        &format!("*.{svc}"),
        &format!("*.{svc}.cluster.local"),
    ]);
    create_tls_secret(client, &cell.tls_secret(), &tls).await
}

/// Waits until `status.operation` shows slots moved (at most 120 s).
async fn wait_slots_moving(client: &Client, name: &str) -> anyhow::Result<()> {
    let api = Api::<ValkeyCluster>::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let op = api.get(name).await?.status.and_then(|s| s.operation);
        if op.as_ref().is_some_and(|o| o.slots_moved > Some(0)) {
            eprintln!("[{name} {:.1}s] mid-migration: {op:?}", clock());
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no slot move showed in status.operation"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until primary `pod` lists a replica that is not online yet (waiting for or
/// receiving its full sync), at most 60 s.
async fn wait_full_sync(client: &Client, name: &str, pod: &str, tls: bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = Api::<Pod>::namespaced(client.clone(), NS).get(pod).await?;
        if let Some(ip) = pod_ip(&p) {
            let info = async {
                let mut c = node_conn_with(&ip, "app", PW, tls).await?;
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut c)
                    .await?;
                anyhow::Ok(info)
            };
            if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(1), info).await
                && info.lines().any(|l| {
                    l.starts_with("slave") && l.contains("state=") && !l.contains("state=online")
                })
            {
                return Ok(());
            }
        }
        ensure!(
            Instant::now() < deadline,
            "{name}: {pod} never listed a replica in a full sync"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The live primary pod of shard `shard`.
async fn shard_primary(
    client: &Client,
    name: &str,
    shard: i32,
    tls: bool,
) -> anyhow::Result<String> {
    shard_roles_with(client, name, shard, PW, tls)
        .await?
        .into_iter()
        .find(|(_, _, r)| r == "master")
        .map(|(p, _, _)| p)
        .with_context(|| format!("shard {shard} has no live primary"))
}

/// The pods of shard 0 as (pod, live role).
async fn shard0(client: &Client, name: &str, tls: bool) -> anyhow::Result<(String, Vec<String>)> {
    let pods = shard_roles_with(client, name, 0, PW, tls).await?;
    let primary = pods
        .iter()
        .find(|(_, _, r)| r == "master")
        .map(|(p, _, _)| p.clone())
        .context("shard 0 has no live primary")?;
    let replicas = pods
        .iter()
        .filter(|(p, _, _)| *p != primary)
        .map(|(p, _, _)| p.clone())
        .collect();
    Ok((primary, replicas))
}

/// The operator's controllers, which an exclusive fault may stop and start again.
pub type OperatorSlot = tokio::sync::Mutex<Option<Operator>>;

/// Runs one cell to its end state; the cluster is deleted afterwards whatever the outcome.
pub async fn run_cell(fx: &Fixture, operator: &OperatorSlot, cell: Cell) -> anyhow::Result<Row> {
    let name = cell.name();
    let client = &fx.client;
    create_user_secret(client, &format!("{name}-app"), PW).await?;
    if cell.tls {
        create_cell_tls_secret(client, &cell).await?;
    }
    create_cluster_with(client, &name, cell.shards, cell.replicas, cell.spec()).await?;
    let result = run_created(fx, operator, cell, &name).await;
    let _ = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NS)
        .delete(&format!("{name}-app"), &DeleteParams::default())
        .await;
    let _ = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NS)
        .delete(&cell.tls_secret(), &DeleteParams::default())
        .await;
    result.with_context(|| format!("cell {name}"))
}

async fn run_created(
    fx: &Fixture,
    operator: &OperatorSlot,
    cell: Cell,
    name: &str,
) -> anyhow::Result<Row> {
    let client = &fx.client;
    let t0 = Instant::now();
    wait_ready(client, name, cell.shards, Duration::from_secs(300)).await?;
    let op_pw = system_operator_password(client, name).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Err(e) = settled(client, &cell, cell.shards, name, &op_pw).await {
        ensure!(Instant::now() < deadline, "{name} never settled: {e:#}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "[{name} {:.1}s] Ready after {:.1}s",
        clock(),
        t0.elapsed().as_secs_f64()
    );
    let writer = TagWriter::start(client, name, PW, "m", 6, 1).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (victim, replicas) = shard0(client, name, cell.tls).await?;
    let faults = fx.faults()?;
    let hold = Duration::from_millis(3 * NODE_TIMEOUT_MS);
    let fault_at = Instant::now();
    eprintln!("[{name} {:.1}s] {:?} on {victim}", clock(), cell.fault);
    // The fault, with the status watched until it is over.
    let watch = StatusWatch::start(client, name);
    match cell.fault {
        Fault::Kill => faults.kill_container(NS, &victim, "server")?,
        Fault::KillShard => {
            for p in std::iter::once(&victim).chain(&replicas) {
                faults.kill_container(NS, p, "server")?;
            }
        }
        Fault::Freeze => {
            faults.pause(NS, &victim, "server")?;
            tokio::time::sleep(hold).await;
            faults.resume(NS, &victim, "server")?;
        }
        Fault::Partition => {
            faults.cut_network(NS, &victim)?;
            tokio::time::sleep(hold).await;
            faults.restore_network(NS, &victim)?;
        }
        Fault::OperatorDown => {
            let op = operator
                .lock()
                .await
                .take()
                .context("no operator to stop")?;
            op.stop().await;
            faults.kill_container(NS, &victim, "server")?;
            tokio::time::sleep(Duration::from_secs(30)).await;
            *operator.lock().await = Some(Operator::start(client));
        }
        Fault::NodeStop => {
            let node = Api::<Pod>::namespaced(client.clone(), NS)
                .get(&victim)
                .await?
                .spec
                .and_then(|s| s.node_name)
                .context("the primary's node")?;
            faults.stop_node(&node).await?;
            tokio::time::sleep(Duration::from_secs(20)).await;
            faults.start_node(&node).await?;
        }
        Fault::ReplicaSync => {
            let replica = replicas.first().context("shard 0 has no replica")?;
            faults.kill_container(NS, replica, "server")?;
            wait_full_sync(client, name, &victim, cell.tls).await?;
            eprintln!(
                "[{name} {:.1}s] killing {replica} in its full sync",
                clock()
            );
            faults.kill_container(NS, replica, "server")?;
        }
        Fault::MigrationSource | Fault::MigrationTarget => {
            patch_spec(client, name, serde_json::json!({"shards": cell.shards + 1})).await?;
            wait_slots_moving(client, name).await?;
            let pod = if cell.fault == Fault::MigrationSource {
                victim.clone()
            } else {
                shard_primary(client, name, cell.shards, cell.tls).await?
            };
            eprintln!("[{name} {:.1}s] killing {pod} mid-migration", clock());
            faults.kill_container(NS, &pod, "server")?;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last = String::new();
    loop {
        match settled(
            client,
            &cell,
            cell.shards + cell.fault.added_shards(),
            name,
            &op_pw,
        )
        .await
        {
            Ok(()) => break,
            Err(e) => {
                let now = format!("{e:#}");
                if now != last {
                    eprintln!("[{name} +{:.1}s] {now}", fault_at.elapsed().as_secs_f64());
                    last = now;
                }
                if Instant::now() > deadline {
                    bail!("not settled 300 s after the fault: {last}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ready_after = fault_at.elapsed();
    let seen = watch.stop().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let s = writer.stop_and_check().await?;
    cluster_check(client, name, &op_pw, cell.tls).await?;
    let row = Row {
        cell: name.to_owned(),
        acked: s.acked,
        lost: s.lost,
        write_gap: s.write_gap,
        durable_gap: s.durable_gap,
        ready_after,
        seen,
    };
    eprintln!("MEASURE fault matrix {}", row.markdown());
    if !cell.fault.loses_by_design() {
        ensure!(
            row.lost == 0,
            "{} of {} acknowledged writes lost",
            row.lost,
            row.acked
        );
    }
    ensure!(
        !row.seen.is_empty(),
        "the status never left Ready during the fault"
    );
    // The loss of a whole shard is reported, and only then.
    let reported = row.seen.iter().any(|r| r.contains(SHARD_RESTARTED));
    ensure!(
        reported == cell.fault.loses_by_design(),
        "{SHARD_RESTARTED} {} reported: {:?}",
        if reported { "wrongly" } else { "never" },
        row.seen
    );
    Ok(row)
}

/// Polls a cluster's status every 250 ms and records each distinct non-Ready
/// `state/reason`, with `ClusterFormed` when False and `Degraded` when True, in the order
/// first seen.
struct StatusWatch {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl StatusWatch {
    fn start(client: &Client, name: &str) -> Self {
        let (stop, mut rx) = tokio::sync::watch::channel(false);
        let api = Api::<ValkeyCluster>::namespaced(client.clone(), NS);
        let name = name.to_owned();
        let task = tokio::spawn(async move {
            let mut seen: Vec<String> = Vec::new();
            loop {
                if let Ok(vc) = api.get(&name).await {
                    let s = vc.status.unwrap_or_default();
                    if s.state != ClusterState::Ready {
                        // The state's reason, and which conditions say what is wrong.
                        let mut reason =
                            format!("{:?}/{}", s.state, s.reason.clone().unwrap_or_default());
                        for c in &s.conditions {
                            let bad = match c.type_.as_str() {
                                "ClusterFormed" => c.status == "False",
                                "Degraded" => c.status == "True",
                                _ => false,
                            };
                            if bad {
                                reason.push_str(&format!(" {}={}", c.type_, c.reason));
                            }
                        }
                        if !seen.contains(&reason) {
                            eprintln!(
                                "[{name} {:.1}s] status {reason}: {}",
                                clock(),
                                s.message.unwrap_or_default()
                            );
                            seen.push(reason);
                        }
                    }
                }
                tokio::select! {
                    _ = rx.changed() => break,
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
            seen
        });
        Self { stop, task }
    }

    async fn stop(self) -> Vec<String> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// Runs `cells`: the shared ones `parallel` at a time, then the exclusive ones alone. Returns
/// every row, or the failures.
pub async fn run_cells(
    fx: &Fixture,
    operator: &OperatorSlot,
    cells: &[Cell],
    parallel: usize,
) -> (Vec<Row>, Vec<String>) {
    use futures::StreamExt;
    let (shared, exclusive): (Vec<Cell>, Vec<Cell>) =
        cells.iter().partition(|c| !c.fault.exclusive());
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut record = |r: anyhow::Result<Row>| match r {
        Ok(row) => rows.push(row),
        Err(e) => {
            eprintln!("FAILED {e:#}");
            failures.push(format!("{e:#}"));
        }
    };
    let mut stream = futures::stream::iter(shared)
        .map(|c| run_cell(fx, operator, c))
        .buffer_unordered(parallel.max(1));
    while let Some(r) = stream.next().await {
        record(r);
    }
    drop(stream);
    for c in exclusive {
        record(run_cell(fx, operator, c).await);
    }
    (rows, failures)
}
