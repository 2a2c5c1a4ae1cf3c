//! Elastic topology end to end on localkube with real Valkey pods (needs root). Six
//! clusters share one localkube and run concurrently, each under a continuous cluster-aware
//! writer (`SET` + `WAIT`); every acknowledged write must read back at the end, and the slot
//! counts, roles and replica links are checked exactly after every change.
//!
//! 1. `shards` 3 → 4 → 3 (Valkey 9, atomic slot migration): balanced 4096 × 4, then drained
//!    back to 5462/5461/5461 with the removed shard's ValkeyNodes gone. The operator is
//!    killed while the drain runs and a new one resumes it from the live view.
//! 2. `replicas` 1 → 2 → 1 → 0 on one shard, each time after a failover moved the primary to
//!    the highest node-index, so removing a node-index means handing its slots over first.
//! 3. `shards` 1 → 2 → 1 on a Valkey 8 image (key-by-key `MIGRATE`).
//! 4. `shards` 1 → 3 → 1 with one replica each (`WAIT 1`).
//! 5. `shards` 3 → 5 → 2 without replicas: three shards drained at once onto two.
//! 6. A drain that does not fit under `maxmemory` does not start (Degraded, `DrainFailed`),
//!    the cluster keeps serving; once `maxmemory` is raised it runs.

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use kube::Client;
use kube::api::Api;
use support::*;
use valkey_api::{ValkeyCluster, ValkeyNode};

/// Two shards of 8192 slots each, no replicas (a [`wait_layout`] target).
const TWO_EMPTY_SHARDS: [(usize, usize); 2] = [(8192, 0), (8192, 0)];

/// Waits until every pod's view shows exactly `want` (slot count, replica count) per primary
/// (highest first), with `pods` pods and `pods` ValkeyNodes.
async fn wait_layout(
    client: &Client,
    name: &str,
    want: &[(usize, usize)],
    timeout: Duration,
) -> anyhow::Result<()> {
    let pw = system_operator_password(client, name).await?;
    let pods_wanted = want.iter().map(|(_, r)| 1 + r).sum::<usize>();
    let deadline = Instant::now() + timeout;
    loop {
        let result: anyhow::Result<()> = async {
            let pods = pods_of(client, name).await?;
            let nodes = valkey_nodes_of(client, name).await?;
            ensure!(
                pods.len() == pods_wanted && nodes.len() == pods_wanted,
                "{} pods, {} ValkeyNodes",
                pods.len(),
                nodes.len()
            );
            for p in &pods {
                let ip = pod_ip(p).context("pod ip")?;
                let got = slot_layout(&ip, "_operator", &pw).await?;
                ensure!(got == want, "{ip}: {got:?}");
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                bail!("{name}: layout {want:?} not reached after {timeout:?}: {e}")
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The even layout of `shards` shards with `replicas` each, highest slot count first.
fn even(shards: usize, replicas: usize) -> Vec<(usize, usize)> {
    let (base, extra) = (16384 / shards, 16384 % shards);
    (0..shards)
        .map(|i| (base + usize::from(i < extra), replicas))
        .collect()
}

/// Creates `name` with `steps[0]` shards, loads keys, then under a writer moves through the
/// other shard counts, checking the exact even layout after each; every key reads back.
async fn scale_through(
    fx: &Fixture,
    name: &str,
    replicas: i32,
    steps: &[i32],
) -> anyhow::Result<()> {
    let client = &fx.client;
    let pw = format!("{name}-app-pw");
    create_ready_cluster(client, name, &pw, steps[0], replicas).await?;
    let mut conn = cluster_client(client, name, &pw).await?;
    if replicas > 0 {
        acked_writes(&mut conn, 2_000, "pre").await?;
    } else {
        write_read(&mut conn, 2_000, "pre").await?;
    }
    let writer = Writer::start(client, name, &pw, i64::from(replicas.min(1)));
    let mut path = steps[0].to_string();
    for shards in &steps[1..] {
        let t0 = Instant::now();
        patch_spec(client, name, serde_json::json!({"shards": shards})).await?;
        wait_ready(client, name, *shards, Duration::from_secs(300)).await?;
        let want = even(usize::try_from(*shards)?, usize::try_from(replicas)?);
        wait_layout(client, name, &want, Duration::from_secs(60)).await?;
        eprintln!(
            "MEASURE {name} {}→{shards} (2000 keys + writer): {:.1}s",
            path.rsplit('→').next().unwrap_or_default(),
            t0.elapsed().as_secs_f64()
        );
        path = format!("{path}→{shards}");
    }
    let (n, gap) = writer.stop_and_check(client, name, &pw, &path).await?;
    eprintln!(
        "MEASURE {name} {path}: {n} writes acknowledged, longest gap {:.2}s",
        gap.as_secs_f64()
    );
    let mut conn = cluster_client(client, name, &pw).await?;
    check_acked(&mut conn, 2_000, "pre", &path).await?;
    Ok(())
}

/// A 2 → 1 drain under a small `maxmemory`: held back with the missing amount in the status
/// and one `DrainFailed` event, nothing moved, still serving; after raising `maxmemory` it
/// completes with every key.
async fn drain_needs_room(fx: &Fixture) -> anyhow::Result<()> {
    let client = &fx.client;
    let (name, pw) = ("roomy", "roomy-app-pw");
    let extra = serde_json::json!({"config": {"maxmemory": "12mb"}});
    create_ready_cluster_with(client, name, pw, 2, 0, extra).await?;
    let mut conn = cluster_client(client, name, pw).await?;
    let value = "x".repeat(1000);
    for i in 0..12_000 {
        let _: () = redis::cmd("SET")
            .arg(format!("big:{i}"))
            .arg(&value)
            .query_async(&mut conn)
            .await?;
    }
    patch_spec(client, name, serde_json::json!({"shards": 1})).await?;
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(60);
    let degraded = loop {
        let status = api.get(name).await?.status.unwrap_or_default();
        if let Some(c) = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")
        {
            break c.clone();
        }
        ensure!(
            Instant::now() < deadline,
            "no Degraded condition: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("[{name}] held back: {}", degraded.message);
    ensure!(degraded.reason == "RebalanceFailed", "{degraded:?}");
    ensure!(
        degraded.message.contains("missing") && degraded.message.contains("maxmemory"),
        "{degraded:?}"
    );
    // Nothing moved, and it still serves.
    wait_layout(client, name, &TWO_EMPTY_SHARDS, Duration::from_secs(10)).await?;
    let _: () = query_cmd(&mut conn, &["SET", "still", "serving"]).await?;
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NS)
        .list(
            &kube::api::ListParams::default()
                .fields(&format!("involvedObject.name={name},reason=DrainFailed")),
        )
        .await?;
    ensure!(
        events.items.len() == 1,
        "DrainFailed events: {}",
        events.items.len()
    );

    patch_one_shard(
        client,
        name,
        serde_json::json!({"config": {"maxmemory": "64mb"}}),
        0,
    )
    .await?;
    let mut conn = cluster_client(client, name, pw).await?;
    for i in (0..12_000).step_by(7) {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("big:{i}"))
            .query_async(&mut conn)
            .await?;
        ensure!(
            v.as_deref() == Some(value.as_str()),
            "big:{i} lost in the drain"
        );
    }
    Ok(())
}

/// Moves shard 0's primary to its highest node-index with a coordinated failover.
async fn fail_over_to_highest(client: &Client, name: &str) -> anyhow::Result<()> {
    let pw = system_operator_password(client, name).await?;
    let pods = pods_of(client, name).await?;
    let highest = pods
        .iter()
        .max_by_key(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(valkey_api::labels::NODE_INDEX)?.parse::<i32>().ok())
        })
        .context("no pod")?;
    let ip = pod_ip(highest).context("ip")?;
    if live_role(&ip, "_operator", &pw).await? == "master" {
        return Ok(());
    }
    let mut c = node_conn(&ip, "_operator", &pw).await?;
    let _: () = query_cmd(&mut c, &["CLUSTER", "FAILOVER"]).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while live_role(&ip, "_operator", &pw).await? != "master" {
        ensure!(Instant::now() < deadline, "{ip} did not become primary");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

async fn shards_3_4_3(
    fx: &Fixture,
    operator: &tokio::sync::Mutex<Option<Operator>>,
) -> anyhow::Result<()> {
    let client = &fx.client;
    let (name, pw) = ("elastic", "elastic-app-pw");
    create_ready_cluster(client, name, pw, 3, 1).await?;
    let mut conn = cluster_client(client, name, pw).await?;
    acked_writes(&mut conn, 3_000, "pre").await?;
    let writer = Writer::start(client, name, pw, 1);

    let t0 = Instant::now();
    patch_spec(client, name, serde_json::json!({"shards": 4})).await?;
    wait_ready(client, name, 4, Duration::from_secs(300)).await?;
    wait_layout(client, name, &[(4096, 1); 4], Duration::from_secs(30)).await?;
    eprintln!(
        "MEASURE scale-out 3→4 (3000 keys + writer): {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let t0 = Instant::now();
    patch_spec(client, name, serde_json::json!({"shards": 3})).await?;
    // Kill the operator once the drain is under way (status.operation shows it; on a busy
    // machine an atomic migration can move every slot within the pass that starts it, so
    // waiting for slots_moved > 0 could miss the whole window); a new one resumes it.
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let op = api.get(name).await?.status.and_then(|s| s.operation);
        if op
            .as_ref()
            .is_some_and(|o| o.detail.as_deref().is_some_and(|d| d.contains("draining")))
        {
            eprintln!("killing the operator mid-drain: {op:?}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the drain never showed in status.operation"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    {
        let mut guard = operator.lock().await;
        if let Some(o) = guard.take() {
            o.kill();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        *guard = Some(Operator::start(client));
    }
    wait_ready(client, name, 3, Duration::from_secs(300)).await?;
    wait_layout(
        client,
        name,
        &[(5462, 1), (5461, 1), (5461, 1)],
        Duration::from_secs(60),
    )
    .await?;
    eprintln!(
        "MEASURE scale-in 4→3 with an operator restart: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let nodes = valkey_nodes_of(client, name).await?;
    ensure!(
        nodes.iter().all(|n: &ValkeyNode| n.spec.shard_index < 3),
        "a ValkeyNode of the removed shard is left"
    );
    let status = api.get(name).await?.status.unwrap_or_default();
    ensure!(
        status.operation.is_none(),
        "operation not cleared: {:?}",
        status.operation
    );
    let (n, gap) = writer.stop_and_check(client, name, pw, "3→4→3").await?;
    eprintln!(
        "MEASURE 3→4→3: {n} writes acknowledged, longest gap {:.2}s",
        gap.as_secs_f64()
    );
    let mut conn = cluster_client(client, name, pw).await?;
    check_acked(&mut conn, 3_000, "pre", "3→4→3").await?;
    Ok(())
}

/// Patches the `spec` of the one-shard cluster `name`, then waits until it is Ready again
/// (up to 5 min) with every slot on its shard of `replicas` replicas (up to 1 min).
async fn patch_one_shard(
    client: &Client,
    name: &str,
    spec: serde_json::Value,
    replicas: usize,
) -> anyhow::Result<()> {
    patch_spec(client, name, spec).await?;
    wait_ready(client, name, 1, Duration::from_secs(300)).await?;
    wait_layout(client, name, &[(16384, replicas)], Duration::from_secs(60)).await
}

async fn replicas_1_2_1_0(fx: &Fixture) -> anyhow::Result<()> {
    let client = &fx.client;
    let (name, pw) = ("replicas", "replicas-app-pw");
    create_ready_cluster(client, name, pw, 1, 1).await?;
    let writer = Writer::start(client, name, pw, 1);

    fail_over_to_highest(client, name).await?;
    patch_one_shard(client, name, serde_json::json!({"replicas": 2}), 2).await?;

    fail_over_to_highest(client, name).await?;
    patch_one_shard(client, name, serde_json::json!({"replicas": 1}), 1).await?;
    let (n, gap) = writer
        .stop_and_check(client, name, pw, "replicas 1→2→1")
        .await?;
    eprintln!(
        "MEASURE replicas 1→2→1: {n} writes acknowledged, longest gap {:.2}s",
        gap.as_secs_f64()
    );

    fail_over_to_highest(client, name).await?;
    let mut conn = cluster_client(client, name, pw).await?;
    acked_writes(&mut conn, 1_000, "r").await?;
    patch_one_shard(client, name, serde_json::json!({"replicas": 0}), 0).await?;
    let mut conn = cluster_client(client, name, pw).await?;
    check_acked(&mut conn, 1_000, "r", "replicas 1→0 after a failover").await?;
    Ok(())
}

async fn valkey8_shards_1_2_1(fx: &Fixture) -> anyhow::Result<()> {
    let client = &fx.client;
    let (name, pw) = ("v8", "v8-app-pw");
    let extra = serde_json::json!({"image": "valkey/valkey:8.0.1"});
    create_ready_cluster_with(client, name, pw, 1, 0, extra).await?;
    let mut conn = cluster_client(client, name, pw).await?;
    write_read(&mut conn, 5_000, "k8").await?;
    let writer = Writer::start(client, name, pw, 0);
    let t0 = Instant::now();
    patch_spec(client, name, serde_json::json!({"shards": 2})).await?;
    wait_ready(client, name, 2, Duration::from_secs(300)).await?;
    wait_layout(client, name, &TWO_EMPTY_SHARDS, Duration::from_secs(60)).await?;
    eprintln!(
        "MEASURE Valkey 8 scale-out 1→2 (5000 keys): {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    patch_one_shard(client, name, serde_json::json!({"shards": 1}), 0).await?;
    writer
        .stop_and_check(client, name, pw, "Valkey 8 1→2→1")
        .await?;
    let mut conn = cluster_client(client, name, pw).await?;
    check_acked(&mut conn, 5_000, "k8", "1→2→1 on Valkey 8").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 6)]
async fn operator_root_elastic_shards_and_replicas() -> anyhow::Result<()> {
    let Some(mut fx) = Fixture::start().await? else {
        return Ok(());
    };
    let operator = tokio::sync::Mutex::new(fx.operator.take());
    let (a, b, c, d, e, f) = tokio::join!(
        shards_3_4_3(&fx, &operator),
        replicas_1_2_1_0(&fx),
        valkey8_shards_1_2_1(&fx),
        scale_through(&fx, "three", 1, &[1, 3, 1]),
        scale_through(&fx, "five", 0, &[3, 5, 2]),
        drain_needs_room(&fx),
    );
    if let Some(o) = operator.into_inner() {
        o.stop().await;
    }
    fx.stop().await;
    a.context("shards 3→4→3")?;
    b.context("replicas 1→2→1→0")?;
    c.context("Valkey 8 shards 1→2→1")?;
    d.context("shards 1→3→1")?;
    e.context("shards 3→5→2")?;
    f.context("a drain without room")?;
    Ok(())
}
