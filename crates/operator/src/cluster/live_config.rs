//! Live settings (`maxmemory`, `maxmemory-policy`, `maxclients`): applied with `CONFIG SET` to
//! every reachable pod without rolling it, and reported as the ValkeyNode condition
//! `LiveConfigApplied` (absent when the node has no live setting). The rendered `valkey.conf`
//! carries the same values, so a restarted pod starts with them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Resource;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::{debug, info, warn};
use valkey_api::ValkeyNode;
use valkey_ops::client::NodePool;
use valkey_ops::commands::config_set;

use super::topology::Member;

/// ValkeyNode condition type.
pub const LIVE_CONFIG_APPLIED: &str = "LiveConfigApplied";
/// Reason: every live setting has its desired value.
pub const APPLIED: &str = "Applied";
/// Reason: `CONFIG SET` was refused or failed.
pub const APPLY_FAILED: &str = "ApplyFailed";
/// Warning event on the ValkeyNode when applying fails.
pub const APPLY_FAILED_EVENT: &str = "LiveConfigApplyFailed";

/// What applying the live settings to one node gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The node has every live setting (some may just have been set).
    Applied,
    /// `CONFIG SET` failed with this message.
    Failed(String),
    /// The pod could not be reached this pass: nothing is concluded.
    Unobserved,
}

/// The node's conditions with `LiveConfigApplied` set for `outcome` (or removed when the node
/// has no live setting); `None` when they would not change (no write).
pub fn updated_conditions(
    node: &ValkeyNode,
    outcome: &Outcome,
    now: &Time,
) -> Option<Vec<Condition>> {
    let current = node
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let existing = current.iter().find(|c| c.type_ == LIVE_CONFIG_APPLIED);
    let keys: Vec<&str> = node
        .spec
        .config
        .live
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    if keys.is_empty() {
        existing?;
        return Some(
            current
                .into_iter()
                .filter(|c| c.type_ != LIVE_CONFIG_APPLIED)
                .collect(),
        );
    }
    let (status, reason, message) = match outcome {
        Outcome::Applied => (
            "True",
            APPLIED,
            format!("live settings in effect: {}", keys.join(", ")),
        ),
        Outcome::Failed(m) => ("False", APPLY_FAILED, m.clone()),
        Outcome::Unobserved => return None,
    };
    if existing.is_some_and(|c| {
        c.status == status
            && c.reason == reason
            && c.message == message
            && c.observed_generation == node.metadata.generation
    }) {
        return None;
    }
    let transition = existing
        .filter(|c| c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    let condition = Condition {
        type_: LIVE_CONFIG_APPLIED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: transition,
        observed_generation: node.metadata.generation,
    };
    let mut out: Vec<Condition> = current
        .into_iter()
        .filter(|c| c.type_ != LIVE_CONFIG_APPLIED)
        .collect();
    out.push(condition);
    Some(out)
}

/// Applies the live settings of every ValkeyNode in `desired` to its reachable pod, records
/// `LiveConfigApplied` on the observed ValkeyNodes when it changes, and emits
/// `LiveConfigApplyFailed` when a node enters the failed state.
pub async fn reconcile(
    pool: &NodePool,
    api: &Api<ValkeyNode>,
    recorder: &Recorder,
    desired: &[ValkeyNode],
    observed: &[ValkeyNode],
    members: &[Member],
    now: &Time,
) {
    for node in observed {
        let Some(want) = desired.iter().find(|d| d.name_any() == node.name_any()) else {
            continue;
        };
        let mut node = node.clone();
        node.spec.config.live = want.spec.config.live.clone();
        let params: Vec<(&str, &str)> = want
            .spec
            .config
            .live
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let member = members.iter().find(|m| {
            m.shard == node.spec.shard_index && m.index == node.spec.node_index && m.view.is_some()
        });
        let outcome = match member {
            _ if params.is_empty() => Outcome::Applied,
            None => Outcome::Unobserved,
            Some(m) => match config_set(pool, &m.addr, &params).await {
                Ok(changed) => {
                    if !changed.is_empty() {
                        info!(node = %node.name_any(), ?changed, "live settings applied");
                    }
                    Outcome::Applied
                }
                Err(e) => Outcome::Failed(format!("CONFIG SET on {}: {e}", m.addr)),
            },
        };
        let Some(conditions) = updated_conditions(&node, &outcome, now) else {
            continue;
        };
        let patch = serde_json::json!({ "status": { "conditions": conditions } });
        if let Err(e) = api
            .patch_status(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            debug!(node = %node.name_any(), error = %e, "could not record LiveConfigApplied");
            continue;
        }
        if let Outcome::Failed(message) = &outcome {
            warn!(node = %node.name_any(), %message, "live settings not applied");
            let ev = Event {
                type_: EventType::Warning,
                reason: APPLY_FAILED_EVENT.to_owned(),
                note: Some(message.chars().take(1000).collect()),
                action: "ApplyLiveConfig".to_owned(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&ev, &node.object_ref(&())).await {
                warn!(node = %node.name_any(), error = %e, "publishing event failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn node(live: &[(&str, &str)], conditions: Vec<Condition>) -> ValkeyNode {
        let mut n: ValkeyNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyNode",
            "metadata": {"name": "c-0-0", "generation": 3},
            "spec": {"clusterName": "c", "shardIndex": 0, "nodeIndex": 0,
                     "image": "valkey/valkey:9.0.0", "terminationGracePeriodSeconds": 30},
        }))
        .expect("valkeynode");
        if !live.is_empty() {
            n.spec.config.live = Some(
                live.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
        }
        n.status = Some(valkey_api::ValkeyNodeStatus {
            conditions,
            ..Default::default()
        });
        n
    }

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).expect("time"))
    }

    #[test]
    fn applied_once_then_no_writes() {
        let n = node(&[("maxmemory", "64mb")], vec![]);
        let c = updated_conditions(&n, &Outcome::Applied, &at(10)).expect("set");
        let live = c
            .iter()
            .find(|c| c.type_ == LIVE_CONFIG_APPLIED)
            .expect("condition");
        assert_eq!(
            (live.status.as_str(), live.reason.as_str()),
            ("True", APPLIED)
        );
        assert_eq!(live.observed_generation, Some(3));
        let mut n = node(&[("maxmemory", "64mb")], c);
        assert_eq!(updated_conditions(&n, &Outcome::Applied, &at(20)), None);
        assert_eq!(updated_conditions(&n, &Outcome::Unobserved, &at(20)), None);
        // A new generation of the node is acknowledged once, keeping the transition time.
        n.metadata.generation = Some(4);
        let c = updated_conditions(&n, &Outcome::Applied, &at(30)).expect("set");
        assert_eq!(c[0].observed_generation, Some(4));
        assert_eq!(c[0].last_transition_time, at(10));
    }

    #[test]
    fn failure_is_recorded_and_other_conditions_kept() {
        let ready = Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "PodRunning".into(),
            message: String::new(),
            last_transition_time: at(1),
            observed_generation: Some(3),
        };
        let n = node(&[("maxclients", "10")], vec![ready.clone()]);
        let c = updated_conditions(&n, &Outcome::Failed("refused".into()), &at(10)).expect("set");
        assert_eq!(c[0], ready);
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("False", APPLY_FAILED)
        );
        assert_eq!(c[1].last_transition_time, at(10));
    }

    #[test]
    fn condition_removed_when_no_live_setting_is_left() {
        let n = node(&[("maxmemory", "64mb")], vec![]);
        let c = updated_conditions(&n, &Outcome::Applied, &at(10)).expect("set");
        let n = node(&[], c);
        assert_eq!(
            updated_conditions(&n, &Outcome::Applied, &at(20)),
            Some(vec![])
        );
        let n = node(&[], vec![]);
        assert_eq!(updated_conditions(&n, &Outcome::Applied, &at(20)), None);
    }
}
