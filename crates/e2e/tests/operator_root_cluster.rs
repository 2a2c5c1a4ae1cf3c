//! End-to-end: the operator (both controllers, in-process) on localkube with real Valkey pods.
//!
//! Needs root (localkube runs pods as processes in network namespaces). Scenarios: a 3×1
//! cluster reaches Ready with all its resources, makes no writes while idle and serves 10 000
//! keys through a cluster-aware client, then a 1×0 cluster reaches Ready (one environment);
//! killing a primary's server process makes its replica take over, the cluster returns to
//! Ready with the full replica count and acknowledged writes survive (a second environment).

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use support::*;
use valkey_api::status::ClusterState;
use valkey_api::{ValkeyCluster, ValkeyNode};

/// Versions of the ValkeyCluster and the objects its controller writes.
async fn owned_versions(client: &Client, name: &str) -> anyhow::Result<Vec<(String, String)>> {
    let rv =
        |k: String, m: &kube::api::ObjectMeta| (k, m.resource_version.clone().unwrap_or_default());
    let mut out = vec![rv(
        "vc".into(),
        &Api::<ValkeyCluster>::namespaced(client.clone(), NS)
            .get(name)
            .await?
            .metadata,
    )];
    out.push(rv(
        "svc".into(),
        &Api::<Service>::namespaced(client.clone(), NS)
            .get(&format!("valkey-{name}"))
            .await?
            .metadata,
    ));
    out.push(rv(
        "cm".into(),
        &Api::<ConfigMap>::namespaced(client.clone(), NS)
            .get(&format!("valkey-{name}-config"))
            .await?
            .metadata,
    ));
    for s in ["system", "system-backup", "acl"] {
        out.push(rv(
            s.into(),
            &Api::<Secret>::namespaced(client.clone(), NS)
                .get(&format!("valkey-{name}-{s}"))
                .await?
                .metadata,
        ));
    }
    out.push(rv(
        "pdb".into(),
        &Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
            .get(&format!("valkey-{name}"))
            .await?
            .metadata,
    ));
    for vn in Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("valkey.io/cluster={name}")))
        .await?
    {
        out.push((
            vn.metadata.name.clone().unwrap_or_default(),
            vn.metadata.generation.unwrap_or_default().to_string(),
        ));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_3x1_and_1x0_ready_and_serve() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();

    // 3 shards × 1 replica.
    let name = "demo";
    let pw = "app-password-1";
    create_user_secret(&client, &format!("{name}-app"), pw).await?;
    let started = Instant::now();
    create_cluster(&client, name, 3, 1).await?;
    let vc = wait_ready(&client, name, 3, Duration::from_secs(300)).await?;
    let took = started.elapsed();
    eprintln!("MEASURE 3x1 apply→Ready: {:.1}s", took.as_secs_f64());

    // Resources.
    Api::<Service>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}"))
        .await?;
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-config"))
        .await?;
    let system = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-system"))
        .await?;
    ensure!(!secret_value(&system, "operator-password")?.is_empty());
    Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-acl"))
        .await?;
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}"))
        .await?;
    let vns = Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("valkey.io/cluster={name}")))
        .await?;
    ensure!(vns.items.len() == 6, "ValkeyNodes: {}", vns.items.len());
    let status = vc.status.clone().context("status")?;
    ensure!(status.shards == 3 && status.shard_statuses.len() == 3);

    check_topology(&client, name, 3, 1, pw).await?;

    // An idle Ready cluster makes no writes: the ValkeyCluster (status) and every owned object
    // keep their resourceVersion (ValkeyNodes: their generation, since the node controller
    // writes their status) for 40 s, past a 30 s Ready requeue.
    let before = owned_versions(&client, name).await?;
    tokio::time::sleep(Duration::from_secs(40)).await;
    let after = owned_versions(&client, name).await?;
    ensure!(
        before == after,
        "idle cluster rewritten:\n{before:?}\n{after:?}"
    );

    let mut conn = cluster_client(&client, name, pw).await?;
    let t = Instant::now();
    write_read(&mut conn, 10_000, "k").await?;
    eprintln!("MEASURE 10000 SET+GET: {:.1}s", t.elapsed().as_secs_f64());

    // 1 × 0.
    create_user_secret(&client, "solo-app", pw).await?;
    let started = Instant::now();
    create_cluster(&client, "solo", 1, 0).await?;
    wait_ready(&client, "solo", 1, Duration::from_secs(180)).await?;
    eprintln!(
        "MEASURE 1x0 apply→Ready: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    check_topology(&client, "solo", 1, 0, pw).await?;
    let mut conn = cluster_client(&client, "solo", pw).await?;
    write_read(&mut conn, 1000, "solo").await?;

    // Scale out 1 → 2 shards: the new shard's primary gets half the slots (atomic migration),
    // the keys stay readable.
    let started = Instant::now();
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .patch(
            "solo",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"shards": 2}})),
        )
        .await?;
    let vc = wait_ready(&client, "solo", 2, Duration::from_secs(180)).await?;
    eprintln!(
        "MEASURE scale-out 1→2 shards: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let shards = vc.status.context("status")?.shard_statuses;
    ensure!(shards.iter().all(|s| !s.slots.is_empty()), "{shards:?}");
    check_topology(&client, "solo", 2, 0, pw).await?;
    let mut conn = cluster_client(&client, "solo", pw).await?;
    for i in 0..1000 {
        let v: Option<usize> = redis::cmd("GET")
            .arg(format!("solo:{i}"))
            .query_async(&mut conn)
            .await?;
        ensure!(v == Some(i), "solo:{i} = {v:?} after scale-out");
    }

    // A pod the scheduler cannot place: Degraded / PodUnschedulable with its message.
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let vc: ValkeyCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
        "metadata": {"name": "nowhere"},
        "spec": {"shards": 1, "scheduling": {"nodeSelector": {"example.com/no-such-node": "x"}}}
    }))?;
    api.create(&PostParams::default(), &vc).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = api.get("nowhere").await?.status.unwrap_or_default();
        if s.state == ClusterState::Degraded && s.reason.as_deref() == Some("PodUnschedulable") {
            let msg = s.message.unwrap_or_default();
            eprintln!("unschedulable: {msg}");
            ensure!(msg.contains("valkey-nowhere-0-0-0"), "{msg}");
            ensure!(msg.contains("node"), "{msg}");
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "not Degraded/PodUnschedulable: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // 10 shards × 1 replica (20 more pods beside the clusters above).
    create_user_secret(&client, "big-app", pw).await?;
    let started = Instant::now();
    create_cluster(&client, "big", 10, 1).await?;
    wait_ready(&client, "big", 10, Duration::from_secs(600)).await?;
    eprintln!(
        "MEASURE 10x1 apply→Ready: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    check_topology(&client, "big", 10, 1, pw).await?;

    let text = fx.metrics();
    ensure!(text.contains("valkey_operator_reconciles_total{controller=\"valkeycluster\"}"));
    fx.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_primary_kill_fails_over_and_keeps_data() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let name = "fo";
    let pw = "app-password-1";
    let vc = create_ready_cluster(&client, name, pw, 3, 1).await?;
    let status = vc.status.clone().context("status")?;
    // Acknowledged writes: each batch confirmed by one replica (WAIT 1).
    acked_writes(&mut cluster_client(&client, name, pw).await?, 2_000, "k").await?;

    // Kill the server process of shard 0's primary.
    let victim = status.shard_statuses[0]
        .primary_pod
        .clone()
        .context("primary of shard 0")?;
    let faults = fx.faults()?;
    let killed = Instant::now();
    faults.kill_container(NS, &victim, "server")?;
    eprintln!("killed server of {victim}");
    // Wait until every slot is writable again (a probe that neither retries nor waits).
    let writable = wait_writable(&client, name, pw, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE failover: all slots writable after {:.1}s",
        writable.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let vc = wait_ready(&client, name, 3, Duration::from_secs(180)).await?;
    eprintln!(
        "MEASURE failover: Ready with full replica count after {:.1}s",
        killed.elapsed().as_secs_f64()
    );
    let new_primary = vc
        .status
        .as_ref()
        .and_then(|s| s.shard_statuses[0].primary_pod.clone());
    eprintln!("shard 0 primary: {victim} → {new_primary:?}");
    check_topology(&client, name, 3, 1, pw).await?;
    ensure!(
        new_primary.as_deref() != Some(victim.as_str()),
        "no failover: the killed primary {victim} came back as primary"
    );
    check_acked(
        &mut cluster_client(&client, name, pw).await?,
        2_000,
        "k",
        "the primary kill",
    )
    .await?;

    fx.stop().await;
    Ok(())
}
