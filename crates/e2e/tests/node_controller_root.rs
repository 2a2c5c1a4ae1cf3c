//! The ValkeyNode controller alone on localkube with real Valkey pods: the cluster-level
//! objects come from the render layer (no ValkeyCluster controller), then
//! - a StatefulSet node with persistence `Delete` gets its claim bound, the PVC finalizer, a
//!   Ready status with pod name and IP (so the rendered config, ACL file, `include` of the
//!   replication secret and the authenticated probes work in a real pod); deleting the node
//!   deletes the claim;
//! - a Deployment node (no persistence) becomes Ready too, and its metrics-exporter sidecar
//!   serves Valkey metrics on `<podIP>:9121` (authenticated as `_exporter`);
//! - a pod template change waits (`WorkloadRollPending`) until `workloadRevision` is bumped,
//!   then rolls the pod;
//! - an idle Ready node causes no writes (its resourceVersion stays put).
//!
//! Needs root (localkube runs pods as processes in network namespaces); skipped otherwise.

mod support;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use support::scrape;
use valkey_api::{ValkeyCluster, ValkeyNode};
use valkey_operator::render::{self, valkeynode::NodeInputs};

use support::{Fixture, NS};
const MANAGER: &str = "node-controller-test";

async fn apply<K>(client: &Client, obj: &K) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), NS);
    api.patch(
        &obj.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await?;
    Ok(())
}

/// Applies the cluster-level objects of `vc` (ConfigMap, Secrets, Service) and its node 0-0.
async fn apply_cluster_objects(client: &Client, vc: &ValkeyCluster) -> anyhow::Result<ValkeyNode> {
    let name = vc.name_any();
    let spec = &vc.spec;
    let passwords = render::secrets::system_passwords(&[]);
    apply(
        client,
        &render::secrets::system_secret(&name, NS, &passwords, None),
    )
    .await?;
    let acl = render::acl::render_acl_file(
        spec,
        &passwords,
        &Default::default(),
        &Default::default(),
        None,
    );
    apply(
        client,
        &render::secrets::acl_secret(&name, NS, &acl.content, None),
    )
    .await?;
    apply(
        client,
        &render::valkey_conf::config_map(&name, NS, spec, None),
    )
    .await?;
    apply(client, &render::service::service(&name, NS, None)).await?;
    let inputs = NodeInputs {
        workload_revision: Some("1".into()),
    };
    let node = render::valkeynode::valkey_node(vc, 0, 0, &inputs, None);
    apply(client, &node).await?;
    Ok(node)
}

fn cluster(name: &str, spec: serde_json::Value) -> ValkeyCluster {
    let mut vc = ValkeyCluster::new(name, serde_json::from_value(spec).unwrap());
    vc.metadata.namespace = Some(NS.into());
    vc
}

async fn wait_ready(
    api: &Api<ValkeyNode>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<ValkeyNode> {
    let deadline = Instant::now() + timeout;
    loop {
        let n = api.get(name).await?;
        if n.status.as_ref().is_some_and(|s| s.ready) {
            return Ok(n);
        }
        if Instant::now() > deadline {
            bail!("ValkeyNode {name} not ready: {:?}", n.status);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_controller_on_localkube() -> anyhow::Result<()> {
    let opts = localkube::Options {
        nodes: 2,
        zones: 1,
        ..localkube::Options::default()
    };
    let Some(fx) = Fixture::start_with(opts, false).await? else {
        return Ok(());
    };
    let result = scenario(&fx.client).await;
    fx.stop().await;
    result
}

/// The resource versions of a ValkeyNode's inputs: its pod, StatefulSet and claim.
async fn input_versions(client: &Client, node: &ValkeyNode) -> anyhow::Result<Vec<Option<String>>> {
    let name = node.name_any();
    let pod = node.status.as_ref().and_then(|s| s.pod_name.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    Ok(vec![
        match pod {
            Some(p) => pods.get_opt(&p).await?.and_then(|p| p.resource_version()),
            None => None,
        },
        sts.get_opt(&render::names::workload_name(&name))
            .await?
            .and_then(|s| s.resource_version()),
        pvcs.get_opt(&render::names::pvc_name(&name))
            .await?
            .and_then(|c| c.resource_version()),
    ])
}

/// Fails if the ValkeyNode `name` is written within 10 s although none of its inputs changed.
async fn idle_without_writes(client: &Client, name: &str) -> anyhow::Result<()> {
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), NS);
    for _ in 0..3 {
        let before = nodes.get(name).await?;
        let inputs = input_versions(client, &before).await?;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let after = nodes.get(name).await?;
        if after.resource_version() == before.resource_version() {
            return Ok(());
        }
        ensure!(
            input_versions(client, &after).await? != inputs,
            "idle node was written with no input changed: before {:?} {:?}, after {:?} {:?}",
            before.status,
            before.metadata.managed_fields,
            after.status,
            after.metadata.managed_fields
        );
        eprintln!("an input of {name} changed, and it was written: waiting again");
    }
    bail!("the inputs of {name} kept changing for 30 s")
}

async fn scenario(client: &Client) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(valkey_operator::node::run(
        client.clone(),
        std::sync::Arc::new(valkey_operator::metrics::Metrics::new()),
        // Scoped to the test's namespace: the namespaced watches of `--watch-namespace`.
        valkey_operator::Scope::Namespace(NS.to_owned()),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), NS);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);

    let sts_cluster = cluster(
        "pers",
        serde_json::json!({"shards": 1, "persistence": {"size": "64Mi", "reclaimPolicy": "Delete"},
                           "exporter": {"enabled": false}}),
    );
    let deploy_cluster = cluster(
        "cache",
        serde_json::json!({"shards": 1, "workloadType": "Deployment"}),
    );
    let a = apply_cluster_objects(client, &sts_cluster).await?;
    let b = apply_cluster_objects(client, &deploy_cluster).await?;

    let t0 = Instant::now();
    let a = wait_ready(&nodes, &a.name_any(), Duration::from_secs(180)).await?;
    let b = wait_ready(&nodes, &b.name_any(), Duration::from_secs(180)).await?;
    eprintln!("both ValkeyNodes Ready after {:?}", t0.elapsed());
    for n in [&a, &b] {
        let st = n.status.as_ref().unwrap();
        ensure!(st.pod_ip.is_some(), "no pod IP: {st:?}");
        ensure!(st.pod_name.is_some(), "no pod name: {st:?}");
        ensure!(
            st.applied_workload_revision.as_deref() == Some("1"),
            "{st:?}"
        );
    }
    ensure!(
        a.finalizers()
            .iter()
            .any(|f| f == valkey_operator::node::FINALIZER)
    );
    ensure!(b.finalizers().is_empty());
    let claim = pvcs.get(&render::names::pvc_name(&a.name_any())).await?;
    ensure!(claim.status.and_then(|s| s.phase).as_deref() == Some("Bound"));

    // Idle: no write to the ready node for 10 s while none of its inputs (pod, StatefulSet,
    // claim) changes. A change of an input (a readiness probe failing once on a loaded
    // machine) may rightly be reported; the window then starts again, at most three times.
    idle_without_writes(client, &a.name_any()).await?;

    // The exporter sidecar of the Deployment node reaches its server.
    let ip = b.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = scrape(&ip).await.unwrap_or_default();
        if metrics.lines().any(|l| l == "redis_up 1") {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "exporter never reported redis_up 1: {metrics:.400}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // A template change with the same workload revision is deferred...
    let bname = b.name_any();
    let merge = |v: serde_json::Value| Patch::Merge(v);
    nodes
        .patch(
            &bname,
            &PatchParams::default(),
            &merge(serde_json::json!(
            {"spec": {"config": {"hash": "changed"}}})),
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = nodes.get(&bname).await?;
        let pending = n.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "WorkloadRollPending"
                    && c.status == "True"
                    && c.reason == "AwaitingWorkloadRevision"
            })
        });
        if pending {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no WorkloadRollPending: {:?}",
            n.status
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let old_pod = b.status.as_ref().and_then(|s| s.pod_name.clone());
    // ... and applied once the revision is bumped: a new pod, Ready, no pending condition.
    nodes
        .patch(
            &bname,
            &PatchParams::default(),
            &merge(serde_json::json!(
            {"spec": {"workloadRevision": "2"}})),
        )
        .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n = nodes.get(&bname).await?;
        let st = n.status.clone().unwrap_or_default();
        let rolled = st.ready
            && st.applied_workload_revision.as_deref() == Some("2")
            && st.pod_name != old_pod
            && st
                .conditions
                .iter()
                .all(|c| c.type_ != "WorkloadRollPending");
        if rolled {
            break;
        }
        ensure!(Instant::now() < deadline, "roll not applied: {st:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Delete: the finalizer removes the claim, then the node goes away.
    nodes
        .delete(&a.name_any(), &DeleteParams::default())
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let gone = nodes.get_opt(&a.name_any()).await?.is_none();
        let claim = pvcs
            .get_opt(&render::names::pvc_name(&a.name_any()))
            .await?;
        let claim_gone = claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some());
        if gone && claim_gone {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "node or claim not deleted (node gone: {gone})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = stop_tx.send(());
    controller.await??;
    Ok(())
}
