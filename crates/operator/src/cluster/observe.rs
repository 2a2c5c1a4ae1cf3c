//! Observation: the cluster's pods mapped to their positions, and every reachable pod's live
//! view fetched concurrently through the operator's authenticated connection pool.

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::debug;
use valkey_api::defaults::VALKEY_PORT;
use valkey_api::labels;
use valkey_ops::client::NodePool;
use valkey_ops::commands::observe_node;
use valkey_ops::model::{ClusterState, NodeObservation, PrimaryLinkStatus};

use super::topology::{Member, NodeView};

/// Shard and node index of a pod, from its labels.
pub fn position(pod: &Pod) -> Option<(i32, i32)> {
    let l = pod.labels();
    Some((
        l.get(labels::SHARD_INDEX)?.parse().ok()?,
        l.get(labels::NODE_INDEX)?.parse().ok()?,
    ))
}

/// `ip:port` of a running, non-terminating pod.
pub fn pod_addr(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    Some(if ip.contains(':') {
        format!("[{ip}]:{VALKEY_PORT}")
    } else {
        format!("{ip}:{VALKEY_PORT}")
    })
}

/// The scheduler's message for a pod it cannot place (`PodScheduled=False`, `Unschedulable`).
pub fn unschedulable_message(pod: &Pod) -> Option<String> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    (c.reason.as_deref() == Some("Unschedulable")).then(|| {
        format!(
            "pod {}: {}",
            pod.name_any(),
            c.message.as_deref().unwrap_or("cannot be scheduled")
        )
    })
}

/// The parts of an observation the topology decision uses.
pub fn node_view(o: NodeObservation) -> NodeView {
    NodeView {
        cluster_ok: o
            .cluster_info
            .as_ref()
            .is_some_and(|c| c.state == ClusterState::Ok),
        primary_link_up: o
            .replication
            .as_ref()
            .is_some_and(|r| r.primary_link_status == Some(PrimaryLinkStatus::Up)),
        nodes: o.nodes,
    }
}

/// Members of the desired layout with a running pod, each with its live view (or `None` when
/// unreachable). Pods of positions outside the layout are included too (they may still hold
/// slots); `desired` only orders the result.
pub async fn members(pool: &NodePool, pods: &[Pod]) -> Vec<Member> {
    let mut base: Vec<Member> = pods
        .iter()
        .filter_map(|p| {
            let (shard, index) = position(p)?;
            Some(Member {
                shard,
                index,
                pod: p.name_any(),
                addr: pod_addr(p)?,
                view: None,
            })
        })
        .collect();
    base.sort_by_key(|m| (m.shard, m.index));
    let views = join_all(base.iter().map(|m| async move {
        match observe_node(pool, &m.addr).await {
            Ok(o) => Some(node_view(o)),
            Err(e) => {
                debug!(pod = %m.pod, addr = %m.addr, error = %e, "node not observable");
                None
            }
        }
    }))
    .await;
    for (m, v) in base.iter_mut().zip(views) {
        m.view = v;
    }
    base
}
