//! The ValkeyCluster controller against a real kube-apiserver (no nodes, so no pods): it
//! creates every owned object with owner references, reports `Initializing` with the contract's
//! conditions, and once settled makes no further writes (resourceVersions stay put).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use valkey_api::status::ClusterState;
use valkey_api::{ValkeyCluster, ValkeyNode};

const NS: &str = "default";

/// resourceVersion of every object the controller writes.
async fn versions(client: &Client, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let rv = |k: &str, r: Option<String>| (k.to_owned(), r.unwrap_or_default());
    let vc = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .get(name)
        .await?;
    out.extend([rv("vc", vc.resource_version())]);
    let svc = Api::<Service>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}"))
        .await?;
    out.extend([rv("svc", svc.resource_version())]);
    let cm = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-config"))
        .await?;
    out.extend([rv("cm", cm.resource_version())]);
    for s in ["system", "system-backup", "acl"] {
        let sec = Api::<Secret>::namespaced(client.clone(), NS)
            .get(&format!("valkey-{name}-{s}"))
            .await?;
        out.extend([rv(s, sec.resource_version())]);
    }
    let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}"))
        .await?;
    out.extend([rv("pdb", pdb.resource_version())]);
    for vn in Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("valkey.io/cluster={name}")))
        .await?
    {
        out.insert(vn.name_any(), vn.resource_version().unwrap_or_default());
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_creates_children_and_settles_without_writes() -> anyhow::Result<()> {
    let Some(fx) =
        support::Fixture::start_with(localkube::Options::apiserver_only(), false).await?
    else {
        return Ok(());
    };
    let client = fx.client.clone();
    let metrics = Arc::new(valkey_operator::metrics::Metrics::new());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let ctl = tokio::spawn(valkey_operator::cluster::run(
        client.clone(),
        metrics.clone(),
        // Scoped to the test's namespace: the namespaced watches of `--watch-namespace`.
        valkey_operator::Scope::Namespace(NS.to_owned()),
        async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        },
    ));

    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let vc: ValkeyCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
        "metadata": {"name": "idle"},
        "spec": {"shards": 2, "replicas": 1, "terminationGracePeriodSeconds": 5}
    }))?;
    let created = api.create(&PostParams::default(), &vc).await?;
    let uid = created.uid().context("uid")?;

    // Children and status appear. The first pass reports `AddingNodes` while it
    // creates the ValkeyNodes; the settled status without pods is `Initializing`.
    let deadline = Instant::now() + Duration::from_secs(60);
    let vc = loop {
        let vc = api.get("idle").await?;
        if vc.status.as_ref().is_some_and(|s| {
            s.observed_generation.is_some() && s.reason.as_deref() == Some("Initializing")
        }) && versions(&client, "idle").await.is_ok()
        {
            break vc;
        }
        ensure!(
            Instant::now() < deadline,
            "no settled status/children after 60 s: {:?}",
            vc.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let status = vc.status.context("status")?;
    assert_eq!(status.state, ClusterState::Reconciling, "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("Initializing"));
    let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    for t in [
        "Ready",
        "Progressing",
        "Degraded",
        "ClusterFormed",
        "SlotsAssigned",
        "ConfigurationWarning",
    ] {
        assert!(types.contains(&t), "missing condition {t}: {types:?}");
    }
    let warn = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ConfigurationWarning")
        .context("warning")?;
    assert_eq!(warn.reason, "GracePeriodTooShort");
    let nodes = Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels("valkey.io/cluster=idle"))
        .await?;
    let mut names: Vec<String> = nodes.iter().map(ResourceExt::name_any).collect();
    names.sort();
    assert_eq!(names, ["idle-0-0", "idle-0-1", "idle-1-0", "idle-1-1"]);
    for n in &nodes {
        let owner = n.owner_references().first().context("owner")?;
        assert_eq!(owner.uid, uid);
        assert_eq!(
            n.labels().get("valkey.io/shard-index"),
            Some(&n.spec.shard_index.to_string())
        );
    }
    let svc = Api::<Service>::namespaced(client.clone(), NS)
        .get("valkey-idle")
        .await?;
    assert_eq!(svc.meta().owner_references.as_ref().map(Vec::len), Some(1));

    // Settled: nothing is written for 10 s (the controller requeues every few seconds).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = versions(&client, "idle").await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = versions(&client, "idle").await?;
    assert_eq!(before, after, "idle cluster objects were rewritten");
    let text = metrics.encode();
    assert!(text.contains("valkey_operator_cluster_state{namespace=\"default\",name=\"idle\",state=\"Reconciling\"} 1"), "{text}");

    // Scale in: surplus ValkeyNodes (holding no slots) are deleted.
    api.patch(
        "idle",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = Api::<ValkeyNode>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels("valkey.io/cluster=idle"))
            .await?
            .items
            .len();
        if n == 2 {
            break;
        }
        ensure!(Instant::now() < deadline, "still {n} ValkeyNodes");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), ctl).await;
    fx.stop().await;
    Ok(())
}
