//! Node registration, status heartbeats and Lease renewals.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::{NodeSpec, Shared};

/// How often the node status and lease are renewed.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// Lease duration announced (the kubelet's default).
const LEASE_SECONDS: i32 = 40;
/// Ephemeral storage each node announces.
const EPHEMERAL_STORAGE: &str = "100Gi";

/// Allocatable (= capacity) resources of a node.
pub fn allocatable(n: &NodeSpec) -> BTreeMap<String, String> {
    [
        ("cpu".to_string(), n.cpu.clone()),
        ("memory".to_string(), n.memory.clone()),
        ("pods".to_string(), n.pods.to_string()),
        (
            "ephemeral-storage".to_string(),
            EPHEMERAL_STORAGE.to_string(),
        ),
    ]
    .into()
}

fn labels(n: &NodeSpec) -> BTreeMap<String, String> {
    let mut l: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", n.name.as_str()),
        ("topology.kubernetes.io/zone", n.zone.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    l.extend(n.labels.clone());
    l
}

/// Creates (or updates) the Node object and reports it Ready.
pub(crate) async fn register(shared: &Arc<Shared>, n: &NodeSpec) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(shared.client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(n.name.clone()),
            labels: Some(labels(n)),
            annotations: Some(
                [("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string())].into(),
            ),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: (!n.taints.is_empty()).then(|| n.taints.clone()),
            ..Default::default()
        }),
        // Like the kubelet, register with the full status so the node is
        // Ready (and never tainted not-ready) from the first moment.
        status: serde_json::from_value(status_json(shared, n, &[])).ok(),
    };
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let patch = json!({"metadata": {"labels": labels(n)}});
            api.patch(&n.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Err(e) => return Err(e.into()),
    }
    patch_status(shared, n).await?;
    renew_lease(shared, &n.name).await?;
    Ok(())
}

/// The node status the kubelet posts, keeping transition times from `prev`.
fn status_json(
    shared: &Shared,
    n: &NodeSpec,
    prev: &[k8s_openapi::api::core::v1::NodeCondition],
) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    let transition = |type_: &str, status: &str| {
        prev.iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| now.clone())
    };
    let cond = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": transition(type_, status),
        })
    };
    let resources = allocatable(n);
    json!({
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": shared.host_ip},
            {"type": "Hostname", "address": n.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": shared.kubelet_ports.get(&n.name).copied().unwrap_or(10250)}},
        "nodeInfo": {
            "machineID": format!("localkube-{}", n.name),
            "systemUUID": format!("localkube-{}", n.name),
            "bootID": format!("localkube-{}", n.name),
            "kernelVersion": kernel_version(),
            "osImage": "localkube",
            "containerRuntimeVersion": "localkube://0.1.0",
            "kubeletVersion": "v1.37.0-localkube",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    })
}

async fn patch_status(shared: &Arc<Shared>, n: &NodeSpec) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(shared.client.clone());
    let existing = api.get_status(&n.name).await?;
    let prev = existing
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    let patch = json!({"status": status_json(shared, n, &prev)});
    api.patch_status(&n.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

async fn renew_lease(shared: &Arc<Shared>, node: &str) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(shared.client.clone(), "kube-node-lease");
    let now = MicroTime(Timestamp::now());
    match api.get_opt(node).await? {
        Some(_) => {
            let patch = json!({"spec": {
                "holderIdentity": node,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now,
            }});
            api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        None => {
            let nodes: Api<Node> = Api::all(shared.client.clone());
            let uid = nodes.get(node).await?.metadata.uid.unwrap_or_default();
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(node.to_string()),
                    namespace: Some("kube-node-lease".into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "Node".into(),
                        name: node.to_string(),
                        uid,
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some(node.to_string()),
                    lease_duration_seconds: Some(LEASE_SECONDS),
                    renew_time: Some(now),
                    ..Default::default()
                }),
            };
            api.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

/// Renews the node's status and lease every [`HEARTBEAT`] until aborted.
pub(crate) async fn heartbeat_loop(shared: Arc<Shared>, node: String) {
    let Some(spec) = shared.nodes.get(&node).cloned() else {
        return;
    };
    loop {
        if let Err(e) = patch_status(&shared, &spec).await {
            tracing::warn!(node, error = %e, "node status heartbeat failed");
        }
        if let Err(e) = renew_lease(&shared, &node).await {
            tracing::warn!(node, error = %e, "node lease renewal failed");
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}
