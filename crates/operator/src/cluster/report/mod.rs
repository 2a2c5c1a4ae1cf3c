//! Reporting: the ValkeyCluster status (written only when it changed), the live role of every
//! ValkeyNode, the events of the pass, and when to look again.

pub mod facts;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{debug, info};
use valkey_api::labels::CLUSTER_FIELD_MANAGER;
use valkey_api::status::ClusterState;
use valkey_api::{ValkeyCluster, ValkeyNode};
use valkey_ops::Topology;

use super::Context;
use super::live::live_role;
use super::operation;
use super::plan::Balance;
use super::steps::Moved;
use super::steps::Step;
use crate::node::status_writes::{ClusterFields, apply_cluster_fields};
use crate::status::{self, EventSpec, Facts};

/// Errors of reporting: the status could not be written (the pass is retried).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The status patch failed.
    #[error("writing the status: {0}")]
    Status(#[source] kube::Error),
}

/// What a pass reports.
pub struct Report<'a> {
    /// The facts the conditions are derived from.
    pub facts: Facts,
    /// Per-shard status entries.
    pub shards: Vec<valkey_api::status::ShardStatus>,
    /// The step the pass executed, if any.
    pub step: Option<&'a Step>,
    /// The slot balance observed before the step.
    pub balance: &'a Balance,
    /// What the step moved.
    pub moved: Option<Moved>,
    /// Whether the pass changed something (look again soon).
    pub acted: bool,
    /// Look again no later than this (a rolling update settling).
    pub retry_in: Option<Duration>,
    /// Events of the pass (transition events are added here).
    pub events: Vec<EventSpec>,
    /// When the pass ran.
    pub now: Time,
    /// `status.tls`.
    pub tls: Option<valkey_api::status::TlsStatus>,
    /// `status.acceptedConfig` (see [`super::config_gate`]).
    pub accepted_config: Option<valkey_api::status::AcceptedConfig>,
    /// `status.rejectedConfig`.
    pub rejected_config: Option<valkey_api::status::RejectedConfig>,
}

/// ValkeyNodes whose `status.role` differs from the live role of their pod: (ValkeyNode name,
/// live role). Unobservable members are left as they are.
pub fn role_updates(nodes: &[ValkeyNode], topology: &Topology) -> Vec<(String, String)> {
    nodes
        .iter()
        .filter_map(|n| {
            let role = live_role(topology.at(n.spec.shard_index, n.spec.node_index)?)?;
            let current = n.status.as_ref().and_then(|s| s.role.as_deref());
            (current != Some(role)).then(|| (n.name_any(), role.to_owned()))
        })
        .collect()
}

/// Records every ValkeyNode's live role when it changed (with the cluster controller's other
/// status fields, see `node/status_writes.rs`).
pub async fn record_roles(api: &Api<ValkeyNode>, nodes: &[ValkeyNode], topology: &Topology) {
    let updates: Vec<(String, ClusterFields)> = role_updates(nodes, topology)
        .into_iter()
        .filter_map(|(name, role)| {
            let node = nodes.iter().find(|n| n.name_any() == name)?;
            let fields = ClusterFields {
                role: Some(role),
                ..ClusterFields::of(node)
            };
            Some((name, fields))
        })
        .collect();
    // A few at once: a new large cluster records every node's role in one pass.
    crate::bounded::map_in_order(
        &updates,
        ROLE_WRITES_IN_FLIGHT,
        |(name, fields)| async move {
            if let Err(e) = apply_cluster_fields(api, name, fields).await {
                debug!(node = %name, error = %e, "could not record the live role");
            }
        },
    )
    .await;
}

/// How many role writes are in flight at once.
const ROLE_WRITES_IN_FLIGHT: usize = 16;

/// How soon to look again: at once while a step acts, a shard has no writer (its takeover, or
/// Valkey's own election, should be acted on or observed within a second) or a change is still
/// gossiping (Ready follows within a second of convergence), every 10 s when
/// Ready (a change that touches no Kubernetes object, such as a partition and the election it
/// causes, shows in the status within that time; a pass only reads), otherwise soon.
pub fn requeue(acted: bool, urgent: bool, state: ClusterState) -> Duration {
    if acted || urgent {
        Duration::from_secs(1)
    } else if state == ClusterState::Ready {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(3)
    }
}

/// Writes the status when it changed, publishes the events and returns the requeue.
pub async fn report(
    ctx: &Context,
    vc: &ValkeyCluster,
    mut r: Report<'_>,
) -> Result<Action, ReportError> {
    let ns = vc.namespace().unwrap_or_default();
    let name = vc.name_any();
    let urgent = r.facts.topology.missing_shards > 0 || r.facts.topology.unconverged_nodes > 0;
    let mut new_status = status::next_status(
        vc.status.as_ref(),
        &r.facts,
        r.shards,
        vc.meta().generation,
        &r.now,
    );
    new_status.operation = operation::operation(
        operation::Pass {
            step: r.step,
            balance: r.balance,
            moved: r.moved,
            now: &r.now,
        },
        vc.status.as_ref().and_then(|s| s.operation.as_ref()),
    );
    new_status.tls = r.tls.take();
    new_status.accepted_config = r.accepted_config.take();
    new_status.rejected_config = r.rejected_config.take();
    let metrics = &ctx.shared.metrics;
    metrics.set_cluster_state(&ns, &name, new_status.state);
    let t = &r.facts.topology;
    metrics.set_cluster_figures(
        &ns,
        &name,
        crate::metrics::ClusterFigures {
            desired_shards: i64::from(r.facts.desired_shards),
            ready_shards: i64::from(t.ready_shards),
            slots_assigned: i64::from(t.slots_assigned),
            slots_to_move: i64::from(t.slots_to_move),
        },
    );
    r.events
        .extend(status::transition_events(vc.status.as_ref(), &new_status));
    let failovers = r
        .events
        .iter()
        .filter(|e| e.reason == valkey_api::status::event::FAILOVER_COMPLETED)
        .count();
    if failovers > 0 {
        metrics.failovers(&ns, &name, u64::try_from(failovers).unwrap_or(u64::MAX));
    }
    if status::changed(vc.status.as_ref(), &new_status) {
        let api: Api<ValkeyCluster> = Api::namespaced(ctx.shared.client.clone(), &ns);
        let mut patch = serde_json::json!({ "status": new_status });
        // `status.restore` is the restore's (`backup/restore.rs`): never written back from
        // this pass's copy, which may be older.
        if let Some(st) = patch["status"].as_object_mut() {
            st.remove("restore");
        }
        // A merge patch keeps fields it does not name: clear those that are gone.
        for (field, gone) in [
            ("operation", new_status.operation.is_none()),
            ("tls", new_status.tls.is_none()),
            ("acceptedConfig", new_status.accepted_config.is_none()),
            ("rejectedConfig", new_status.rejected_config.is_none()),
        ] {
            if gone {
                patch["status"][field] = serde_json::Value::Null;
            }
        }
        match api
            .patch_status(
                &name,
                &PatchParams::apply(CLUSTER_FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
        {
            // Deleted during the pass: nothing left to report.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::await_change()),
            r => r.map_err(ReportError::Status)?,
        };
        info!(state = ?new_status.state, reason = ?new_status.reason, "status updated");
    }
    ctx.shared.publish(&vc.object_ref(&()), &r.events).await;
    let after = requeue(r.acted, urgent, new_status.state);
    Ok(Action::requeue(r.retry_in.map_or(after, |d| d.min(after))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use valkey_ops::model::ClusterNodes;
    use valkey_ops::{Member, NodeView};

    fn member(shard: i32, index: i32, nodes: &str) -> Member {
        let mut view = NodeView::from_nodes(ClusterNodes::parse(nodes).expect("nodes"));
        view.cluster_ok = true;
        view.primary_link_up = true;
        Member {
            shard,
            index,
            pod: format!("p-{shard}-{index}"),
            addr: format!("10.0.0.{}:6379", index + 1)
                .parse()
                .expect("address"),
            refused: false,
            auth_refused: None,
            error: None,
            view: Some(view),
        }
    }

    fn vnode(shard: i32, index: i32, role: Option<&str>) -> ValkeyNode {
        let mut n: ValkeyNode = serde_json::from_value(serde_json::json!({
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

    const PRIMARY: &str = "aaa 10.0.0.2:6379@16379 myself,master - 0 0 1 connected 0-16383\n\
                           bbb 10.0.0.1:6379@16379 slave aaa 0 1 1 connected\n";
    const REPLICA: &str = "aaa 10.0.0.2:6379@16379 master - 0 0 1 connected 0-16383\n\
                           bbb 10.0.0.1:6379@16379 myself,slave aaa 0 1 1 connected\n";

    #[test]
    fn roles_come_from_the_live_view_and_are_patched_only_on_change() {
        // After a failover the node-index-1 pod is the primary.
        let members = Topology::new(vec![member(0, 0, REPLICA), member(0, 1, PRIMARY)]);
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
        assert!(role_updates(&[vnode(0, 0, None)], &Topology::new(vec![unobserved])).is_empty());
    }

    #[test]
    fn requeue_is_fast_while_acting_or_without_a_writer() {
        assert_eq!(
            requeue(true, false, ClusterState::Ready),
            Duration::from_secs(1)
        );
        assert_eq!(
            requeue(false, true, ClusterState::Reconciling),
            Duration::from_secs(1)
        );
        assert_eq!(
            requeue(false, false, ClusterState::Ready),
            Duration::from_secs(10)
        );
        assert_eq!(
            requeue(false, false, ClusterState::Degraded),
            Duration::from_secs(3)
        );
    }
}
