//! End-to-end scenarios of the operator on localkube with real Valkey pods, in one environment
//! (run one after another to keep CI time low). Needs root.
//!
//! 1. A 2 shards × 2 replicas cluster with `workloadType: Deployment` reaches Ready: two
//!    primaries with two replicas each (seen by `_operator` from every pod), one Deployment and
//!    no StatefulSet per ValkeyNode.
//! 2. Deleting the ValkeyCluster garbage-collects its ValkeyNodes, workloads, Service,
//!    ConfigMap, Secrets and PodDisruptionBudget within 60 s.
//! 3. On a 3 shards × 1 replica Deployment cluster, deleting a primary's pod (default grace)
//!    brings the cluster back to Ready with the full replica count; writes acknowledged with
//!    `WAIT 1` before are all readable.

mod support;

use std::time::{Duration, Instant};

use anyhow::ensure;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_deployment_2x2_gc_and_pod_delete() -> anyhow::Result<()> {
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

    // 2. Delete the ValkeyCluster: everything it owns is garbage-collected.
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

    // 3. A 3 shards × 1 replica Deployment cluster (3 primaries: a failover has a majority;
    // with 2 shards it has none and the operator does not take over, see the report):
    // acknowledged writes, then delete shard 0's primary pod with the default grace.
    let name = "del";
    create_user_secret(&client, &format!("{name}-app"), pw).await?;
    create_cluster_with(
        &client,
        name,
        3,
        1,
        serde_json::json!({"workloadType": "Deployment"}),
    )
    .await?;
    let vc = wait_ready(&client, name, 3, Duration::from_secs(300)).await?;
    let mut conn = cluster_client(&client, name, pw).await?;
    for i in 0..2_000 {
        let _: () = redis::cmd("SET")
            .arg(format!("k:{i}"))
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
    drop(conn);
    let victim = vc
        .status
        .and_then(|s| s.shard_statuses.first().and_then(|s| s.primary_pod.clone()))
        .ok_or_else(|| anyhow::anyhow!("no primary of shard 0"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let victim_uid = pods.get(&victim).await?.metadata.uid;
    let deleted = Instant::now();
    pods.delete(&victim, &DeleteParams::default()).await?;
    eprintln!("deleted pod {victim}");
    let vcs: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let mut last_err = String::new();
    let recovered = loop {
        ensure!(
            deleted.elapsed() < Duration::from_secs(240),
            "not recovered 240 s after deleting {victim}: {last_err}"
        );
        let gone = pods
            .get_opt(&victim)
            .await?
            .is_none_or(|p| p.metadata.uid != victim_uid);
        let status = vcs.get(name).await?.status.unwrap_or_default();
        let ready = status.state == valkey_api::status::ClusterState::Ready
            && status.ready_shards == 3
            && !status
                .shard_statuses
                .iter()
                .any(|sh| sh.primary_pod.as_deref() == Some(victim.as_str()));
        if gone && ready {
            match check_topology_as(
                &client,
                name,
                3,
                1,
                "_operator",
                &operator_password(&client, name).await?,
            )
            .await
            {
                Ok(()) => break deleted.elapsed(),
                Err(e) => last_err = e.to_string(),
            }
        } else {
            last_err = format!("gone={gone} {:?} {:?}", status.state, status.message);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "MEASURE pod delete → Ready (3x1 Deployment): {:.1}s",
        recovered.as_secs_f64()
    );
    let mut conn = cluster_client(&client, name, pw).await?;
    for i in 0..2_000 {
        let v: Option<usize> = redis::cmd("GET")
            .arg(format!("k:{i}"))
            .query_async(&mut conn)
            .await?;
        ensure!(
            v == Some(i),
            "acknowledged key k:{i} lost after deleting {victim}: {v:?}"
        );
    }
    drop(conn);

    operator.stop().await;
    env.stop().await;
    Ok(())
}
