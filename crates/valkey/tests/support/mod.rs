//! Test harness: real `valkey-server` processes on free loopback ports in temporary
//! directories, killed on drop, plus cluster helpers built on the crate's commands.
//!
//! Binaries: `VALKEY9_SERVER` (default `~/.cache/valkey-operator/bin/valkey-server-9`, 9.1,
//! no TLS) and `VALKEY8_SERVER` (default `/usr/bin/valkey-server`, 8.0 with TLS).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::commands::{self, SystemUsers, acl, system_acl_rules};
use valkey_ops::model::ClusterNodes;
use valkey_ops::slots::{SLOT_COUNT, Slot, SlotRange};

pub const OPERATOR_PASSWORD: &str = "operator-secret";
pub const REPLICATION_PASSWORD: &str = "replication-secret";
pub const EXPORTER_PASSWORD: &str = "exporter-secret";
pub const APP_USER: &str = "app";
pub const APP_PASSWORD: &str = "app-secret";
/// DNS name in the test server certificate's SAN.
pub const TLS_SERVER_NAME: &str = "valkey.cluster.test";
/// Revision of the ACL file written by the harness.
pub const ACL_REVISION: &str = "harness0";

/// Which server binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Valkey 9.1 (atomic slot migration, no TLS).
    V9,
    /// Valkey 8.0 (TLS).
    V8,
}

impl Flavor {
    pub fn major(self) -> u32 {
        match self {
            Flavor::V9 => 9,
            Flavor::V8 => 8,
        }
    }

    pub fn binary(self) -> PathBuf {
        let (var, default) = match self {
            Flavor::V9 => (
                "VALKEY9_SERVER",
                format!(
                    "{}/.cache/valkey-operator/bin/valkey-server-9",
                    std::env::var("HOME").unwrap_or_else(|_| "/root".into())
                ),
            ),
            Flavor::V8 => ("VALKEY8_SERVER", "/usr/bin/valkey-server".to_owned()),
        };
        let p = PathBuf::from(std::env::var(var).unwrap_or(default));
        if p.exists() || self == Flavor::V8 {
            return p;
        }
        // The installer creates the symlink last; fall back to the versioned cache directory.
        let cache = p
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        std::fs::read_dir(&cache)
            .ok()
            .and_then(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path().join("valkey-server"))
                    .find(|p| p.exists() && p.to_string_lossy().contains("valkey-9"))
            })
            .unwrap_or(p)
    }
}

/// Certificates generated for a TLS test: a CA and a server certificate with a DNS SAN.
pub struct TlsFiles {
    pub dir: tempfile::TempDir,
    pub ca_pem: Vec<u8>,
}

impl TlsFiles {
    pub fn generate() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "valkey-ops test CA");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![TLS_SERVER_NAME.to_owned()]).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, TLS_SERVER_NAME);
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.path().join("ca.crt"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
        Self {
            ca_pem: ca_cert.pem().into_bytes(),
            dir,
        }
    }

    fn path(&self, f: &str) -> String {
        self.dir.path().join(f).display().to_string()
    }
}

/// ACL file lines used by every test server: the system users, an application user for
/// data traffic, and the revision marker.
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One running `valkey-server` (killed on drop).
pub struct Server {
    child: Option<Child>,
    pub flavor: Flavor,
    pub port: u16,
    pub bus_port: u16,
    pub dir: tempfile::TempDir,
    pub tls: bool,
}

impl Server {
    /// `ip:port` the operator dials.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn acl_path(&self) -> PathBuf {
        self.dir.path().join("users.acl")
    }

    /// Starts a cluster-enabled server (retrying on port collisions).
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
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let bus_port = free_port();
        let d = dir.path().display().to_string();
        std::fs::write(
            dir.path().join("users.acl"),
            acl_lines(flavor, ACL_REVISION).join("\n") + "\n",
        )
        .unwrap();
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
        std::fs::write(dir.path().join("valkey.conf"), conf.join("\n") + "\n").unwrap();
        let mut child = Command::new(flavor.binary())
            .arg(dir.path().join("valkey.conf"))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {:?}: {e}", flavor.binary()))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let log = dir.path().join("valkey.log");
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "exited with {status}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
            let ready = std::fs::read_to_string(&log)
                .is_ok_and(|l| l.contains("Ready to accept connections"));
            if ready {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::fs::read_to_string(&log).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Self {
            child: Some(child),
            flavor,
            port,
            bus_port,
            dir,
            tls: tls.is_some(),
        })
    }

    /// SIGKILLs the server (simulates a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("valkey.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `n` servers in parallel threads.
pub fn start_servers(flavor: Flavor, n: usize, tls: Option<&TlsFiles>) -> Vec<Server> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|_| s.spawn(move || Server::start(flavor, tls)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Operator pool (as `_operator`), optionally with TLS verifying [`TLS_SERVER_NAME`].
pub fn operator_pool(tls: Option<&TlsFiles>) -> NodePool {
    pool_for(acl::OPERATOR_USER, OPERATOR_PASSWORD, tls)
}

/// Pool for the application user (data traffic).
pub fn app_pool(tls: Option<&TlsFiles>) -> NodePool {
    pool_for(APP_USER, APP_PASSWORD, tls)
}

pub fn pool_for(user: &str, password: &str, tls: Option<&TlsFiles>) -> NodePool {
    let mut cfg = ClientConfig::new(user, password);
    if let Some(t) = tls {
        cfg = cfg.with_tls(t.ca_pem.clone(), Some(TLS_SERVER_NAME.to_owned()));
    }
    NodePool::new(cfg)
}

/// Balanced contiguous ranges for `n` primaries (the crate's initial-assignment planner).
pub fn split_slots(n: usize) -> Vec<SlotRange> {
    valkey_ops::plan::initial_assignment(n).unwrap()
}

/// Polls until `f` returns `Some` (panics after `timeout`).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `cluster_state:ok` with all 16384 slots served.
pub fn cluster_healthy(o: &valkey_ops::model::NodeObservation) -> bool {
    o.cluster_info.as_ref().is_some_and(|c| c.is_healthy())
}

/// Waits until every node in `addrs` reports `cluster_state:ok`, 16384 slots and knows
/// exactly `addrs.len()` non-failed nodes.
pub async fn wait_cluster_ok(pool: &NodePool, addrs: &[String], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut problems = Vec::new();
        for a in addrs {
            match commands::observe_node(pool, a).await {
                Ok(o) => {
                    let healthy = o
                        .nodes
                        .nodes
                        .iter()
                        .filter(|n| !n.flags.failing() && !n.flags.handshake)
                        .count();
                    if !cluster_healthy(&o) || healthy != addrs.len() {
                        problems.push(format!(
                            "{a}: {:?}, {healthy} healthy nodes\n{:#?}",
                            o.cluster_info,
                            o.nodes
                                .nodes
                                .iter()
                                .map(|n| (&n.id[..8], n.addr.host_port(), &n.flags, n.slot_count()))
                                .collect::<Vec<_>>()
                        ));
                    }
                }
                Err(e) => problems.push(format!("{a}: {e}")),
            }
        }
        if problems.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for cluster_state ok everywhere:\n{}",
            problems.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Forms a cluster of `primaries.len()` shards, each replica `replicas[i]` following
/// `primaries[i % primaries.len()]`, using the crate's idempotent commands.
/// Returns the primary node ids in order.
pub async fn form_cluster(
    pool: &NodePool,
    primaries: &[String],
    replicas: &[String],
) -> Vec<String> {
    let all: Vec<String> = primaries.iter().chain(replicas).cloned().collect();
    for (i, a) in all.iter().enumerate() {
        commands::ensure_config_epoch(pool, a, i as u64 + 1)
            .await
            .unwrap();
    }
    let ranges = split_slots(primaries.len());
    for (a, r) in primaries.iter().zip(&ranges) {
        commands::add_slots_range(pool, a, std::slice::from_ref(r))
            .await
            .unwrap();
    }
    join_nodes(pool, &all[0], &all[1..]).await;
    let mut ids = Vec::new();
    for p in primaries {
        ids.push(commands::node_id(pool, p).await.unwrap());
    }
    for (i, r) in replicas.iter().enumerate() {
        attach_replica(pool, r, &ids[i % ids.len()]).await;
    }
    wait_cluster_ok(pool, &all, Duration::from_secs(30)).await;
    ids
}

/// MEETs `nodes` through `seed` and waits until the seed knows them all.
pub async fn join_nodes(pool: &NodePool, seed: &str, nodes: &[String]) {
    for n in nodes {
        commands::meet(pool, seed, n).await.unwrap();
    }
    for n in nodes {
        let id = commands::node_id(pool, n).await.unwrap();
        commands::topology::wait_known(pool, seed, &id, Duration::from_secs(20))
            .await
            .unwrap();
    }
}

/// Makes `replica` follow `primary_id`, retrying while the id is not gossiped yet.
pub async fn attach_replica(pool: &NodePool, replica: &str, primary_id: &str) {
    eventually("replicate", Duration::from_secs(20), || async {
        match commands::replicate(pool, replica, primary_id).await {
            Ok(_) => Some(()),
            Err(commands::CommandError::NotReady(_)) => None,
            Err(e) => panic!("replicate {replica}: {e}"),
        }
    })
    .await
}

/// CRC16/XMODEM hash slot of a key (honouring `{hash tags}`).
pub fn key_slot(key: &[u8]) -> Slot {
    let k = match key.iter().position(|&b| b == b'{') {
        Some(s) => match key[s + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[s + 1..s + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in k {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOT_COUNT
}

/// Slot owner addresses (`ip:port`) from one node's view.
pub fn slot_owners(view: &ClusterNodes) -> HashMap<Slot, String> {
    let mut m = HashMap::new();
    for n in view.primaries() {
        for r in &n.slots {
            for s in r.iter() {
                m.insert(s, n.addr.host_port());
            }
        }
    }
    m
}

pub fn key(i: u64) -> String {
    format!("key:{i}")
}

fn value(i: u64) -> String {
    format!("value-{i}")
}

/// Groups key indices by the node owning their slot.
fn by_owner(view: &ClusterNodes, range: std::ops::Range<u64>) -> BTreeMap<String, Vec<u64>> {
    let owners = slot_owners(view);
    let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for i in range {
        let s = key_slot(key(i).as_bytes());
        m.entry(owners[&s].clone()).or_default().push(i);
    }
    m
}

/// Writes keys `0..n` (pipelined, routed by slot from `view_addr`'s view).
pub async fn write_keys(pool: &NodePool, view_addr: &str, n: u64) {
    let view = commands::cluster_nodes(pool, view_addr).await.unwrap();
    let groups = by_owner(&view, 0..n);
    futures::future::join_all(groups.into_iter().map(|(addr, idx)| async move {
        for chunk in idx.chunks(2000) {
            let mut p = redis::pipe();
            for &i in chunk {
                p.cmd("SET").arg(key(i)).arg(value(i)).ignore();
            }
            let () = pool.pipeline(&addr, &p).await.unwrap();
        }
    }))
    .await;
}

/// Reads keys `0..n` back (routed by the current view) and returns how many are missing or
/// wrong.
pub async fn count_bad_keys(pool: &NodePool, view_addr: &str, n: u64) -> u64 {
    let view = commands::cluster_nodes(pool, view_addr).await.unwrap();
    let groups = by_owner(&view, 0..n);
    let bad = futures::future::join_all(groups.into_iter().map(|(addr, idx)| async move {
        let mut bad = 0u64;
        for chunk in idx.chunks(2000) {
            let mut p = redis::pipe();
            for &i in chunk {
                p.cmd("GET").arg(key(i));
            }
            let vals: Vec<Option<String>> = pool.pipeline(&addr, &p).await.unwrap();
            bad += chunk
                .iter()
                .zip(vals)
                .filter(|(i, v)| v.as_deref() != Some(value(**i).as_str()))
                .count() as u64;
        }
        bad
    }))
    .await;
    bad.iter().sum()
}

/// Total keys over the given primaries (`DBSIZE`).
pub async fn total_keys(pool: &NodePool, primaries: &[String]) -> u64 {
    let mut t = 0;
    for p in primaries {
        let n: u64 = pool.query(p, &redis::cmd("DBSIZE")).await.unwrap();
        t += n;
    }
    t
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "valkey_ops=info".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A slot move `(source id, target id, slots)`.
pub type Move = (String, String, valkey_ops::slots::SlotSet);

/// Batches of independent moves from the crate's rebalance planner that balance `owned`
/// (id → slots) onto `targets`.
pub fn plan_batches(
    owned: &[(String, valkey_ops::slots::SlotSet)],
    targets: &[String],
    max_slots_per_batch: usize,
) -> Vec<Vec<Move>> {
    let current: std::collections::BTreeMap<String, valkey_ops::slots::SlotSet> =
        owned.iter().cloned().collect();
    let targets: std::collections::BTreeSet<String> = targets.iter().cloned().collect();
    let plan = valkey_ops::plan::plan_rebalance(&current, &targets, max_slots_per_batch).unwrap();
    plan.batches
        .into_iter()
        .map(|b| {
            b.into_iter()
                .map(|m| (m.source, m.target, m.slots))
                .collect()
        })
        .collect()
}

/// All moves of the planner's plan (one per source/target pair).
pub fn plan_moves(owned: &[(String, valkey_ops::slots::SlotSet)], targets: &[String]) -> Vec<Move> {
    plan_batches(owned, targets, 16384).concat()
}

/// Slots owned per primary id, from one node's view.
pub async fn owned_slots(pool: &NodePool, addr: &str) -> Vec<(String, valkey_ops::slots::SlotSet)> {
    let v = commands::cluster_nodes(pool, addr).await.unwrap();
    v.primaries()
        .filter(|n| !n.flags.failing())
        .map(|n| (n.id.clone(), n.slot_set()))
        .collect()
}
