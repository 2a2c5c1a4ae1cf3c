//! Helpers shared by the root end-to-end tests: CRD install, ValkeyCluster creation, waiting
//! for Ready, live topology checks and Valkey connections to pod IPs.
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod matrix;
pub mod tagwriter;

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use valkey_api::ValkeyCluster;
use valkey_api::status::ClusterState;

pub const NS: &str = "default";

pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The set-up every suite shares: a localkube environment (`E2E_LOCALKUBE_DIR` keeps its
/// state for inspection), the CRDs installed and Established, and, with [`Fixture::start`],
/// the operator's controllers running in-process.
pub struct Fixture {
    /// The environment.
    pub env: localkube::Env,
    /// Its admin client.
    pub client: Client,
    /// The operator, when started.
    pub operator: Option<Operator>,
}

impl Fixture {
    /// A full environment (nodes, pods) with the operator running; `None` with a "skipped"
    /// line when not root (pods are processes in network namespaces).
    pub async fn start() -> anyhow::Result<Option<Self>> {
        Self::start_with(localkube::Options::default(), true).await
    }

    /// An environment from `opts`, the CRDs installed, the operator started when `operator`.
    pub async fn start_with(
        opts: localkube::Options,
        operator: bool,
    ) -> anyhow::Result<Option<Self>> {
        let Some(mut fx) = Self::start_without_crds(opts).await? else {
            return Ok(None);
        };
        install_crds(&fx.client).await?;
        enforce_restricted(&fx.client, NS).await?;
        fx.operator = operator.then(|| Operator::start(&fx.client));
        Ok(Some(fx))
    }

    /// An environment from `opts` only: no CRDs, no operator.
    pub async fn start_without_crds(opts: localkube::Options) -> anyhow::Result<Option<Self>> {
        if opts.kubelets && !is_root() {
            eprintln!(
                "skipped: needs root (localkube runs pods as processes in network namespaces)"
            );
            return Ok(None);
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let opts = localkube::Options {
            dir: opts
                .dir
                .or_else(|| std::env::var_os("E2E_LOCALKUBE_DIR").map(Into::into)),
            ..opts
        };
        let t0 = Instant::now();
        let env = localkube::Env::start(opts).await?;
        eprintln!(
            "MEASURE localkube start: {:.1}s",
            t0.elapsed().as_secs_f64()
        );
        let client = env.client();
        Ok(Some(Self {
            env,
            client,
            operator: None,
        }))
    }

    /// The fault injector (kill, pause, cut a pod's network, exec).
    pub fn faults(&self) -> anyhow::Result<localkube::Faults> {
        self.env.faults().context("this environment runs no pods")
    }

    /// The operator's metrics (Prometheus text).
    pub fn metrics(&self) -> String {
        self.operator
            .as_ref()
            .map(|o| o.metrics.encode())
            .unwrap_or_default()
    }

    /// Stops the operator, then the environment.
    pub async fn stop(self) {
        if let Some(o) = self.operator {
            o.stop().await;
        }
        self.env.stop().await;
    }
}

/// The Pod Security label that makes `ns` refuse every pod that does not meet the restricted
/// standard, as production clusters often do: every suite's clusters run under it.
pub const RESTRICTED_LABEL: (&str, &str) = ("pod-security.kubernetes.io/enforce", "restricted");

/// Labels namespace `ns` with [`RESTRICTED_LABEL`].
pub async fn enforce_restricted(client: &Client, ns: &str) -> anyhow::Result<()> {
    enforce_pod_security(client, ns, RESTRICTED_LABEL.1).await
}

/// Makes namespace `ns` enforce the Pod Security `level` (`restricted`, `baseline`, ...).
pub async fn enforce_pod_security(client: &Client, ns: &str, level: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let patch = serde_json::json!({"metadata": {"labels": {RESTRICTED_LABEL.0: level}}});
    Api::<Namespace>::all(client.clone())
        .patch(
            ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// Installs every CRD (server-side apply) and waits until they are Established and the
/// ValkeyCluster API is served.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let ssa = PatchParams::apply(valkey_api::labels::CRD_FIELD_MANAGER).force();
    for crd in valkey_api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &ssa, &Patch::Apply(&crd)).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let c = crds.get(&name).await?;
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "CRD {name} not Established after 60s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The resource handlers may lag Established briefly: wait until a list succeeds.
    let deadline = Instant::now() + Duration::from_secs(30);
    let vkc: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    while let Err(e) = vkc.list(&Default::default()).await {
        ensure!(
            Instant::now() < deadline,
            "ValkeyCluster API not served: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

pub async fn create_user_secret(client: &Client, name: &str, password: &str) -> anyhow::Result<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    let s: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"password": password}
    }))?;
    api.create(&PostParams::default(), &s).await?;
    Ok(())
}

pub async fn create_cluster(
    client: &Client,
    name: &str,
    shards: i32,
    replicas: i32,
) -> anyhow::Result<()> {
    create_cluster_with(client, name, shards, replicas, serde_json::json!({})).await
}

/// Creates a ValkeyCluster with user `app` (password in Secret `<name>-app`) and the extra
/// `spec` fields of `extra` (a JSON object) merged in.
pub async fn create_cluster_with(
    client: &Client,
    name: &str,
    shards: i32,
    replicas: i32,
    extra: serde_json::Value,
) -> anyhow::Result<()> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let mut spec = serde_json::json!({
        "shards": shards, "replicas": replicas,
        "users": [{
            "name": "app",
            "passwordSecret": {"name": format!("{name}-app"), "keys": ["password"]},
            "permissions": "+@all ~* &*"
        }]
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    let vc: ValkeyCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
        "metadata": {"name": name},
        "spec": spec
    }))?;
    api.create(&PostParams::default(), &vc).await?;
    Ok(())
}

/// [`create_ready_cluster_with`] with no extra `spec` fields.
pub async fn create_ready_cluster(
    client: &Client,
    name: &str,
    pw: &str,
    shards: i32,
    replicas: i32,
) -> anyhow::Result<ValkeyCluster> {
    create_ready_cluster_with(client, name, pw, shards, replicas, serde_json::json!({})).await
}

/// Creates the app user's Secret `<name>-app` with password `pw` and the cluster (see
/// [`create_cluster_with`]), then waits up to 5 minutes for its `shards` to be Ready.
pub async fn create_ready_cluster_with(
    client: &Client,
    name: &str,
    pw: &str,
    shards: i32,
    replicas: i32,
    extra: serde_json::Value,
) -> anyhow::Result<ValkeyCluster> {
    create_user_secret(client, &format!("{name}-app"), pw).await?;
    create_cluster_with(client, name, shards, replicas, extra).await?;
    wait_ready(client, name, shards, Duration::from_secs(300)).await
}

/// Pod name → (uid, server restart count) of cluster `name`.
pub async fn pod_identities(
    client: &Client,
    name: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, (String, i32)>> {
    Ok(pods_of(client, name)
        .await?
        .iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == "server"))
                .map_or(0, |c| c.restart_count);
            (
                p.metadata.name.clone().unwrap_or_default(),
                (p.metadata.uid.clone().unwrap_or_default(), restarts),
            )
        })
        .collect())
}

/// `GET /metrics` from the exporter on `ip:9121` (plain HTTP/1.0).
pub async fn scrape(ip: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::TcpStream::connect((ip, 9121)),
    )
    .await??;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut body)).await??;
    Ok(body)
}

/// Merge-patches `spec` into the ValkeyCluster `name` (a key set to `null` is removed).
pub async fn patch_spec(
    client: &Client,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<()> {
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "spec": spec })),
        )
        .await?;
    Ok(())
}

/// Polls the ValkeyCluster `name` every 250 ms until `done` holds for its current generation;
/// returns it.
pub async fn wait_cluster(
    client: &Client,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&ValkeyCluster) -> bool,
) -> anyhow::Result<ValkeyCluster> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + timeout;
    loop {
        let vc = api.get(name).await?;
        let current = vc
            .status
            .as_ref()
            .is_some_and(|s| s.observed_generation == vc.metadata.generation);
        if current && done(&vc) {
            return Ok(vc);
        }
        if Instant::now() > deadline {
            let s = vc.status.as_ref();
            bail!(
                "{name}: {what} not seen within {timeout:?}: state {:?} {:?} {:?}",
                s.map(|s| s.state),
                s.and_then(|s| s.reason.clone()),
                s.and_then(|s| s.message.clone())
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The ValkeyCluster's condition `type_` when it is True: (reason, message).
pub fn condition_true(vc: &ValkeyCluster, type_: &str) -> Option<(String, String)> {
    vc.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// Seconds since this test process first asked: one clock for every log line, so a writer's
/// gap can be matched with the status it happened in.
pub fn clock() -> f64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// Waits until the cluster is Ready with all shards ready; returns the ready object.
pub async fn wait_ready(
    client: &Client,
    name: &str,
    shards: i32,
    timeout: Duration,
) -> anyhow::Result<ValkeyCluster> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let vc = api.get(name).await?;
        if let Some(s) = &vc.status {
            let now = format!("{:?} {:?} {:?}", s.state, s.reason, s.message);
            if now != last {
                eprintln!("[{name} {:.1}s] {now}", clock());
                last = now;
            }
            let current = s.observed_generation == vc.metadata.generation;
            if current && s.state == ClusterState::Ready && s.ready_shards == shards {
                return Ok(vc);
            }
        }
        if Instant::now() > deadline {
            bail!("{name} not Ready after {timeout:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn secret_value(s: &Secret, key: &str) -> anyhow::Result<String> {
    let b = s
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("secret key {key}"))?;
    Ok(String::from_utf8(b.0.clone())?)
}

pub async fn pods_of(client: &Client, name: &str) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    Ok(api
        .list(&ListParams::default().labels(&format!("valkey.io/cluster={name}")))
        .await?
        .items)
}

pub fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref()?.pod_ip.clone()
}

/// Sends the command `args` (its name first, every argument a string) on `conn`; its reply.
pub async fn query_cmd<T: redis::FromRedisValue>(
    conn: &mut impl redis::aio::ConnectionLike,
    args: &[&str],
) -> anyhow::Result<T> {
    Ok(redis::cmd(args[0])
        .arg(&args[1..])
        .query_async(conn)
        .await?)
}

pub async fn node_conn(
    ip: &str,
    user: &str,
    pw: &str,
) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    node_conn_with(ip, user, pw, false).await
}

/// [`node_conn`] over TLS when `tls` (the certificate is not verified: tests dial pod IPs).
pub async fn node_conn_with(
    ip: &str,
    user: &str,
    pw: &str,
    tls: bool,
) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let url = if tls {
        format!("rediss://{user}:{pw}@{ip}:6379/#insecure")
    } else {
        format!("redis://{user}:{pw}@{ip}:6379")
    };
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Checks the live topology from every pod (as user `app`): cluster_state ok, all slots,
/// `shards` primaries each with `replicas` replicas.
pub async fn check_topology(
    client: &Client,
    name: &str,
    shards: usize,
    replicas: usize,
    pw: &str,
) -> anyhow::Result<()> {
    check_topology_as(client, name, shards, replicas, "app", pw, false).await
}

/// [`check_topology`] authenticating as `user`, over TLS when `tls`.
pub async fn check_topology_as(
    client: &Client,
    name: &str,
    shards: usize,
    replicas: usize,
    user: &str,
    pw: &str,
    tls: bool,
) -> anyhow::Result<()> {
    let pods = pods_of(client, name).await?;
    ensure!(
        pods.len() == shards * (1 + replicas),
        "pod count {}",
        pods.len()
    );
    for p in &pods {
        let ip = pod_ip(p).context("pod ip")?;
        let mut c = node_conn_with(&ip, user, pw, tls).await?;
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut c)
            .await?;
        ensure!(info.contains("cluster_state:ok"), "{ip}: {info}");
        ensure!(
            info.contains("cluster_slots_assigned:16384"),
            "{ip}: {info}"
        );
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut c)
            .await?;
        let lines: Vec<&str> = nodes.lines().filter(|l| !l.contains("fail")).collect();
        let primaries: Vec<&str> = lines
            .iter()
            .filter(|l| l.split(' ').nth(2).is_some_and(|f| f.contains("master")))
            .map(|l| l.split(' ').next().unwrap_or_default())
            .collect();
        ensure!(primaries.len() == shards, "{ip}: primaries {nodes}");
        for pid in primaries {
            let n = lines
                .iter()
                .filter(|l| l.split(' ').nth(3) == Some(pid))
                .count();
            ensure!(
                n == replicas,
                "{ip}: primary {pid} has {n} replicas\n{nodes}"
            );
        }
    }
    Ok(())
}

/// The TLS Secret `name` from the generated files.
pub async fn create_tls_secret(
    client: &Client,
    name: &str,
    tls: &valkey_testkit::TlsFiles,
) -> anyhow::Result<()> {
    let mut data = std::collections::BTreeMap::new();
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        data.insert(
            f.to_owned(),
            k8s_openapi::ByteString(std::fs::read(tls.path(f))?),
        );
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&kube::api::PostParams::default(), &secret)
        .await?;
    Ok(())
}

/// A cluster client builder for user `app`, seeded with every pod IP of cluster `name`.
pub async fn cluster_client_builder(
    client: &Client,
    name: &str,
    pw: &str,
) -> anyhow::Result<redis::cluster::ClusterClientBuilder> {
    // A TLS cluster is reached over TLS without verifying the certificate: the nodes
    // announce IPs, and the test certificates name the headless Service (the operator's own
    // connections verify them by that name).
    let tls = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .get(name)
        .await?
        .spec
        .tls_secret_name()
        .is_some();
    let scheme = if tls { "rediss" } else { "redis" };
    let seeds: Vec<String> = pods_of(client, name)
        .await?
        .iter()
        .filter_map(pod_ip)
        .map(|ip| format!("{scheme}://{ip}:6379"))
        .collect();
    let mut builder = redis::cluster::ClusterClient::builder(seeds)
        .username("app")
        .password(pw);
    if tls {
        builder = builder.tls(redis::TlsMode::Insecure);
    }
    Ok(builder)
}

pub async fn cluster_client(
    client: &Client,
    name: &str,
    pw: &str,
) -> anyhow::Result<redis::cluster_async::ClusterConnection> {
    let cc = cluster_client_builder(client, name, pw).await?.build()?;
    Ok(cc.get_async_connection().await?)
}

/// The writers' cluster client (seeded with the cluster's pod IPs, short retries, bounded
/// connection and response timeouts), not connected yet: a few quick retries (redirects, a
/// moved slot) instead of the library's 16 with exponential back-off up to minutes, so an
/// error reaches the writer (and its log) and a gap is the cluster's, not the client's
/// back-off.
async fn writer_cluster_client(
    client: &Client,
    name: &str,
    pw: &str,
) -> anyhow::Result<redis::cluster::ClusterClient> {
    Ok(cluster_client_builder(client, name, pw)
        .await?
        .retries(4)
        .min_retry_wait(20)
        .max_retry_wait(200)
        // A node cut off by a partition never answers: give up on it and retry elsewhere
        // (the `WAIT` of a pipeline can take up to its own 500 ms).
        .connection_timeout(Duration::from_millis(1000))
        .response_timeout(Duration::from_millis(1500))
        .build()?)
}

/// `SET <prefix>:<i> <i>` for every `i` of `range`, in order.
async fn set_range(
    conn: &mut redis::cluster_async::ClusterConnection,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    for i in range {
        let _: () = redis::cmd("SET")
            .arg(format!("{prefix}:{i}"))
            .arg(i)
            .query_async(conn)
            .await?;
    }
    Ok(())
}

/// `GET <prefix>:<i>`.
async fn get_indexed<T: redis::FromRedisValue>(
    conn: &mut redis::cluster_async::ClusterConnection,
    prefix: &str,
    i: usize,
) -> anyhow::Result<T> {
    Ok(redis::cmd("GET")
        .arg(format!("{prefix}:{i}"))
        .query_async(conn)
        .await?)
}

pub async fn write_read(
    conn: &mut redis::cluster_async::ClusterConnection,
    n: usize,
    prefix: &str,
) -> anyhow::Result<()> {
    set_range(conn, prefix, 0..n).await?;
    for i in 0..n {
        let v: usize = get_indexed(conn, prefix, i).await?;
        ensure!(v == i, "key {prefix}:{i} = {v}");
    }
    Ok(())
}

/// The operator's controllers running in-process until [`Operator::stop`].
pub struct Operator {
    /// The operator's metrics.
    pub metrics: Arc<valkey_operator::metrics::Metrics>,
    stop_tx: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    /// Starts both controllers against `client`. With `RUST_LOG` set, the operator's logs go
    /// to stderr as text (see [`valkey_operator::telemetry::lines_logged`] for the count).
    pub fn start(client: &Client) -> Self {
        // Always a subscriber, so the lines a cluster logs are counted; printed only with
        // RUST_LOG set.
        let text = valkey_operator::telemetry::LogFormat::Text;
        if std::env::var_os("RUST_LOG").is_some() {
            valkey_operator::telemetry::init(text);
        } else {
            valkey_operator::telemetry::init_to(text, std::io::sink);
        }
        let metrics = Arc::new(valkey_operator::metrics::Metrics::new());
        let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(valkey_operator::run_controllers(
            client.clone(),
            metrics.clone(),
            valkey_operator::Scope::All,
            async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            },
        ));
        Self {
            metrics,
            stop_tx,
            task,
        }
    }

    /// Kills the controllers at once, in the middle of whatever they do (a crashed operator).
    pub fn kill(self) {
        self.task.abort();
    }

    /// Stops the controllers (waits up to 10 s).
    pub async fn stop(self) {
        let _ = self.stop_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

// --- persistence helpers ---

/// Label selector of every object of cluster `name` carrying `valkey.io/cluster`.
pub fn cluster_lp(name: &str) -> ListParams {
    ListParams::default().labels(&format!("valkey.io/cluster={name}"))
}

/// The `_operator` password from the cluster's system Secret.
pub async fn system_operator_password(client: &Client, name: &str) -> anyhow::Result<String> {
    let system = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-system"))
        .await?;
    secret_value(&system, "operator-password")
}

/// Writes `n` keys `<prefix>:<i>` = `i`; every batch of 100 (and the last one) is acknowledged
/// by at least one replica of every primary (`WAIT 1 2000`).
pub async fn acked_writes(
    conn: &mut redis::cluster_async::ClusterConnection,
    n: usize,
    prefix: &str,
) -> anyhow::Result<()> {
    for start in (0..n).step_by(100) {
        let end = (start + 100).min(n);
        set_range(conn, prefix, start..end).await?;
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(2000)
            .query_async(conn)
            .await?;
        let last = end - 1;
        ensure!(acked >= 1, "WAIT 1 not acknowledged after {prefix}:{last}");
    }
    Ok(())
}

/// A continuous cluster-aware writer: `SET w:<i>` (keys spread over every slot), each
/// confirmed with `WAIT <replicas>` on the key's primary, until stopped.
pub struct Writer {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<anyhow::Result<(Vec<usize>, Duration)>>,
}

impl Writer {
    /// Starts writing to cluster `name` as user `app`; `replicas` is the `WAIT` count (0: a
    /// write is acknowledged by its primary's reply).
    pub fn start(client: &Client, name: &str, pw: &str, replicas: i64) -> Self {
        let (stop, rx) = tokio::sync::watch::channel(false);
        let (client, name, pw) = (client.clone(), name.to_owned(), pw.to_owned());
        let task = tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut last_ok = Instant::now();
            let mut max_gap = Duration::ZERO;
            let mut conn = None;
            let mut i = 0usize;
            // Why the writes since the last acknowledged one failed (the last reason).
            let mut why = String::new();
            while !*rx.borrow() {
                if conn.is_none() {
                    let connect = async {
                        let cc = writer_cluster_client(&client, &name, &pw).await?;
                        anyhow::Ok(cc.get_async_connection().await?)
                    };
                    match connect.await {
                        Ok(c) => conn = Some(c),
                        Err(e) => why = format!("connect: {e:#}"),
                    }
                }
                let Some(c) = conn.as_mut() else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let key = format!("w:{i}");
                // `WAIT` alone goes to every primary (the client takes the minimum); pipelined
                // after the `SET` it goes to the key's primary, which is what acknowledges it.
                let r: redis::RedisResult<i64> = if replicas == 0 {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(i)
                        .query_async::<()>(c)
                        .await
                        .map(|()| 0)
                } else {
                    redis::pipe()
                        .cmd("SET")
                        .arg(&key)
                        .arg(i)
                        .ignore()
                        .cmd("WAIT")
                        .arg(replicas)
                        .arg(500)
                        .query_async::<(i64,)>(c)
                        .await
                        .map(|(n,)| n)
                };
                match r {
                    Ok(n) if n >= replicas => {
                        let gap = last_ok.elapsed();
                        if gap > Duration::from_secs(1) {
                            eprintln!(
                                "[writer {name} {:.1}s] {:.1}s without an acknowledged write (last failure: {why:?})",
                                clock(),
                                gap.as_secs_f64()
                            );
                        }
                        acked.push(i);
                        max_gap = max_gap.max(gap);
                        last_ok = Instant::now();
                        why.clear();
                    }
                    Ok(n) => why = format!("{key}: WAIT {replicas} answered {n}"),
                    Err(e) => {
                        why = format!("{key}: {e}");
                        conn = None;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // A gap still open when stopped counts too.
            Ok((acked, max_gap.max(last_ok.elapsed())))
        });
        Self { stop, task }
    }

    /// Stops; returns the acknowledged indexes and the longest time between two acknowledged
    /// writes.
    pub async fn stop(self) -> anyhow::Result<(Vec<usize>, Duration)> {
        let _ = self.stop.send(true);
        self.task.await?
    }

    /// Stops and checks that every acknowledged write reads back; returns the count and the
    /// longest gap.
    pub async fn stop_and_check(
        self,
        client: &Client,
        name: &str,
        pw: &str,
        after: &str,
    ) -> anyhow::Result<(usize, Duration)> {
        let (acked, gap) = self.stop().await?;
        ensure!(
            !acked.is_empty(),
            "no write was acknowledged during {after}"
        );
        let mut conn = cluster_client(client, name, pw).await?;
        let mut lost = Vec::new();
        for i in &acked {
            let v: Option<usize> = redis::cmd("GET")
                .arg(format!("w:{i}"))
                .query_async(&mut conn)
                .await?;
            if v != Some(*i) {
                lost.push(format!("w:{i}={v:?}"));
            }
        }
        ensure!(
            lost.is_empty(),
            "{} of {} acknowledged writes lost during {after}, first: {:?}",
            lost.len(),
            acked.len(),
            &lost[..lost.len().min(10)]
        );
        Ok((acked.len(), gap))
    }
}

/// Slot counts of the primaries (highest first) and their replica counts, as `pod_ip`'s
/// `CLUSTER NODES` shows them (failed nodes ignored).
pub async fn slot_layout(ip: &str, user: &str, pw: &str) -> anyhow::Result<Vec<(usize, usize)>> {
    let mut c = node_conn(ip, user, pw).await?;
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut c)
        .await?;
    let nodes = valkey_ops::model::ClusterNodes::parse(&text)?;
    let mut out: Vec<(usize, usize)> = nodes
        .primaries()
        .filter(|n| !n.flags.failing())
        .map(|p| {
            let replicas = nodes
                .replicas_of(&p.id)
                .filter(|r| !r.flags.failing())
                .count();
            (p.slot_count(), replicas)
        })
        .collect();
    out.sort_by(|a, b| b.cmp(a));
    Ok(out)
}

/// Checks that every key written by [`acked_writes`] reads back; `after` names the event for
/// the error message.
pub async fn check_acked(
    conn: &mut redis::cluster_async::ClusterConnection,
    n: usize,
    prefix: &str,
    after: &str,
) -> anyhow::Result<()> {
    let mut lost = Vec::new();
    for i in 0..n {
        let v: Option<usize> = get_indexed(conn, prefix, i).await?;
        if v != Some(i) {
            lost.push(format!("{prefix}:{i}={v:?}"));
        }
    }
    ensure!(
        lost.is_empty(),
        "{} of {n} acknowledged keys lost after {after}, first: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    Ok(())
}

/// The PersistentVolumeClaims labelled with cluster `name`.
pub async fn pvcs_of(
    client: &Client,
    name: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::PersistentVolumeClaim>> {
    Ok(
        Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), NS)
            .list(&cluster_lp(name))
            .await?
            .items,
    )
}

/// The ValkeyNodes of cluster `name`.
pub async fn valkey_nodes_of(
    client: &Client,
    name: &str,
) -> anyhow::Result<Vec<valkey_api::ValkeyNode>> {
    Ok(
        Api::<valkey_api::ValkeyNode>::namespaced(client.clone(), NS)
            .list(&cluster_lp(name))
            .await?
            .items,
    )
}

/// The Valkey role (`master` / `slave`) a server reports in `INFO replication`.
pub async fn live_role(ip: &str, user: &str, pw: &str) -> anyhow::Result<String> {
    live_role_with(ip, user, pw, false).await
}

/// [`live_role`] over TLS when `tls`.
pub async fn live_role_with(ip: &str, user: &str, pw: &str, tls: bool) -> anyhow::Result<String> {
    let mut c = node_conn_with(ip, user, pw, tls).await?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await?;
    info.lines()
        .find_map(|l| l.strip_prefix("role:"))
        .map(|r| r.trim().to_owned())
        .with_context(|| format!("{ip}: no role in INFO replication"))
}

/// The pods of shard `shard` of cluster `name` as (pod name, pod IP, live role), the role from
/// each server's `INFO replication` as user `app` (`master` or `slave`), never from names.
pub async fn shard_roles(
    client: &Client,
    name: &str,
    shard: i32,
    pw: &str,
) -> anyhow::Result<Vec<(String, String, String)>> {
    shard_roles_with(client, name, shard, pw, false).await
}

/// [`shard_roles`] over TLS when `tls`.
pub async fn shard_roles_with(
    client: &Client,
    name: &str,
    shard: i32,
    pw: &str,
    tls: bool,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let prefix = format!("valkey-{name}-{shard}-");
    let mut out = Vec::new();
    for p in pods_of(client, name).await? {
        let pod = p.metadata.name.clone().unwrap_or_default();
        if pod.starts_with(&prefix) {
            let ip = pod_ip(&p).context("pod ip")?;
            let role = live_role_with(&ip, "app", pw, tls).await?;
            out.push((pod, ip, role));
        }
    }
    Ok(out)
}

/// Kinds and names of the objects of cluster `name` that still exist: its ValkeyNodes,
/// StatefulSets, Deployments and pods (by label), Service, ConfigMap, Secrets and
/// PodDisruptionBudgets (by label). Empty once all are gone. PersistentVolumeClaims are not
/// included (their fate depends on the reclaim policy).
pub async fn objects_left(client: &Client, name: &str) -> anyhow::Result<Vec<String>> {
    use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let lp = cluster_lp(name);
    let n = |kind: &str, m: &kube::api::ObjectMeta| {
        format!("{kind}/{}", m.name.clone().unwrap_or_default())
    };
    let mut left = Vec::new();
    for o in valkey_nodes_of(client, name).await? {
        left.push(n("ValkeyNode", &o.metadata));
    }
    for o in Api::<StatefulSet>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
    {
        left.push(n("StatefulSet", &o.metadata));
    }
    for o in Api::<Deployment>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
    {
        left.push(n("Deployment", &o.metadata));
    }
    for o in pods_of(client, name).await? {
        left.push(n("Pod", &o.metadata));
    }
    let svc = format!("valkey-{name}");
    if let Some(o) = Api::<Service>::namespaced(client.clone(), NS)
        .get_opt(&svc)
        .await?
    {
        left.push(n("Service", &o.metadata));
    }
    if let Some(o) = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get_opt(&format!("valkey-{name}-config"))
        .await?
    {
        left.push(n("ConfigMap", &o.metadata));
    }
    for s in ["system", "system-backup", "acl"] {
        if let Some(o) = Api::<Secret>::namespaced(client.clone(), NS)
            .get_opt(&format!("valkey-{name}-{s}"))
            .await?
        {
            left.push(n("Secret", &o.metadata));
        }
    }
    for o in Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
    {
        left.push(n("PodDisruptionBudget", &o.metadata));
    }
    Ok(left)
}

/// Waits until cluster `name` has recovered from a disruption that began at `since`: none of
/// the pods in `old_pod_uids` remains, the status is Ready with `shards` ready shards, and the
/// live topology seen by `_operator` from every pod has `shards` primaries with `replicas`
/// replicas each. Returns the time since `since`.
pub async fn wait_recovered(
    client: &Client,
    name: &str,
    shards: usize,
    replicas: usize,
    old_pod_uids: &[String],
    since: Instant,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let op_pw = system_operator_password(client, name).await?;
    let mut last = String::new();
    loop {
        let pods = pods_of(client, name).await?;
        let old_left = pods
            .iter()
            .filter(|p| {
                p.metadata
                    .uid
                    .as_ref()
                    .is_some_and(|u| old_pod_uids.contains(u))
            })
            .count();
        let s = api.get(name).await?.status.unwrap_or_default();
        let now = if old_left > 0 {
            format!("{old_left} old pods left; {:?} {:?}", s.state, s.message)
        } else if s.state != ClusterState::Ready || s.ready_shards != shards as i32 {
            format!("{:?} {:?} {:?}", s.state, s.reason, s.message)
        } else {
            match check_topology_as(client, name, shards, replicas, "_operator", &op_pw, false)
                .await
            {
                Ok(()) => return Ok(since.elapsed()),
                Err(e) => format!("Ready, live topology not yet: {e:#}"),
            }
        };
        if now != last {
            eprintln!("[{name} +{:.1}s] {now}", since.elapsed().as_secs_f64());
            last = now;
        }
        ensure!(
            since.elapsed() < timeout,
            "{name} not recovered after {timeout:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// --- failover helpers ---

/// Time until 200 keys spread over all slots can be written, probing every 200 ms with a
/// client that neither retries nor waits more than 500 ms (so the figure is not inflated by
/// client back-off).
pub async fn wait_writable(
    client: &Client,
    name: &str,
    pw: &str,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < timeout {
        let attempt = async {
            let cc = cluster_client_builder(client, name, pw)
                .await?
                .retries(0)
                .connection_timeout(Duration::from_millis(500))
                .response_timeout(Duration::from_millis(500))
                .build()?;
            let mut conn = cc.get_async_connection().await?;
            write_read(&mut conn, 200, "probe").await
        };
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Ok(())) => return Ok(started.elapsed()),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "probe timed out".into(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("slots not writable after {timeout:?}: {last}")
}

/// Whether a connection with `cfg` authenticates on every pod of cluster `name`, one entry per
/// pod: an authentication error is `false`; another error (a pod restarting) is retried, then
/// fails.
pub async fn authenticates(
    client: &Client,
    name: &str,
    cfg: &valkey_ops::client::ClientConfig,
) -> anyhow::Result<Vec<bool>> {
    use valkey_ops::client::{self, ClientError};
    let mut out = Vec::new();
    for p in pods_of(client, name).await? {
        let addr = format!("{}:6379", pod_ip(&p).context("pod IP")?);
        let mut tries = 0;
        let ok = loop {
            match client::connect(&addr, cfg).await {
                Ok(_) => break true,
                Err(ClientError::Auth { .. }) => break false,
                Err(e) if tries >= 10 => {
                    let statuses = p.status.as_ref().map(|s| &s.container_statuses);
                    return Err(anyhow::anyhow!(
                        "{e}; pod {}: {statuses:?}",
                        kube::ResourceExt::name_any(&p)
                    ));
                }
                Err(_) => tries += 1,
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        out.push(ok);
    }
    Ok(out)
}

/// Events `reason` of type `type_` (`Normal`, `Warning`) about the object `object`,
/// repetitions of one event (its series) counted.
pub async fn event_count(
    client: &Client,
    object: &str,
    reason: &str,
    type_: &str,
) -> anyhow::Result<usize> {
    Ok(
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NS)
            .list(&ListParams::default().fields(&format!(
                "involvedObject.name={object},reason={reason},type={type_}"
            )))
            .await?
            .items
            .iter()
            .map(|e| {
                let series = e.series.as_ref().and_then(|s| s.count);
                usize::try_from(series.or(e.count).unwrap_or(1)).unwrap_or(1)
            })
            .sum(),
    )
}
