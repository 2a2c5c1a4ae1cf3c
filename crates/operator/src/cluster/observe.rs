//! Observation: the cluster's pods mapped to their positions, and every reachable pod's live
//! view fetched concurrently through the operator's authenticated connection pool.

use std::collections::BTreeSet;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tracing::debug;
use valkey_api::defaults::VALKEY_PORT;
use valkey_api::labels;
use valkey_ops::client::NodePool;
use valkey_ops::commands::{CommandError, observe_node};
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

/// IPs held by the cluster's pods that still exist and have not finished (terminating pods
/// included: their server may still be handing over).
pub fn pod_ips(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
                return None;
            }
            status.pod_ip.clone().filter(|ip| !ip.is_empty())
        })
        .collect()
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
        link_down_since: o
            .replication
            .as_ref()
            .and_then(|r| r.primary_link_down_since),
        repl_offset: o
            .replication
            .as_ref()
            .map_or(0, |r| r.replica_repl_offset.unwrap_or(r.master_repl_offset)),
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
                refused: false,
            })
        })
        .collect();
    base.sort_by_key(|m| (m.shard, m.index));
    let views = join_all(base.iter().map(|m| async move {
        match observe_node(pool, &m.addr).await {
            Ok(o) => (Some(node_view(o)), false),
            Err(e) => {
                debug!(pod = %m.pod, addr = %m.addr, error = %e, "node not observable");
                let refused = matches!(&e, CommandError::Client(c) if c.is_connection_refused());
                (None, refused)
            }
        }
    }))
    .await;
    for (m, (view, refused)) in base.iter_mut().zip(views) {
        m.view = view;
        m.refused = refused;
    }
    base
}

/// The live role of a member for `ValkeyNode.status.role` (`primary` or
/// `replica`), `None` while it cannot be observed.
pub fn live_role(member: &Member) -> Option<&'static str> {
    let me = member.view.as_ref()?.nodes.myself()?;
    if me.is_primary() {
        Some("primary")
    } else if me.is_replica() {
        Some("replica")
    } else {
        None
    }
}

/// ValkeyNodes whose `status.role` differs from the live role of their pod:
/// (ValkeyNode name, live role). Unobservable members are left as they are.
pub fn role_updates(nodes: &[valkey_api::ValkeyNode], members: &[Member]) -> Vec<(String, String)> {
    nodes
        .iter()
        .filter_map(|n| {
            let m = members
                .iter()
                .find(|m| m.shard == n.spec.shard_index && m.index == n.spec.node_index)?;
            let role = live_role(m)?;
            let current = n.status.as_ref().and_then(|s| s.role.as_deref());
            (current != Some(role)).then(|| (n.name_any(), role.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use valkey_ops::model::ClusterNodes;

    fn member(shard: i32, index: i32, nodes: &str) -> Member {
        Member {
            shard,
            index,
            pod: format!("p-{shard}-{index}"),
            addr: "10.0.0.1:6379".into(),
            refused: false,
            view: Some(NodeView {
                nodes: ClusterNodes::parse(nodes).expect("nodes"),
                cluster_ok: true,
                primary_link_up: true,
                repl_offset: 0,
                link_down_since: None,
            }),
        }
    }

    fn vnode(shard: i32, index: i32, role: Option<&str>) -> valkey_api::ValkeyNode {
        let mut n: valkey_api::ValkeyNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyNode",
            "metadata": {"name": format!("c-{shard}-{index}")},
            "spec": {"clusterName": "c", "shardIndex": shard, "nodeIndex": index,
                     "image": "valkey/valkey:9.0.0", "terminationGracePeriodSeconds": 30},
        }))
        .expect("valkeynode");
        n.status = Some(valkey_api::ValkeyNodeStatus {
            role: role.map(str::to_owned),
            ..Default::default()
        });
        n
    }

    const PRIMARY: &str = "aaa 10.0.0.1:6379@16379 myself,master - 0 0 1 connected 0-16383\n\
                           bbb 10.0.0.2:6379@16379 slave aaa 0 1 1 connected\n";
    const REPLICA: &str = "aaa 10.0.0.1:6379@16379 master - 0 0 1 connected 0-16383\n\
                           bbb 10.0.0.2:6379@16379 myself,slave aaa 0 1 1 connected\n";

    #[test]
    fn roles_come_from_the_live_view_and_are_patched_only_on_change() {
        // After a failover the node-index-1 pod is the primary.
        let members = [member(0, 0, REPLICA), member(0, 1, PRIMARY)];
        let nodes = [vnode(0, 0, Some("primary")), vnode(0, 1, Some("replica"))];
        assert_eq!(
            role_updates(&nodes, &members),
            vec![
                ("c-0-0".to_owned(), "replica".to_owned()),
                ("c-0-1".to_owned(), "primary".to_owned())
            ]
        );
        let settled = [vnode(0, 0, Some("replica")), vnode(0, 1, Some("primary"))];
        assert!(role_updates(&settled, &members).is_empty());
        let unobserved = Member {
            view: None,
            ..member(0, 0, PRIMARY)
        };
        assert!(role_updates(&[vnode(0, 0, None)], &[unobserved]).is_empty());
    }
}
