//! End-to-end tests of localkube's kubelet with the real controllers and
//! scheduler: a StatefulSet and a Deployment of Valkey with exec readiness
//! probes become Ready and answer PING at their pod IPs, required pod
//! anti-affinity spreads pods over nodes (and leaves an unsatisfiable one
//! Pending with the scheduler's message), garbage collection removes owned
//! objects and a PodDisruptionBudget reports currentHealthy.
//! Needs root (network and mount namespaces); CI runs as root.

#[macro_use]
mod support;
use support::*;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

fn valkey_template(app: &str, anti_affinity: bool) -> serde_json::Value {
    let mut spec = json!({
        "containers": [{
            "name": "valkey",
            "image": "valkey/valkey:9.0.0",
            "args": ["--port", "6379", "--save", "", "--appendonly", "no", "--protected-mode", "no"],
            "ports": [{"name": "valkey", "containerPort": 6379}],
            "readinessProbe": {"exec": {"command": ["valkey-cli", "ping"]}, "periodSeconds": 1},
            "livenessProbe": {"tcpSocket": {"port": "valkey"}, "periodSeconds": 2},
        }],
        "terminationGracePeriodSeconds": 2,
    });
    if anti_affinity {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"app": app}},
            "topologyKey": "kubernetes.io/hostname",
        }]}});
    }
    json!({"metadata": {"labels": {"app": app}}, "spec": spec})
}

async fn ready_pods(pods: &Api<Pod>, app: &str, n: usize) -> Vec<Pod> {
    wait_for(
        &format!("{n} ready pods of {app}"),
        Duration::from_secs(90),
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={app}")))
                .await
                .ok()?;
            let ready: Vec<Pod> = list.items.into_iter().filter(pod_ready).collect();
            (ready.len() == n).then_some(ready)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_workloads() {
    let ns = "wl";
    let Some((env, client, pods)) = support::start_env_in(ns).await else {
        return;
    };

    // --- Nodes: labels, capacity, addresses, conditions and leases.
    let nodes_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let all_nodes = nodes_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all_nodes.len(), env.node_names().len());
    let zones: BTreeSet<String> = all_nodes
        .iter()
        .map(|n| n.metadata.labels.as_ref().unwrap()["topology.kubernetes.io/zone"].clone())
        .collect();
    assert_eq!(zones.len(), 3, "{zones:?}");
    let gateway = env.gateway().unwrap().to_string();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-node-lease");
    for n in &all_nodes {
        let name = n.metadata.name.clone().unwrap();
        let labels = n.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], name);
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        let st = n.status.as_ref().unwrap();
        assert!(st.allocatable.as_ref().unwrap().contains_key("cpu"));
        assert!(st.capacity.as_ref().unwrap().contains_key("memory"));
        let addrs = st.addresses.as_ref().unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == gateway)
        );
        assert!(
            addrs
                .iter()
                .any(|a| a.type_ == "Hostname" && a.address == name)
        );
        let conds = st.conditions.as_ref().unwrap();
        assert!(
            conds
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        );
        for t in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
            assert!(
                conds.iter().any(|c| c.type_ == t && c.status == "False"),
                "{t}"
            );
        }
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            taints.is_empty(),
            "node lifecycle never taints a healthy node: {taints:?}"
        );
        let lease = leases.get(&name).await.unwrap();
        assert_eq!(
            lease.spec.unwrap().holder_identity.as_deref(),
            Some(name.as_str())
        );
    }

    // --- StatefulSet with anti-affinity: Ready, PING, spread over nodes.
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "kv"},
        "spec": {
            "serviceName": "kv",
            "replicas": 2,
            "selector": {"matchLabels": {"app": "kv"}},
            "template": valkey_template("kv", true),
        }
    }))
    .unwrap();
    let t0 = Instant::now();
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sts)
        .await
        .unwrap();
    let kv = ready_pods(&pods, "kv", 2).await;
    eprintln!(
        "MEASURE StatefulSet of 2 (OrderedReady) create-to-all-Ready: {} ms",
        t0.elapsed().as_millis()
    );
    let nodes: BTreeSet<String> = kv
        .iter()
        .map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap())
        .collect();
    assert_eq!(
        nodes.len(),
        2,
        "anti-affinity spreads over two nodes: {nodes:?}"
    );
    for p in &kv {
        let ip = p.status.as_ref().unwrap().pod_ip.clone().unwrap();
        assert!(ping(&ip, 6379), "{ip} answers PING");
    }
    let sts_status = wait_for("sts status", Duration::from_secs(30), || async {
        let s = Api::<StatefulSet>::namespaced(client.clone(), ns)
            .get("kv")
            .await
            .ok()?;
        let st = s.status?;
        (st.ready_replicas == Some(2)).then_some(st)
    })
    .await;
    assert_eq!(sts_status.replicas, 2);

    // --- PDB reports currentHealthy.
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "kv"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kv"}}}
    }))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let pdb_status = wait_for("pdb status", Duration::from_secs(30), || async {
        let st = pdbs.get("kv").await.ok()?.status?;
        (st.current_healthy == Some(2)).then_some(st)
    })
    .await;
    assert_eq!(pdb_status.disruptions_allowed, Some(1));
    assert_eq!(pdb_status.desired_healthy, Some(1));

    // --- Deployment: Ready and PING.
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": valkey_template("web", false),
        }
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    let web = ready_pods(&pods, "web", 2).await;
    for p in &web {
        let ip = p.status.as_ref().unwrap().pod_ip.clone().unwrap();
        assert!(ping(&ip, 6379), "{ip} answers PING");
    }
    wait_for("deployment available", Duration::from_secs(30), || async {
        let st = deployments.get("web").await.ok()?.status?;
        (st.available_replicas == Some(2)).then_some(())
    })
    .await;

    // --- Unsatisfiable anti-affinity: 7 replicas, 6 nodes → one Pending with the scheduler's message.
    let spread: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "spread"},
        "spec": {
            "replicas": 7,
            "selector": {"matchLabels": {"app": "spread"}},
            "template": {
                "metadata": {"labels": {"app": "spread"}},
                "spec": {
                    "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "sleep 3600"]}],
                    "terminationGracePeriodSeconds": 1,
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchLabels": {"app": "spread"}},
                        "topologyKey": "kubernetes.io/hostname",
                    }]}},
                }
            },
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &spread)
        .await
        .unwrap();
    let app_spread = ListParams::default().labels("app=spread");
    let message = wait_for(
        "a Pending pod with the scheduler's message",
        Duration::from_secs(60),
        || async {
            let list = pods.list(&app_spread).await.ok()?;
            let ready = list.items.iter().filter(|p| pod_ready(p)).count();
            let pending: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
                .filter_map(|p| {
                    p.status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
                        .message
                        .clone()
                })
                .collect();
            (ready == 6 && pending.len() == 1).then(|| pending[0].clone())
        },
    )
    .await;
    eprintln!("scheduler: {message}");
    assert!(message.contains("0/6 nodes are available"), "{message}");
    assert!(message.contains("anti-affinity"), "{message}");

    // --- Garbage collection: deleting the Deployment removes its ReplicaSets and pods.
    deployments
        .delete("spread", &DeleteParams::background())
        .await
        .unwrap();
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
    wait_for(
        "owned objects collected",
        Duration::from_secs(60),
        || async {
            let rs = rss.list(&app_spread).await.ok()?;
            let ps = pods.list(&app_spread).await.ok()?;
            (rs.items.is_empty() && ps.items.is_empty()).then_some(())
        },
    )
    .await;

    // --- Node failure: stopping a node kills its pods and the node goes NotReady.
    let victim = kv[0].spec.as_ref().unwrap().node_name.clone().unwrap();
    let victim_ip = kv[0].status.as_ref().unwrap().pod_ip.clone().unwrap();
    let faults = env.faults().unwrap();
    faults.stop_node(&victim).await.unwrap();
    assert!(!ping(&victim_ip, 6379), "pods of a stopped node are dead");
    faults.start_node(&victim).await.unwrap();
    ready_pods(&pods, "kv", 2).await;

    env.stop().await;
}
