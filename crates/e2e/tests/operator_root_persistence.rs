//! End-to-end: persistence and deletion of ValkeyClusters on localkube with real Valkey pods,
//! in one environment (the clusters are created together; needs root).
//!
//! 1. Persistence: a 3 shards × 1 replica cluster with `persistence` (StorageClass `standard`,
//!    `reclaimPolicy: Delete`) reaches Ready with one Bound PersistentVolumeClaim per
//!    ValkeyNode, mounted by that node's pod and owned by nobody. After writes acknowledged
//!    with `WAIT 1`, every pod is deleted at once (the new pods get new IPs, so the nodes'
//!    `nodes.conf` addresses are stale); the cluster is Ready again with the full replica
//!    count, on the same claims, the primaries' last RDB loads hold every key, and every
//!    acknowledged key reads back.
//! 2. Retain vs Delete: two 1 × 1 clusters, one per reclaim policy, deleted together. With
//!    Delete the claims are removed with the ValkeyNodes; with Retain they stay (same uid, not
//!    terminating, no owner, still Bound) after the ValkeyNodes and pods are gone.
//! 3. StatefulSet delete: the StatefulSet of a primary of the persistent 3 × 1 cluster (found
//!    from the live `INFO replication` role and the ValkeyNode's `status.role`, never from
//!    names) is deleted; it is recreated, the cluster is Ready again with the full replica
//!    count and all acknowledged keys read back.
//! 4. Foreground deletion: deleting the persistent cluster with `propagationPolicy:
//!    Foreground` keeps the ValkeyCluster (finalizer `foregroundDeletion`) until everything it
//!    owns (ValkeyNodes, StatefulSets, pods, Service, ConfigMap, Secrets, PDB) is gone; then
//!    it is gone too, and its claims (reclaimPolicy Delete) are removed, within 120 s.
//!
//! Measured times are printed as `MEASURE …` lines. `RUST_LOG=info` prints the operator's logs;
//! `E2E_LOCALKUBE_DIR=<dir>` keeps the environment's state (pod logs under
//! `<dir>/kubelet/pods/<uid>/logs/`).

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, PropagationPolicy};
use support::*;
use valkey_api::ValkeyCluster;

const PW: &str = "app-password-1";
const KEYS: usize = 2_000;

fn uids(pods: &[Pod]) -> Vec<String> {
    pods.iter().filter_map(|p| p.metadata.uid.clone()).collect()
}

fn persistence(reclaim: &str) -> serde_json::Value {
    serde_json::json!({"persistence": {
        "size": "1Gi", "storageClassName": "standard", "reclaimPolicy": reclaim}})
}

/// One Bound claim of StorageClass `standard` per ValkeyNode of `name`, not owned by anything
/// and mounted by that node's pod. Returns the claims' uids.
async fn check_claims(client: &Client, name: &str, nodes: usize) -> anyhow::Result<Vec<String>> {
    let vns = valkey_nodes_of(client, name).await?;
    ensure!(vns.len() == nodes, "{name}: {} ValkeyNodes", vns.len());
    let claims = pvcs_of(client, name).await?;
    ensure!(
        claims.len() == nodes,
        "{name}: {} claims for {nodes} ValkeyNodes",
        claims.len()
    );
    let pods = pods_of(client, name).await?;
    let mut out = Vec::new();
    for vn in &vns {
        let (shard, node) = (vn.spec.shard_index, vn.spec.node_index);
        let at_position = |labels: &Option<std::collections::BTreeMap<String, String>>| {
            labels.as_ref().is_some_and(|l| {
                l.get("valkey.io/shard-index") == Some(&shard.to_string())
                    && l.get("valkey.io/node-index") == Some(&node.to_string())
            })
        };
        let mine: Vec<&PersistentVolumeClaim> = claims
            .iter()
            .filter(|c| at_position(&c.metadata.labels))
            .collect();
        ensure!(
            mine.len() == 1,
            "{name}: {} claims for shard {shard} node {node}",
            mine.len()
        );
        let c = mine[0];
        let cname = c.metadata.name.clone().unwrap_or_default();
        let phase = c.status.as_ref().and_then(|s| s.phase.clone());
        ensure!(
            phase.as_deref() == Some("Bound"),
            "{cname}: phase {phase:?}"
        );
        let class = c.spec.as_ref().and_then(|s| s.storage_class_name.clone());
        ensure!(
            class.as_deref() == Some("standard"),
            "{cname}: class {class:?}"
        );
        ensure!(
            c.metadata
                .owner_references
                .as_ref()
                .is_none_or(Vec::is_empty),
            "{cname} has owners: {:?}",
            c.metadata.owner_references
        );
        let pod = pods
            .iter()
            .find(|p| at_position(&p.metadata.labels))
            .with_context(|| format!("{name}: no pod for shard {shard} node {node}"))?;
        let mounted = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .is_some_and(|vs| {
                vs.iter().any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|p| p.claim_name == cname)
                })
            });
        ensure!(
            mounted,
            "pod {:?} does not mount {cname}",
            pod.metadata.name
        );
        out.push(c.metadata.uid.clone().unwrap_or_default());
    }
    Ok(out)
}

/// Scenario 2: deletes `keep` (Retain) and `drop` (Delete) together.
async fn retain_vs_delete(client: &Client, keep: &str, drop: &str) -> anyhow::Result<()> {
    let keep_claims = pvcs_of(client, keep).await?;
    let drop_claims = pvcs_of(client, drop).await?;
    ensure!(!keep_claims.is_empty() && !drop_claims.is_empty());
    // Only the Delete cluster's nodes carry the claim-cleanup finalizer.
    for vn in valkey_nodes_of(client, keep).await? {
        ensure!(
            !vn.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == "valkey.io/pvc-cleanup"),
            "Retain node with the cleanup finalizer"
        );
    }
    for vn in valkey_nodes_of(client, drop).await? {
        ensure!(
            vn.metadata
                .finalizers
                .unwrap_or_default()
                .iter()
                .any(|f| f == "valkey.io/pvc-cleanup"),
            "Delete node without the cleanup finalizer"
        );
    }
    let drop_volumes: Vec<String> = drop_claims
        .iter()
        .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
        .collect();
    let keep_uids: Vec<String> = keep_claims
        .iter()
        .filter_map(|c| c.metadata.uid.clone())
        .collect();
    let vcs: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let deleted = Instant::now();
    vcs.delete(keep, &DeleteParams::default()).await?;
    vcs.delete(drop, &DeleteParams::default()).await?;
    let (mut keep_gone, mut drop_gone) = (None, None);
    while keep_gone.is_none() || drop_gone.is_none() {
        ensure!(
            deleted.elapsed() < Duration::from_secs(120),
            "120 s after deleting: {keep}: {:?} claims {}; {drop}: {:?} claims {}",
            objects_left(client, keep).await?,
            pvcs_of(client, keep).await?.len(),
            objects_left(client, drop).await?,
            pvcs_of(client, drop).await?.len(),
        );
        if keep_gone.is_none() && objects_left(client, keep).await?.is_empty() {
            keep_gone = Some(deleted.elapsed());
        }
        if drop_gone.is_none() && objects_left(client, drop).await?.is_empty() {
            let mut volumes_left = Vec::new();
            for v in &drop_volumes {
                if pvs.get_opt(v).await?.is_some() {
                    volumes_left.push(v.clone());
                }
            }
            if pvcs_of(client, drop).await?.is_empty() && volumes_left.is_empty() {
                drop_gone = Some(deleted.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (keep_gone, drop_gone) = (keep_gone.unwrap_or_default(), drop_gone.unwrap_or_default());
    eprintln!(
        "MEASURE delete 1x1 Retain -> nodes and pods gone: {:.1}s",
        keep_gone.as_secs_f64()
    );
    eprintln!(
        "MEASURE delete 1x1 Delete -> nodes, pods, claims and volumes gone: {:.1}s",
        drop_gone.as_secs_f64()
    );
    // The Delete cluster's claims are gone by now; 5 s more for a wrong deletion of the Retain
    // cluster's claims to show, then they must be untouched.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kept = pvcs_of(client, keep).await?;
    ensure!(
        kept.len() == keep_uids.len(),
        "Retain: {} of {} claims left",
        kept.len(),
        keep_uids.len()
    );
    for c in &kept {
        let cname = c.metadata.name.clone().unwrap_or_default();
        ensure!(
            c.metadata
                .uid
                .as_ref()
                .is_some_and(|u| keep_uids.contains(u)),
            "{cname} was recreated"
        );
        ensure!(
            c.metadata.deletion_timestamp.is_none(),
            "Retain claim {cname} is being deleted"
        );
        ensure!(
            c.metadata
                .owner_references
                .as_ref()
                .is_none_or(Vec::is_empty),
            "Retain claim {cname} has owners {:?}",
            c.metadata.owner_references
        );
        let phase = c.status.as_ref().and_then(|s| s.phase.clone());
        ensure!(phase.as_deref() == Some("Bound"), "{cname}: {phase:?}");
    }
    Ok(())
}

/// Scenario 1 on cluster `name` (3 × 1, persistent): acknowledged writes, delete every pod at
/// once, recover, read back.
async fn all_pods_deleted(client: &Client, name: &str, claims: &[String]) -> anyhow::Result<()> {
    let mut conn = cluster_client(client, name, PW).await?;
    acked_writes(&mut conn, KEYS, "p").await?;
    drop(conn);
    let old = pods_of(client, name).await?;
    let old_ips: Vec<String> = old.iter().filter_map(pod_ip).collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deleted = Instant::now();
    let _ = pods
        .delete_collection(&DeleteParams::default(), &cluster_lp(name))
        .await?;
    eprintln!("deleted all {} pods of {name} (IPs {old_ips:?})", old.len());
    let took = wait_recovered(
        client,
        name,
        3,
        1,
        &uids(&old),
        deleted,
        Duration::from_secs(300),
    )
    .await?;
    eprintln!(
        "MEASURE all-pods-deleted -> Ready (3x1 persistent): {:.1}s",
        took.as_secs_f64()
    );
    let new_ips: Vec<String> = pods_of(client, name)
        .await?
        .iter()
        .filter_map(pod_ip)
        .collect();
    eprintln!("{name} pod IPs now {new_ips:?}");
    // Nothing was written since: the primaries' last RDB load (each from its own volume, or
    // for a node promoted after a resync from its primary's volume) holds every key.
    let mut loaded_by_primaries = 0;
    for ip in &new_ips {
        let mut c = node_conn(ip, "app", PW).await?;
        let info: String = query_cmd(&mut c, &["INFO", "persistence"]).await?;
        let loaded: usize = info
            .lines()
            .find_map(|l| l.strip_prefix("rdb_last_load_keys_loaded:"))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("{ip}: no rdb_last_load_keys_loaded"))?;
        let role = live_role(ip, "app", PW).await?;
        eprintln!("{ip}: role {role}, keys in its last RDB load {loaded}");
        if role == "master" {
            loaded_by_primaries += loaded;
        }
    }
    ensure!(
        loaded_by_primaries == KEYS,
        "primaries loaded {loaded_by_primaries} keys from their RDB files, wrote {KEYS}"
    );
    // The same claims (not new empty ones) serve the new pods.
    let now = check_claims(client, name, 6).await?;
    ensure!(
        now.iter().all(|u| claims.contains(u)),
        "claims replaced: {claims:?} -> {now:?}"
    );
    let mut conn = cluster_client(client, name, PW).await?;
    check_acked(&mut conn, KEYS, "p", "deleting every pod").await?;
    eprintln!(
        "MEASURE all-pods-deleted -> all {KEYS} acknowledged keys read: {:.1}s",
        deleted.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Scenario 3 on cluster `name`: delete the StatefulSet of a primary.
async fn primary_statefulset_deleted(client: &Client, name: &str) -> anyhow::Result<()> {
    let mut conn = cluster_client(client, name, PW).await?;
    acked_writes(&mut conn, KEYS, "s").await?;
    drop(conn);
    let op_pw = system_operator_password(client, name).await?;
    // A node whose ValkeyNode reports role primary and whose server says so too.
    let mut victim = None;
    for vn in valkey_nodes_of(client, name).await? {
        let Some(st) = vn.status else { continue };
        let (Some(pod), Some(ip)) = (st.pod_name, st.pod_ip) else {
            continue;
        };
        if st.role.as_deref() == Some("primary")
            && live_role(&ip, "_operator", &op_pw).await? == "master"
        {
            victim = Some((vn.metadata.name.unwrap_or_default(), pod));
            break;
        }
    }
    let (vn_name, pod_name) =
        victim.context("no primary seen both live and in ValkeyNode status")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = pods.get(&pod_name).await?;
    let sts_name = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "StatefulSet")
        .map(|o| o.name.clone())
        .with_context(|| format!("{pod_name} has no StatefulSet owner"))?;
    let stss: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let old_sts_uid = stss.get(&sts_name).await?.metadata.uid;
    let old = pods_of(client, name).await?;
    let victim_uid = pod.metadata.uid.clone().unwrap_or_default();
    let deleted = Instant::now();
    stss.delete(&sts_name, &DeleteParams::default()).await?;
    eprintln!("deleted StatefulSet {sts_name} of primary {vn_name} (pod {pod_name})");
    let took = wait_recovered(
        client,
        name,
        3,
        1,
        &[victim_uid],
        deleted,
        Duration::from_secs(240),
    )
    .await?;
    let new_sts_uid = stss.get(&sts_name).await?.metadata.uid;
    ensure!(new_sts_uid != old_sts_uid, "{sts_name} was not recreated");
    eprintln!(
        "MEASURE primary StatefulSet deleted -> Ready (3x1 persistent): {:.1}s",
        took.as_secs_f64()
    );
    ensure!(pods_of(client, name).await?.len() == old.len());
    let mut conn = cluster_client(client, name, PW).await?;
    check_acked(&mut conn, KEYS, "s", "deleting a primary's StatefulSet").await?;
    check_acked(&mut conn, KEYS, "p", "deleting a primary's StatefulSet").await?;
    Ok(())
}

/// Scenario 4: Foreground deletion of cluster `name` (reclaimPolicy Delete).
async fn foreground_delete(client: &Client, name: &str) -> anyhow::Result<()> {
    ensure!(!objects_left(client, name).await?.is_empty());
    ensure!(!pvcs_of(client, name).await?.is_empty());
    let vcs: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deleted = Instant::now();
    vcs.delete(
        name,
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..DeleteParams::default()
        },
    )
    .await?;
    let mut saw_foreground = false;
    let mut last = Vec::new();
    let (vc_gone, claims_gone) = loop {
        ensure!(
            deleted.elapsed() < Duration::from_secs(120),
            "120 s after the Foreground delete: ValkeyCluster present={}, left {last:?}",
            vcs.get_opt(name).await?.is_some()
        );
        // The ValkeyCluster first: once it is gone, nothing it owns may be left.
        match vcs.get_opt(name).await? {
            Some(vc) => {
                saw_foreground |= vc
                    .metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f == "foregroundDeletion");
                let left = objects_left(client, name).await?;
                if left != last {
                    eprintln!(
                        "[{name} +{:.1}s] left: {left:?}",
                        deleted.elapsed().as_secs_f64()
                    );
                    last = left;
                }
            }
            None => {
                let vc_gone = deleted.elapsed();
                let left = objects_left(client, name).await?;
                ensure!(
                    left.is_empty(),
                    "ValkeyCluster gone after a Foreground delete while its objects remain: {left:?}"
                );
                // Claims are not owned; the ValkeyNodes' finalizer deleted them, the
                // pvc-protection controller removes them once their pods are gone.
                loop {
                    let claims = pvcs_of(client, name).await?;
                    if claims.is_empty() {
                        break;
                    }
                    ensure!(
                        deleted.elapsed() < Duration::from_secs(120),
                        "claims left 120 s after the Foreground delete: {:?}",
                        claims
                            .iter()
                            .map(|c| c.metadata.name.clone())
                            .collect::<Vec<_>>()
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                break (vc_gone, deleted.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    ensure!(
        saw_foreground,
        "the ValkeyCluster never carried the foregroundDeletion finalizer"
    );
    eprintln!(
        "MEASURE Foreground delete 3x1 -> owned objects and ValkeyCluster gone: {:.1}s",
        vc_gone.as_secs_f64()
    );
    eprintln!(
        "MEASURE Foreground delete 3x1 -> claims gone (reclaimPolicy Delete): {:.1}s",
        claims_gone.as_secs_f64()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_persistence_and_deletion() -> anyhow::Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        valkey_operator::telemetry::init(valkey_operator::telemetry::LogFormat::Text);
    }
    let t0 = Instant::now();
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();

    // All three clusters at once: `pers` 3 × 1 (Delete), `keep` 1 × 1 (Retain), `drop` 1 × 1
    // (Delete).
    let (pers, keep, drop) = ("pers", "keep", "drop");
    for (name, shards, policy) in [
        (pers, 3, "Delete"),
        (keep, 1, "Retain"),
        (drop, 1, "Delete"),
    ] {
        create_user_secret(&client, &format!("{name}-app"), PW).await?;
        create_cluster_with(&client, name, shards, 1, persistence(policy)).await?;
    }
    let started = Instant::now();
    for (name, shards) in [(keep, 1), (drop, 1), (pers, 3)] {
        wait_ready(&client, name, shards, Duration::from_secs(300)).await?;
        eprintln!(
            "MEASURE {name} {shards}x1 persistent apply -> Ready: {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }
    check_topology(&client, pers, 3, 1, PW).await?;
    let pers_claims = check_claims(&client, pers, 6).await?;
    check_claims(&client, keep, 2).await?;
    check_claims(&client, drop, 2).await?;

    // 2 and 1 run concurrently (different clusters).
    let (r2, r1) = tokio::join!(
        retain_vs_delete(&client, keep, drop),
        all_pods_deleted(&client, pers, &pers_claims)
    );
    r2.context("Retain vs Delete")?;
    r1.context("all pods deleted")?;
    primary_statefulset_deleted(&client, pers)
        .await
        .context("primary StatefulSet deleted")?;
    foreground_delete(&client, pers)
        .await
        .context("Foreground delete")?;

    fx.stop().await;
    eprintln!("MEASURE test wall time: {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}
