//! End-to-end scenarios of the operator on localkube with real Valkey pods, in one environment
//! (run one after another to keep CI time low). Needs root.
//!
//! 1. A 2 shards × 2 replicas cluster with `workloadType: Deployment` reaches Ready: two
//!    primaries with two replicas each (seen by `_operator` from every pod), one Deployment and
//!    no StatefulSet per ValkeyNode.
//! 2. Killing the server process of shard 0's primary: one surviving primary of two is no
//!    majority, so Valkey cannot elect a replica; the operator takes over with the most
//!    caught-up replica. All slots are writable again, the cluster returns to Ready with the
//!    full replica count, and writes acknowledged with `WAIT 1` before are all readable.
//! 3. Deleting the pod of shard 1's primary (default grace): same outcome.
//! 4. Deleting the ValkeyCluster garbage-collects its ValkeyNodes, workloads, Service,
//!    ConfigMap, Secrets and PodDisruptionBudget within 60 s.

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use support::*;
use valkey_api::{ValkeyCluster, ValkeyNode};

fn cluster_selector(name: &str) -> ListParams {
    ListParams::default().labels(&format!("valkey.io/cluster={name}"))
}

/// Names of the objects of cluster `name` that still exist (empty once all are gone).
async fn remaining_objects(client: &Client, name: &str) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    let lp = cluster_selector(name);
    for vn in Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
    {
        left.push(format!(
            "ValkeyNode/{}",
            vn.metadata.name.unwrap_or_default()
        ));
    }
    for d in Api::<Deployment>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
    {
        left.push(format!(
            "Deployment/{}",
            d.metadata.name.unwrap_or_default()
        ));
    }
    for s in Api::<StatefulSet>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
    {
        left.push(format!(
            "StatefulSet/{}",
            s.metadata.name.unwrap_or_default()
        ));
    }
    let svc = format!("valkey-{name}");
    if Api::<Service>::namespaced(client.clone(), NS)
        .get_opt(&svc)
        .await?
        .is_some()
    {
        left.push(format!("Service/{svc}"));
    }
    let cm = format!("valkey-{name}-config");
    if Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get_opt(&cm)
        .await?
        .is_some()
    {
        left.push(format!("ConfigMap/{cm}"));
    }
    for s in ["system", "acl"] {
        let sec = format!("valkey-{name}-{s}");
        if Api::<Secret>::namespaced(client.clone(), NS)
            .get_opt(&sec)
            .await?
            .is_some()
        {
            left.push(format!("Secret/{sec}"));
        }
    }
    let pdb = format!("valkey-{name}");
    if Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .get_opt(&pdb)
        .await?
        .is_some()
    {
        left.push(format!("PodDisruptionBudget/{pdb}"));
    }
    Ok(left)
}

/// The `_operator` password from the cluster's system Secret.
async fn operator_password(client: &Client, name: &str) -> anyhow::Result<String> {
    let system = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-system"))
        .await?;
    secret_value(&system, "operator-password")
}

/// Writes `n` keys `<prefix>:<i>` through a cluster client, each batch of 100 acknowledged by
/// one replica (`WAIT 1`).
async fn acked_writes(
    client: &Client,
    name: &str,
    pw: &str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<()> {
    let mut conn = cluster_client(client, name, pw).await?;
    for i in 0..n {
        let _: () = redis::cmd("SET")
            .arg(format!("{prefix}:{i}"))
            .arg(i)
            .query_async(&mut conn)
            .await?;
        if i % 100 == 99 {
            let acked: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(2000)
                .query_async(&mut conn)
                .await?;
            ensure!(acked >= 1, "WAIT 1 not acknowledged");
        }
    }
    Ok(())
}

/// Every acknowledged key `<prefix>:<i>` is readable with its value.
async fn check_acked(
    client: &Client,
    name: &str,
    pw: &str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<()> {
    let mut conn = cluster_client(client, name, pw).await?;
    for i in 0..n {
        let v: Option<usize> = redis::cmd("GET")
            .arg(format!("{prefix}:{i}"))
            .query_async(&mut conn)
            .await?;
        ensure!(v == Some(i), "acknowledged key {prefix}:{i} lost: {v:?}");
    }
    Ok(())
}

/// The pod of shard `shard`'s primary, from the status (itself from the live view).
async fn primary_of(client: &Client, name: &str, shard: usize) -> anyhow::Result<String> {
    let vc = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .get(name)
        .await?;
    vc.status
        .and_then(|s| s.shard_statuses.get(shard)?.primary_pod.clone())
        .with_context(|| format!("no primary of shard {shard}"))
}

/// Time until 200 keys spread over all slots can be written, probing every 200 ms with a
/// client that neither retries nor waits more than 500 ms (so the figure is not inflated by
/// client back-off).
async fn wait_writable(
    client: &Client,
    name: &str,
    pw: &str,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < timeout {
        let attempt = async {
            let seeds: Vec<String> = pods_of(client, name)
                .await?
                .iter()
                .filter_map(pod_ip)
                .map(|ip| format!("redis://{ip}:6379"))
                .collect();
            let cc = redis::cluster::ClusterClient::builder(seeds)
                .username("app")
                .password(pw)
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

/// Waits (up to 240 s from `since`) until the victim pod is gone or replaced (when its uid is
/// given), the cluster is Ready with every shard ready, no shard's primary is the victim pod
/// unless it was only restarted, and the live topology has the full replica count.
async fn wait_recovered(
    client: &Client,
    name: &str,
    victim: &str,
    victim_uid: Option<String>,
    since: Instant,
) -> anyhow::Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let vcs: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let mut last_err = String::new();
    loop {
        ensure!(
            since.elapsed() < Duration::from_secs(240),
            "not recovered 240 s after losing {victim}: {last_err}"
        );
        let gone = match &victim_uid {
            Some(uid) => pods
                .get_opt(victim)
                .await?
                .is_none_or(|p| p.metadata.uid.as_ref() != Some(uid)),
            None => true,
        };
        let status = vcs.get(name).await?.status.unwrap_or_default();
        let ready = status.state == valkey_api::status::ClusterState::Ready
            && status.ready_shards == 2
            && !status
                .shard_statuses
                .iter()
                .any(|sh| sh.primary_pod.as_deref() == Some(victim));
        if gone && ready {
            match check_topology_as(
                client,
                name,
                2,
                2,
                "_operator",
                &operator_password(client, name).await?,
            )
            .await
            {
                Ok(()) => return Ok(since.elapsed()),
                Err(e) => last_err = e.to_string(),
            }
        } else {
            last_err = format!("gone={gone} {:?} {:?}", status.state, status.message);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_deployment_2x2_failovers_and_gc() -> anyhow::Result<()> {
    if !is_root() {
        eprintln!("skipped: needs root (localkube runs pods as processes in network namespaces)");
        return Ok(());
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = localkube::Env::start(localkube::Options::default()).await?;
    let client = env.client();
    install_crds(&client).await?;
    let operator = Operator::start(&client);

    // 1. 2 shards × 2 replicas, workloadType Deployment.
    let name = "dep";
    let pw = "app-password-1";
    create_user_secret(&client, &format!("{name}-app"), pw).await?;
    let started = Instant::now();
    create_cluster_with(
        &client,
        name,
        2,
        2,
        serde_json::json!({"workloadType": "Deployment"}),
    )
    .await?;
    wait_ready(&client, name, 2, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE 2x2 Deployment apply→Ready: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let system = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-system"))
        .await?;
    let op_pw = secret_value(&system, "operator-password")?;
    check_topology_as(&client, name, 2, 2, "_operator", &op_pw).await?;
    let vns = Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&cluster_selector(name))
        .await?;
    ensure!(vns.items.len() == 6, "ValkeyNodes: {}", vns.items.len());
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS)
        .list(&cluster_selector(name))
        .await?;
    ensure!(
        deployments.items.len() == 6,
        "Deployments: {}",
        deployments.items.len()
    );
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await?;
    ensure!(
        statefulsets.items.is_empty(),
        "StatefulSets exist: {:?}",
        statefulsets
            .items
            .iter()
            .map(|s| s.metadata.name.clone())
            .collect::<Vec<_>>()
    );

    // 2. Kill the server process of shard 0's primary. With two shards the surviving
    //    primaries are no majority, so no replica can win Valkey's election: the operator
    //    takes over with the most caught-up replica.
    acked_writes(&client, name, pw, "a", 2_000).await?;
    let victim = primary_of(&client, name, 0).await?;
    let faults = env.faults().context("faults")?;
    let killed = Instant::now();
    faults.kill_container(NS, &victim, "server")?;
    eprintln!("killed the server of {victim}");
    let writable = wait_writable(&client, name, pw, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE 2x2 primary kill → all slots writable: {:.1}s",
        writable.as_secs_f64()
    );
    let recovered = wait_recovered(&client, name, &victim, None, killed).await?;
    eprintln!(
        "MEASURE 2x2 primary kill → Ready with full replica count: {:.1}s",
        recovered.as_secs_f64()
    );
    check_acked(&client, name, pw, "a", 2_000).await?;

    // 3. Delete the pod of shard 1's primary (default grace): on SIGTERM the primary hands
    //    its slots to a replica; the Deployment's new pod becomes a replica.
    acked_writes(&client, name, pw, "b", 2_000).await?;
    let victim = primary_of(&client, name, 1).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let victim_uid = pods.get(&victim).await?.metadata.uid;
    let deleted = Instant::now();
    pods.delete(&victim, &DeleteParams::default()).await?;
    eprintln!("deleted pod {victim}");
    let writable = wait_writable(&client, name, pw, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE 2x2 primary pod delete → all slots writable: {:.1}s",
        writable.as_secs_f64()
    );
    let recovered = wait_recovered(&client, name, &victim, victim_uid, deleted).await?;
    eprintln!(
        "MEASURE 2x2 primary pod delete → Ready with full replica count: {:.1}s",
        recovered.as_secs_f64()
    );
    check_acked(&client, name, pw, "a", 2_000).await?;
    check_acked(&client, name, pw, "b", 2_000).await?;

    // 4. Delete the ValkeyCluster: everything it owns is garbage-collected.
    ensure!(remaining_objects(&client, name).await?.len() >= 6 + 6 + 5);
    let deleted = Instant::now();
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await?;
    let gone_after = loop {
        let left = remaining_objects(&client, name).await?;
        if left.is_empty() {
            break deleted.elapsed();
        }
        ensure!(
            deleted.elapsed() < Duration::from_secs(60),
            "60 s after deleting the ValkeyCluster, still present: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "MEASURE ValkeyCluster delete → owned objects gone: {:.1}s",
        gone_after.as_secs_f64()
    );
    // The user's own Secret is not owned by the cluster and stays.
    Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("{name}-app"))
        .await?;

    // Both controllers report their passes in the operator's metrics.
    let text = operator.metrics.encode();
    for c in ["valkeycluster", "valkeynode"] {
        ensure!(
            text.contains(&format!(
                "valkey_operator_reconciles_total{{controller=\"{c}\"}}"
            )),
            "no reconcile count for {c}: {text}"
        );
    }

    operator.stop().await;
    env.stop().await;
    Ok(())
}
