//! End-to-end placement, sidecar and idleness scenarios of the operator on localkube (6 nodes
//! over 3 zones, real kube-scheduler, real Valkey pods). Needs root. One environment; the four
//! clusters are created at once and each is checked as soon as it settles:
//!
//! 1. `scheduling.node.spread.shard: Required` (3 shards × 1 replica): each shard's two pods run
//!    on different nodes, and the pods carry the required hostname anti-affinity term.
//! 2. An unsatisfiable node spread (1 shard × 6 replicas = 7 pods, shard spread Required, 6
//!    nodes): the six placed pods are on six distinct nodes, the seventh stays Pending and the
//!    cluster is `Degraded` with reason `PodUnschedulable`; `status.message` carries the
//!    scheduler's message for that pod.
//! 3. `scheduling.zone.spread.shard: Required` (1 shard × 2 replicas): the shard's three pods
//!    are in the three zones (`topology.kubernetes.io/zone` of their nodes).
//! 4. The `metrics-exporter` sidecar of every pod of cluster 1 answers
//!    `http://<podIP>:9121/metrics` with `redis_up 1` and INFO-derived metrics (connected
//!    clients, keyspace) — Valkey's `default` user is off, so it authenticated (as `_exporter`,
//!    its only credentials). A cluster with `exporter.enabled: false` and a busybox sidecar in
//!    `spec.containers` has exactly `server` + the sidecar, nothing listening on 9121, and the
//!    sidecar running, ready and writing its output.
//!    4b. Every query of the chart's Grafana dashboard finds its series, with the labels it
//!    filters on, in the metrics scraped from cluster 1's exporters and from the operator.
//! 5. Once the Ready clusters have settled (and the unsatisfiable one is deleted), watches on
//!    every kind the operator writes in the namespace see no ADDED/MODIFIED/DELETED for 60 s
//!    (Pods excluded: the kubelet writes their status). Positive control: a ConfigMap and an
//!    Event the test writes 5 s before the end of the window are both seen.
//! 6. A pod-template change on the zone-spread StatefulSet cluster rolls its three pods one at
//!    a time; it returns to Ready and the pods are still in three zones.
//! 7. The node-spread cluster (3 × 1, each shard's pods on two nodes) switches
//!    `podDisruptionBudget.mode` from `Cluster` to `Shard`: every pod stays covered by a budget
//!    throughout (the per-shard budgets exist before the cluster's one goes). Then a drain, as
//!    `kubectl drain` does it (every node cordoned, so an evicted pod's replacement waits):
//!    a replica of shard 0 and one of shard 1 (on different nodes) are evicted together;
//!    shard 0's other pod, its last copy, is refused (429). Once the nodes are uncordoned (the
//!    other zones first, so shard 0's evicted replica comes back in another zone) and the
//!    cluster is Ready again, back to `Cluster`.
//! 8. Zone awareness, on the same cluster: every server's `availability-zone` is the
//!    `topology.kubernetes.io/zone` of its pod's node, and the server of the replica that came
//!    back in another zone follows it.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Node, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use valkey_api::status::ClusterState;
use valkey_api::{ValkeyCluster, ValkeyNode};
use valkey_testkit::promql;

const PW: &str = "app-password-1";
const SHARD_LABEL: &str = "valkey.io/shard-index";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const HOSTNAME_KEY: &str = "kubernetes.io/hostname";

/// Cluster of scenarios 1 and 4: 3 × 1 with node shard spread Required, exporter on.
const NODE_SPREAD: &str = "nspread";
/// Cluster of scenario 2: 1 × 6 with node shard spread Required (7 pods, 6 nodes).
const UNSATISFIABLE: &str = "unsat";
/// Cluster of scenario 3: 1 × 2 with zone shard spread Required.
const ZONE_SPREAD: &str = "zspread";
/// Cluster of scenario 4: 1 × 0, exporter disabled, a busybox sidecar.
const SIDECAR: &str = "sidecar";
const SIDECAR_CONTAINER: &str = "ticker";

fn node_shard_required() -> serde_json::Value {
    serde_json::json!({"scheduling": {"node": {"spread": {"shard": {"mode": "Required"}}}}})
}

fn name_of(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn shard_of(p: &Pod) -> anyhow::Result<String> {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SHARD_LABEL))
        .cloned()
        .with_context(|| format!("pod {} has no {SHARD_LABEL} label", name_of(p)))
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.node_name.clone()
}

/// Pods of a cluster grouped by shard index.
fn by_shard(pods: &[Pod]) -> anyhow::Result<BTreeMap<String, Vec<&Pod>>> {
    let mut out: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in pods {
        out.entry(shard_of(p)?).or_default().push(p);
    }
    Ok(out)
}

/// `node name → zone` of every node.
async fn node_zones(client: &Client) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for n in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
    {
        let zone = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL))
            .cloned()
            .with_context(|| format!("node {:?} has no zone label", n.metadata.name))?;
        out.insert(n.metadata.name.unwrap_or_default(), zone);
    }
    Ok(out)
}

/// `GET http://{ip}:{port}{path}` over a plain TCP stream (HTTP/1.0: the server closes).
/// Returns the status code and the body.
async fn http_get(ip: &str, port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect((ip, port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}:{port}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        anyhow::Ok(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(10), io)
        .await
        .with_context(|| format!("GET {ip}:{port}{path} timed out"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP header in {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("bad status line {head:?}"))?;
    Ok((code, body.to_owned()))
}

/// Value of the un-labelled or exactly-labelled sample `series` (e.g. `redis_up` or
/// `redis_db_keys{db="db0"}`) in a Prometheus text exposition.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// Waits until the cluster is Degraded with reason PodUnschedulable; returns its status.
async fn wait_unschedulable(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<valkey_api::ValkeyClusterStatus> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let s = api.get(name).await?.status.unwrap_or_default();
        let now = format!("{:?} {:?} {:?}", s.state, s.reason, s.message);
        if now != last {
            eprintln!("[{name}] {now}");
            last = now;
        }
        if s.state == ClusterState::Degraded && s.reason.as_deref() == Some("PodUnschedulable") {
            return Ok(s);
        }
        ensure!(
            Instant::now() < deadline,
            "{name} not Degraded/PodUnschedulable after {timeout:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Scenario 1 (and the exporter half of 4): node shard spread Required on a 3 × 1 cluster.
async fn node_spread_and_exporter(client: &Client, t0: Instant) -> anyhow::Result<()> {
    let name = NODE_SPREAD;
    measure_ready(client, name, 3, 1, "node.spread.shard Required", t0).await?;
    check_topology(client, name, 3, 1, PW).await?;
    let pods = pods_of(client, name).await?;
    ensure!(pods.len() == 6, "{name}: {} pods", pods.len());
    for (shard, members) in by_shard(&pods)? {
        let nodes: Vec<Option<String>> = members.iter().map(|p| node_of(p)).collect();
        eprintln!("{name} shard {shard}: nodes {nodes:?}");
        ensure!(members.len() == 2, "{name} shard {shard}: {nodes:?}");
        let distinct: BTreeSet<&Option<String>> = nodes.iter().collect();
        ensure!(
            nodes.iter().all(Option::is_some) && distinct.len() == nodes.len(),
            "{name} shard {shard}: pods share a node despite node.spread.shard Required: {nodes:?}"
        );
        // The rule that put them there: a required hostname anti-affinity over the shard.
        for p in &members {
            let terms = p
                .spec
                .as_ref()
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .clone()
                })
                .unwrap_or_default();
            ensure!(
                terms.iter().any(|t| t.topology_key == HOSTNAME_KEY
                    && t.label_selector
                        .as_ref()
                        .and_then(|s| s.match_labels.as_ref())
                        .and_then(|l| l.get(SHARD_LABEL))
                        == Some(&shard)),
                "{}: no required hostname anti-affinity on shard {shard}: {terms:?}",
                name_of(p)
            );
        }
    }

    // Scenario 4: the exporter of every pod, after keys were written to every primary.
    let mut conn = cluster_client(client, name, PW).await?;
    write_read(&mut conn, 300, "exp").await?;
    drop(conn);
    for p in &pods {
        let pod = name_of(p);
        let ip = pod_ip(p).context("pod ip")?;
        let exporter = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "metrics-exporter"))
            .with_context(|| format!("{pod}: no metrics-exporter container"))?;
        let user = exporter
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "REDIS_USER")
            .and_then(|e| e.value.clone());
        ensure!(
            user.as_deref() == Some("_exporter"),
            "{pod}: exporter REDIS_USER {user:?}"
        );
        // Replicas receive the keys asynchronously: retry briefly.
        let deadline = Instant::now() + Duration::from_secs(20);
        let scraped = Instant::now();
        loop {
            let (code, body) = http_get(&ip, 9121, "/metrics").await?;
            let up = sample(&body, "redis_up");
            let clients = sample(&body, "redis_connected_clients");
            let keys = sample(&body, "redis_db_keys{db=\"db0\"}");
            if code == 200 && up == Some(1.0) && clients.is_some() && keys.is_some_and(|k| k > 0.0)
            {
                eprintln!(
                    "{pod} {ip}:9121/metrics: redis_up 1, redis_connected_clients {}, \
                     redis_db_keys{{db=\"db0\"}} {} ({} bytes, {:.0} ms)",
                    clients.unwrap_or_default(),
                    keys.unwrap_or_default(),
                    body.len(),
                    scraped.elapsed().as_secs_f64() * 1000.0
                );
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{pod} {ip}:9121/metrics: HTTP {code}, redis_up {up:?}, \
                 redis_connected_clients {clients:?}, redis_db_keys db0 {keys:?}\n{}",
                body.lines()
                    .filter(|l| l.starts_with("redis_up")
                        || l.starts_with("redis_exporter_last_scrape_error"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

/// Scenario 4b: every query of the chart's Grafana dashboard (panels and variables), for
/// cluster 1, names series that exist with the labels it filters on: the exporter metrics of
/// every pod (with the target labels the chart's PodMonitor gives them, from the pods' real
/// labels) and the operator's own metrics, as scraped now.
async fn dashboard_queries_find_their_series(
    client: &Client,
    operator_metrics: &str,
) -> anyhow::Result<()> {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let chart = repo.join("deploy/helm/valkey-operator");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        chart.join("dashboards/valkey-cluster.json"),
    )?)?;
    let relabelings = promql::pod_label_relabelings(&std::fs::read_to_string(
        chart.join("templates/podmonitor.yaml"),
    )?);
    let mut samples = promql::Samples::new();
    promql::parse_exposition(operator_metrics, &mut samples);
    for p in pods_of(client, NODE_SPREAD).await? {
        let ip = pod_ip(&p).context("pod ip")?;
        let (code, body) = http_get(&ip, 9121, "/metrics").await?;
        ensure!(code == 200, "{}: /metrics HTTP {code}", name_of(&p));
        let mut pod = promql::Samples::new();
        promql::parse_exposition(&body, &mut pod);
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let target = promql::pod_target_labels(NS, &name_of(&p), &labels, &relabelings);
        promql::with_target_labels(&mut pod, &target);
        promql::merge(&mut samples, pod);
    }
    let vars = BTreeMap::from([
        ("namespace".to_owned(), NS.to_owned()),
        ("cluster".to_owned(), NODE_SPREAD.to_owned()),
    ]);
    let queries = promql::dashboard_queries(&dashboard);
    let mut failed = Vec::new();
    for (place, expr) in &queries {
        if let Err(e) = promql::check_query(&promql::substitute(expr, &vars), &samples) {
            failed.push(format!("{place}: {e}"));
        }
    }
    ensure!(
        failed.is_empty(),
        "dashboard queries without series: {failed:#?}"
    );
    eprintln!(
        "dashboard: {} queries, all with series scraped from {NODE_SPREAD}'s pods and the operator",
        queries.len()
    );
    Ok(())
}

/// Scenario 2: 7 pods with node shard spread Required on 6 nodes.
async fn unsatisfiable_spread(client: &Client, t0: Instant) -> anyhow::Result<()> {
    let name = UNSATISFIABLE;
    let status = wait_unschedulable(client, name, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE {name} (1x6, node.spread.shard Required) apply→Degraded/PodUnschedulable: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let message = status.message.clone().unwrap_or_default();
    eprintln!("{name} status.message: {message}");
    let pods = pods_of(client, name).await?;
    ensure!(pods.len() == 7, "{name}: {} pods", pods.len());
    let (placed, pending): (Vec<&Pod>, Vec<&Pod>) = pods.iter().partition(|p| node_of(p).is_some());
    let nodes: BTreeSet<String> = placed.iter().filter_map(|p| node_of(p)).collect();
    ensure!(
        placed.len() == 6 && nodes.len() == 6,
        "{name}: the placed pods are not on 6 distinct nodes: {:?}",
        placed
            .iter()
            .map(|p| (name_of(p), node_of(p)))
            .collect::<Vec<_>>()
    );
    ensure!(pending.len() == 1, "{name}: {} pending pods", pending.len());
    let stuck = pending[0];
    let cond = stuck
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .with_context(|| format!("{}: no PodScheduled condition", name_of(stuck)))?;
    ensure!(
        cond.status == "False" && cond.reason.as_deref() == Some("Unschedulable"),
        "{}: {cond:?}",
        name_of(stuck)
    );
    let scheduler_msg = cond.message.clone().unwrap_or_default();
    eprintln!("{} PodScheduled: {scheduler_msg}", name_of(stuck));
    ensure!(
        scheduler_msg.contains("anti-affinity"),
        "scheduler message: {scheduler_msg}"
    );
    // The status carries the pod name and the scheduler's own words.
    ensure!(
        message.contains(&name_of(stuck)) && message.contains(&scheduler_msg),
        "status.message lacks the pod name {} or the scheduler's message {scheduler_msg:?}: \
         {message}",
        name_of(stuck)
    );
    ensure!(
        message.contains("0/6 nodes are available"),
        "status.message: {message}"
    );
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .context("no Degraded condition")?;
    ensure!(
        degraded.status == "True" && degraded.reason == "PodUnschedulable",
        "{degraded:?}"
    );
    // Delete it now, while the other clusters are checked: its Pending pod keeps the scheduler
    // writing FailedScheduling events, which would be counted in the idle minute.
    let deleted = Instant::now();
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await?;
    wait_cluster_gone(client, name, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE {name} delete → every object it owned gone: {:.1}s",
        deleted.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Scenario 3: zone shard spread Required on a shard of three pods.
async fn zone_spread(client: &Client, t0: Instant) -> anyhow::Result<()> {
    let name = ZONE_SPREAD;
    measure_ready(client, name, 1, 2, "zone.spread.shard Required", t0).await?;
    check_zones(client, name).await
}

/// The zone shard spread of cluster `ZONE_SPREAD`: healthy topology, its three pods in three
/// zones, each carrying the zone constraint.
async fn check_zones(client: &Client, name: &str) -> anyhow::Result<()> {
    check_topology(client, name, 1, 2, PW).await?;
    let zones = node_zones(client).await?;
    let pods = pods_of(client, name).await?;
    ensure!(pods.len() == 3, "{name}: {} pods", pods.len());
    let placement: Vec<(String, String, String)> = pods
        .iter()
        .map(|p| {
            let node = node_of(p).unwrap_or_default();
            let zone = zones.get(&node).cloned().unwrap_or_default();
            (name_of(p), node, zone)
        })
        .collect();
    eprintln!("{name} placement: {placement:?}");
    let distinct: BTreeSet<&String> = placement.iter().map(|(_, _, z)| z).collect();
    ensure!(
        distinct.len() == 3 && !distinct.contains(&String::new()),
        "{name}: the shard's 3 pods are not in 3 zones: {placement:?}"
    );
    for p in &pods {
        let tscs = p
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.clone())
            .unwrap_or_default();
        ensure!(
            tscs.iter().any(|c| c.topology_key == ZONE_LABEL
                && c.when_unsatisfiable == "DoNotSchedule"
                && c.max_skew == 1),
            "{}: no zone DoNotSchedule constraint: {tscs:?}",
            name_of(p)
        );
    }
    Ok(())
}

/// Scenario 6: a pod-template change (resources) on the zone-spread cluster.
async fn rolling_update_keeps_zone_spread(client: &Client) -> anyhow::Result<()> {
    let name = ZONE_SPREAD;
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    let before: BTreeSet<String> = pods_of(client, name).await?.iter().map(uid).collect();
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"cpu": "10m"}}}});
    let started = Instant::now();
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    loop {
        let pods = pods_of(client, name).await?;
        let replaced = pods.len() == 3 && pods.iter().all(|p| !before.contains(&uid(p)));
        let ready = api
            .get(name)
            .await?
            .status
            .is_some_and(|s| s.state == ClusterState::Ready && s.ready_shards == 1);
        if replaced && ready {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(240),
            "{name}: rolling update not done after 240 s (replaced {replaced}, ready {ready})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "MEASURE {name} rolling update of 3 pods (StatefulSet, 1x2): {:.1}s",
        started.elapsed().as_secs_f64()
    );
    check_zones(client, name).await
}

/// The PodDisruptionBudgets of cluster `name` (by its label).
async fn budgets_of(client: &Client, name: &str) -> anyhow::Result<Vec<PodDisruptionBudget>> {
    Ok(Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .list(&cluster_lp(name))
        .await?
        .items)
}

/// Pods of `pods` that no budget of `pdbs` selects.
fn uncovered(pods: &[Pod], pdbs: &[PodDisruptionBudget]) -> Vec<String> {
    pods.iter()
        .filter(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            !pdbs.iter().any(|b| {
                b.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref()?.match_labels.as_ref())
                    .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
            })
        })
        .map(name_of)
        .collect()
}

/// Switches `podDisruptionBudget.mode` of the node-spread cluster to `mode`, checking every
/// 50 ms that each pod is covered, until its budgets are exactly `want` and each allows one
/// disruption (the disruption controller counted the healthy pods).
async fn switch_budgets(client: &Client, mode: &str, want: &[String]) -> anyhow::Result<()> {
    let name = NODE_SPREAD;
    let patch = serde_json::json!({"spec": {"podDisruptionBudget": {"mode": mode}}});
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let started = Instant::now();
    loop {
        let (pods, pdbs) = (
            pods_of(client, name).await?,
            budgets_of(client, name).await?,
        );
        let bare = uncovered(&pods, &pdbs);
        ensure!(
            bare.is_empty(),
            "switching to {mode}: pods without a budget {:.2}s in: {bare:?}",
            started.elapsed().as_secs_f64()
        );
        let names: BTreeSet<String> = pdbs.iter().map(kube::ResourceExt::name_any).collect();
        let settled = names == want.iter().cloned().collect()
            && pdbs.iter().all(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.disruptions_allowed == Some(1))
            });
        if settled {
            eprintln!(
                "MEASURE {name} budgets switched to {mode} in {:.1}s, every pod covered throughout",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "switching to {mode}: budgets {names:?} after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Scenario 7: per-shard budgets let drains of different shards proceed together and refuse
/// the eviction of a shard's last copy.
async fn shard_budgets_allow_parallel_drains(
    client: &Client,
    bounded: &Client,
) -> anyhow::Result<()> {
    let name = NODE_SPREAD;
    let shard_budgets: Vec<String> = (0..3).map(|s| format!("valkey-{name}-shard-{s}")).collect();
    switch_budgets(client, "Shard", &shard_budgets).await?;
    let pods_api: Api<Pod> = Api::namespaced(bounded.clone(), NS);
    let replica_of = |roles: Vec<(String, String, String)>| {
        roles
            .into_iter()
            .find(|(_, _, role)| role == "slave")
            .map(|(pod, _, _)| pod)
    };
    let r0 =
        replica_of(shard_roles(client, name, 0, PW).await?).context("shard 0 has no replica")?;
    let r1 =
        replica_of(shard_roles(client, name, 1, PW).await?).context("shard 1 has no replica")?;
    let zones = node_zones(client).await?;
    let r0_pod = pods_api.get(&r0).await?;
    let r0_zone = node_of(&r0_pod).and_then(|n| zones.get(&n).cloned());
    cordon_all(client, true, |_| true).await?;
    let drained = drain_two_shards(client, &pods_api, &r0, &r1, &shard_budgets[0]).await;
    // Zones other than r0's first: its replacement starts in another zone.
    let other_zone = |n: &str| zones.get(n) != r0_zone.as_ref();
    cordon_all(client, false, other_zone).await?;
    let placed = wait_scheduled(&pods_api, &r0, r0_pod.metadata.uid.as_deref()).await;
    cordon_all(client, false, |_| true).await?;
    drained?;
    placed?;
    wait_ready(client, name, 3, Duration::from_secs(180)).await?;
    // 8. Every server's availability-zone is its node's zone, r0's replacement's included.
    let started = Instant::now();
    let moved = loop {
        let servers = zones_of_servers(client, name).await?;
        let pods = pods_of(client, name).await?;
        let wrong: Vec<String> = pods
            .iter()
            .filter(|p| {
                let node_zone = node_of(p).and_then(|n| zones.get(&n).cloned());
                node_zone.is_none() || servers.get(&name_of(p)) != node_zone.as_ref()
            })
            .map(name_of)
            .collect();
        if wrong.is_empty() {
            break servers.get(&r0).cloned();
        }
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "availability-zone differs from the node's zone on {wrong:?}: {servers:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(
        moved != r0_zone,
        "{r0} did not move out of {r0_zone:?}: the zone check proves less than it says"
    );
    eprintln!(
        "MEASURE {name} availability-zone matches every pod's node; {r0} moved {r0_zone:?} -> {moved:?}, its server followed within {:.1}s of Ready",
        started.elapsed().as_secs_f64()
    );
    switch_budgets(client, "Cluster", &[format!("valkey-{name}")]).await
}

/// Pod name → `CONFIG GET availability-zone` of its server (as `_operator`).
async fn zones_of_servers(client: &Client, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let pw = system_operator_password(client, name).await?;
    let mut out = BTreeMap::new();
    for p in pods_of(client, name).await? {
        let Some(ip) = pod_ip(&p) else { continue };
        let Ok(mut c) = node_conn(&ip, "_operator", &pw).await else {
            continue;
        };
        let v: Vec<String> = query_cmd(&mut c, &["CONFIG", "GET", "availability-zone"]).await?;
        if let Some(z) = v.get(1).filter(|z| !z.is_empty()) {
            out.insert(name_of(&p), z.clone());
        }
    }
    Ok(out)
}

/// Waits (up to 60 s) until pod `name`, another one than `old_uid`, is scheduled to a node.
async fn wait_scheduled(pods: &Api<Pod>, name: &str, old_uid: Option<&str>) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let pod = pods.get_opt(name).await?;
        let new = pod
            .as_ref()
            .filter(|p| p.metadata.uid.as_deref() != old_uid);
        if new.and_then(node_of).is_some() {
            return Ok(());
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "{name} not scheduled after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Marks the nodes `which` selects (by name) unschedulable (`kubectl cordon`) or schedulable
/// again.
async fn cordon_all(
    client: &Client,
    cordon: bool,
    which: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({"spec": {"unschedulable": cordon}});
    for n in nodes.list(&ListParams::default()).await? {
        let node = kube::ResourceExt::name_any(&n);
        if which(&node) {
            nodes
                .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    Ok(())
}

/// Evicts replicas `r0` (shard 0) and `r1` (shard 1) together, then shard 0's other pod,
/// which its budget `budget0` must refuse.
async fn drain_two_shards(
    client: &Client,
    pods_api: &Api<Pod>,
    r0: &str,
    r1: &str,
    budget0: &str,
) -> anyhow::Result<()> {
    let name = NODE_SPREAD;
    let node = |p: &str| {
        let pods_api = pods_api.clone();
        let p = p.to_owned();
        async move { anyhow::Ok(node_of(&pods_api.get(&p).await?)) }
    };
    let (n0, n1) = (node(r0).await?, node(r1).await?);
    let evict = |p: String| {
        let pods_api = pods_api.clone();
        async move { pods_api.evict(&p, &Default::default()).await }
    };
    // Two drains of different shards, together.
    let (e0, e1) = tokio::join!(evict(r0.to_owned()), evict(r1.to_owned()));
    e0.with_context(|| format!("evicting {r0} (shard 0, node {n0:?})"))?;
    e1.with_context(|| format!("evicting {r1} (shard 1, node {n1:?})"))?;
    eprintln!("[{name}] evicted {r0} ({n0:?}) and {r1} ({n1:?}) together");
    // Shard 0's other pod is its last copy now: refused.
    let last = pods_of(client, name)
        .await?
        .into_iter()
        .filter(|p| shard_of(p).is_ok_and(|s| s == "0") && name_of(p) != r0)
        .map(|p| name_of(&p))
        .next()
        .context("shard 0's other pod")?;
    let asked = Instant::now();
    match evict(last.clone()).await {
        Err(kube::Error::Api(s)) if s.code == 429 => eprintln!(
            "[{name}] evicting {last}, shard 0's last copy, refused ({:.1}s, 4 tries): {}",
            asked.elapsed().as_secs_f64(),
            s.message
        ),
        other => {
            let budget = Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
                .get(budget0)
                .await?;
            let pod = pods_api.get_opt(&last).await?;
            bail!(
                "evicting {last}, shard 0's last copy, was not refused: {other:?}\nits budget: {:?}\nthe pod: {:?}",
                budget.status,
                pod.and_then(|p| p.status).map(|s| s.conditions)
            )
        }
    }
    Ok(())
}

/// Scenario 4 (second half): exporter disabled, a busybox sidecar from `spec.containers`.
async fn sidecar_without_exporter(
    client: &Client,
    env_dir: &std::path::Path,
    t0: Instant,
) -> anyhow::Result<()> {
    let name = SIDECAR;
    measure_ready(client, name, 1, 0, "exporter disabled, busybox sidecar", t0).await?;
    check_topology(client, name, 1, 0, PW).await?;
    let pods = pods_of(client, name).await?;
    ensure!(pods.len() == 1, "{name}: {} pods", pods.len());
    let p = &pods[0];
    let pod = name_of(p);
    let spec = p.spec.as_ref().context("pod spec")?;
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    ensure!(
        names == ["server", SIDECAR_CONTAINER],
        "{pod}: containers {names:?} (want server + {SIDECAR_CONTAINER}, no metrics-exporter)"
    );
    let ports: Vec<i32> = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten().map(|p| p.container_port))
        .collect();
    ensure!(!ports.contains(&9121), "{pod}: ports {ports:?}");
    let ip = pod_ip(p).context("pod ip")?;
    match tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect((ip.as_str(), 9121)),
    )
    .await
    {
        Ok(Ok(_)) => bail!("{pod}: something listens on {ip}:9121 with the exporter disabled"),
        Ok(Err(e)) => eprintln!("{pod} {ip}:9121: {e} (exporter disabled)"),
        Err(_) => bail!("{pod}: connecting to {ip}:9121 timed out instead of being refused"),
    }
    // The server itself answers on 6379 (reachability of the pod IP).
    tokio::net::TcpStream::connect((ip.as_str(), 6379)).await?;

    let statuses = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default();
    let cs = statuses
        .iter()
        .find(|c| c.name == SIDECAR_CONTAINER)
        .with_context(|| format!("{pod}: no status of {SIDECAR_CONTAINER}: {statuses:?}"))?;
    ensure!(
        cs.ready && cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
        "{pod}: {SIDECAR_CONTAINER} not running/ready: {cs:?}"
    );
    ensure!(
        cs.restart_count == 0,
        "{pod}: {SIDECAR_CONTAINER} restarted: {cs:?}"
    );
    // Its loop runs: the container log (localkube: <dir>/kubelet/pods/<uid>/logs/<c>/0.log).
    let uid = p.metadata.uid.clone().context("pod uid")?;
    let log = env_dir
        .join("kubelet/pods")
        .join(uid)
        .join("logs")
        .join(SIDECAR_CONTAINER)
        .join("0.log");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let ticks = text.lines().filter(|l| l.contains("tick")).count();
        if ticks >= 2 {
            eprintln!(
                "{pod} {SIDECAR_CONTAINER}: {ticks} ticks in {}",
                log.display()
            );
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{pod} {SIDECAR_CONTAINER}: {ticks} ticks in {}: {text:?}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// Objects of kind `K` labelled with cluster `name`.
async fn labelled<K>(client: &Client, lp: &ListParams) -> anyhow::Result<usize>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Ok(Api::<K>::namespaced(client.clone(), NS)
        .list(lp)
        .await?
        .items
        .len())
}

/// Waits until every object labelled with cluster `name` (and its pods) is gone: the
/// garbage collector's deletions of its Secrets, Service, ConfigMap and PDB would otherwise
/// fall into the idle minute.
async fn wait_cluster_gone(client: &Client, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let lp = ListParams::default().labels(&format!("valkey.io/cluster={name}"));
    let deadline = Instant::now() + timeout;
    loop {
        let left = labelled::<ValkeyNode>(client, &lp).await?
            + labelled::<StatefulSet>(client, &lp).await?
            + labelled::<Pod>(client, &lp).await?
            + labelled::<Secret>(client, &lp).await?
            + labelled::<Service>(client, &lp).await?
            + labelled::<ConfigMap>(client, &lp).await?
            + labelled::<PodDisruptionBudget>(client, &lp).await?
            + Api::<ValkeyCluster>::namespaced(client.clone(), NS)
                .get_opt(name)
                .await?
                .map_or(0, |_| 1);
        if left == 0 {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{name}: {left} objects left after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One line describing a write seen by a watch: who wrote it (the newest managedFields entry)
/// and, for an Event, its reason, source and object.
fn describe(verb: &str, kind: &str, o: &DynamicObject) -> String {
    let name = o.metadata.name.clone().unwrap_or_default();
    let newest = o
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .max_by_key(|m| m.time.as_ref().map(|t| t.0))
        .map(|m| {
            format!(
                "manager={} op={} subresource={} at={}",
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
                m.subresource.clone().unwrap_or_default(),
                m.time.as_ref().map(|t| t.0.to_string()).unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let mut line = format!(
        "{verb} {kind}/{name} rv={} {newest}",
        o.metadata.resource_version.clone().unwrap_or_default()
    );
    if kind == "Event" {
        let s = |p: &str| o.data.pointer(p).map(|v| v.to_string()).unwrap_or_default();
        line.push_str(&format!(
            " reason={} type={} source={} reportingComponent={} involved={}/{} count={} message={}",
            s("/reason"),
            s("/type"),
            s("/source/component"),
            s("/reportingComponent"),
            s("/involvedObject/kind"),
            s("/involvedObject/name"),
            s("/count"),
            s("/message"),
        ));
    }
    line
}

/// Writes seen by [`count_writes`]: per kind, `(object name, description)`.
type Writes = BTreeMap<&'static str, Vec<(String, String)>>;

/// Watches every kind the operator writes in the namespace (from the current resourceVersion)
/// for `window`; returns the writes seen per kind. `during` runs once the watches are open
/// (the positive control).
async fn count_writes(
    client: &Client,
    window: Duration,
    during: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Writes> {
    let kinds: Vec<(&'static str, ApiResource)> = vec![
        ("ValkeyCluster", ApiResource::erase::<ValkeyCluster>(&())),
        ("ValkeyNode", ApiResource::erase::<ValkeyNode>(&())),
        ("StatefulSet", ApiResource::erase::<StatefulSet>(&())),
        ("Deployment", ApiResource::erase::<Deployment>(&())),
        ("Service", ApiResource::erase::<Service>(&())),
        ("ConfigMap", ApiResource::erase::<ConfigMap>(&())),
        ("Secret", ApiResource::erase::<Secret>(&())),
        (
            "PodDisruptionBudget",
            ApiResource::erase::<PodDisruptionBudget>(&()),
        ),
        (
            "PersistentVolumeClaim",
            ApiResource::erase::<PersistentVolumeClaim>(&()),
        ),
        ("Event", ApiResource::erase::<Event>(&())),
    ];
    let wp = WatchParams::default().timeout(window.as_secs() as u32 + 30);
    let mut watches = Vec::new();
    for (kind, ar) in kinds {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ar);
        let rv = api
            .list(&ListParams::default())
            .await?
            .metadata
            .resource_version
            .with_context(|| format!("{kind}: list without resourceVersion"))?;
        let stream = api.watch(&wp, &rv).await?.boxed();
        watches.push((kind, api, rv, stream));
    }
    let start = tokio::time::Instant::now();
    let deadline = start + window;
    let tasks = watches.into_iter().map(|(kind, api, mut rv, mut stream)| {
        let wp = wp.clone();
        async move {
            let mut writes = Vec::new();
            loop {
                let item = match tokio::time::timeout_at(deadline, stream.next()).await {
                    Err(_) => break,
                    Ok(None) => {
                        // The server ended the watch early: resume where it stopped.
                        stream = api.watch(&wp, &rv).await?.boxed();
                        continue;
                    }
                    Ok(Some(item)) => item?,
                };
                let (verb, o) = match item {
                    WatchEvent::Added(o) => ("ADDED", o),
                    WatchEvent::Modified(o) => ("MODIFIED", o),
                    WatchEvent::Deleted(o) => ("DELETED", o),
                    WatchEvent::Bookmark(b) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    WatchEvent::Error(e) => bail!("watch {kind}: {e:?}"),
                };
                rv = o.metadata.resource_version.clone().unwrap_or(rv);
                let line = describe(verb, kind, &o);
                eprintln!("IDLE WRITE +{:.1}s {line}", start.elapsed().as_secs_f64());
                writes.push((o.metadata.name.clone().unwrap_or_default(), line));
            }
            anyhow::Ok((kind, writes))
        }
    });
    let (seen, ()) = tokio::try_join!(futures::future::try_join_all(tasks), during)?;
    Ok(seen.into_iter().collect())
}

/// Name of the ConfigMap and Event the test itself writes near the end of the idle window.
const PROBE: &str = "placement-idle-probe";

/// The positive control of the idle window: 5 s before its end, writes a ConfigMap and an
/// Event nobody owns or watches for (both must be seen, proving the watches were live).
async fn probe_writes(client: &Client, at: Duration) -> anyhow::Result<()> {
    tokio::time::sleep(at).await;
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": PROBE}, "data": {"probe": "1"}
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &cm)
        .await?;
    let ev: Event = serde_json::from_value(serde_json::json!({
        "metadata": {"name": PROBE},
        "involvedObject": {"kind": "ConfigMap", "namespace": NS, "name": PROBE},
        "reason": "Probe", "message": "idle window positive control", "type": "Normal",
        "source": {"component": "e2e"}
    }))?;
    Api::<Event>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &ev)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_spread_exporter_sidecar_and_idle() -> anyhow::Result<()> {
    let test_start = Instant::now();
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();

    let clusters: [(&str, i32, i32, serde_json::Value); 4] = [
        (NODE_SPREAD, 3, 1, node_shard_required()),
        (UNSATISFIABLE, 1, 6, node_shard_required()),
        (
            ZONE_SPREAD,
            1,
            2,
            serde_json::json!({"scheduling": {"zone": {"spread": {"shard": {"mode": "Required"}}}}}),
        ),
        (
            SIDECAR,
            1,
            0,
            serde_json::json!({
                "exporter": {"enabled": false},
                "containers": [{
                    "name": SIDECAR_CONTAINER,
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 1; done"],
                    // The namespace enforces the restricted standard: a sidecar states it.
                    "securityContext": {"allowPrivilegeEscalation": false,
                                        "capabilities": {"drop": ["ALL"]}}
                }]
            }),
        ),
    ];
    let t0 = Instant::now();
    for (name, shards, replicas, extra) in clusters {
        create_user_secret(&client, &format!("{name}-app"), PW).await?;
        create_cluster_with(&client, name, shards, replicas, extra).await?;
    }

    // Each cluster is checked as soon as it settles; all four run concurrently.
    let (r1, r2, r3, r4) = tokio::join!(
        node_spread_and_exporter(&client, t0),
        unsatisfiable_spread(&client, t0),
        zone_spread(&client, t0),
        sidecar_without_exporter(&client, fx.env.dir(), t0),
    );
    eprintln!(
        "MEASURE all four clusters checked: {:.1}s after apply",
        t0.elapsed().as_secs_f64()
    );
    let mut failures = Vec::new();
    for (scenario, r) in [
        ("1 node spread + 4 exporter", r1),
        ("2 unsatisfiable spread", r2),
        ("3 zone spread", r3),
        ("4 no exporter + sidecar", r4),
    ] {
        if let Err(e) = r {
            eprintln!("FAILED scenario {scenario}: {e:#}");
            failures.push(format!("{scenario}: {e:#}"));
        }
    }
    ensure!(failures.is_empty(), "failed: {failures:#?}");

    // 4b. The Grafana dashboard against what this localkube really exports.
    dashboard_queries_find_their_series(&client, &fx.metrics()).await?;

    // 5. No writes by an idle operator (the unsatisfiable cluster is gone already).
    for name in [NODE_SPREAD, ZONE_SPREAD, SIDECAR] {
        let s = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
            .get(name)
            .await?
            .status
            .unwrap_or_default();
        ensure!(
            s.state == ClusterState::Ready,
            "{name} not Ready before the idle minute: {s:?}"
        );
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let window = Duration::from_secs(60);
    let mut writes = count_writes(
        &client,
        window,
        probe_writes(&client, window - Duration::from_secs(5)),
    )
    .await?;
    // The positive control: exactly the probe's own ConfigMap and Event, then drop them.
    for kind in ["ConfigMap", "Event"] {
        let w = writes.entry(kind).or_default();
        let probes = w.iter().filter(|(n, _)| n == PROBE).count();
        ensure!(
            probes == 1,
            "the {kind} watch saw {probes} writes of the probe {PROBE} (want 1): {w:?}"
        );
        w.retain(|(n, _)| n != PROBE);
    }
    let total: usize = writes.values().map(Vec::len).sum();
    for (kind, w) in &writes {
        eprintln!(
            "MEASURE idle {}s writes {kind}: {}",
            window.as_secs(),
            w.len()
        );
    }
    eprintln!(
        "MEASURE idle {}s writes total: {total} (besides the probe ConfigMap and Event, both seen)",
        window.as_secs()
    );
    ensure!(
        total == 0,
        "an idle operator wrote in {}s:\n{}",
        window.as_secs(),
        writes
            .values()
            .flatten()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );

    // 6. A rolling update of a StatefulSet cluster (zone spread 1×2): every pod is replaced one
    //    at a time, the cluster returns to Ready and the zone spread still holds.
    rolling_update_keeps_zone_spread(&client).await?;
    // 7. Per-shard disruption budgets on the node-spread cluster (after 6: the drain cordons
    //    every node).
    // Evictions through the operator's own client: kube's default one retries a refused
    // eviction (429) for about five minutes; this one gives up after three tries.
    let kubeconfig = kube::config::Kubeconfig::read_from(fx.env.kubeconfig_path())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let bounded = valkey_operator::api_client::client(config)?;
    shard_budgets_allow_parallel_drains(&client, &bounded).await?;

    let text = fx.metrics();
    ensure!(text.contains("valkey_operator_reconciles_total{controller=\"valkeycluster\"}"));
    fx.stop().await;
    eprintln!(
        "MEASURE test wall time: {:.1}s",
        test_start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Waits (up to 5 min) until cluster `name` (`shards` × `replicas`) is Ready and prints the
/// time since `t0` as `MEASURE <name> (<shards>x<replicas>, <what>) apply→Ready`.
async fn measure_ready(
    client: &Client,
    name: &str,
    shards: i32,
    replicas: i32,
    what: &str,
    t0: Instant,
) -> anyhow::Result<()> {
    wait_ready(client, name, shards, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE {name} ({shards}x{replicas}, {what}) apply→Ready: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
