//! What a pass reports (pure): the facts the conditions derive from and what the cluster is
//! busy with, computed from the outputs of the pass's stages.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use valkey_api::{ValkeyCluster, ValkeyNode};

use super::Report;
use crate::cluster::apply::ApplyReport;
use crate::cluster::build::Desired;
use crate::cluster::config_gate::Gate;
use crate::cluster::live;
use crate::cluster::observe::{self, Observed};
use crate::cluster::plan::shards::TopologyFacts;
use crate::cluster::plan::{Balance, Plan};
use crate::cluster::steps::Outcome;
use crate::cluster::tls_secret::TlsCheck;
use crate::status::{Activity, Facts, Progress};

/// The outputs of a pass's stages, as the report reads them.
pub struct Stages<'a> {
    /// The cluster as the user asked for it.
    pub requested: &'a ValkeyCluster,
    /// The cluster with the image and settings the config gate let through.
    pub effective: &'a ValkeyCluster,
    /// What observation found.
    pub observed: &'a Observed,
    /// The config gate's verdict.
    pub gate: &'a Gate,
    /// What was built.
    pub desired: &'a Desired,
    /// What applying the children did.
    pub applied: &'a ApplyReport,
    /// The plan of the pass.
    pub plan: &'a Plan,
    /// What the step did.
    pub outcome: &'a Outcome,
    /// What the live settings, ACL and TLS pass did.
    pub live: &'a live::Summary,
    /// The TLS Secret as the pass saw it.
    pub tls: &'a TlsCheck,
    /// When the pass ran.
    pub now: Timestamp,
}

/// The report of a pass: its facts, status fields and events.
pub fn assemble<'a>(s: &Stages<'a>) -> Report<'a> {
    let mut events = s.applied.events.clone();
    events.extend(s.outcome.events.iter().cloned());
    events.extend(s.live.events.iter().cloned());
    Report {
        facts: derive(s),
        tls: s
            .tls
            .wanted
            .as_ref()
            .map(|w| valkey_api::status::TlsStatus {
                certificate_sha256: w.fingerprint.clone(),
                serving_pods: i32::try_from(s.live.tls_serving).unwrap_or(i32::MAX),
                pods: i32::try_from(s.observed.nodes.len()).unwrap_or(i32::MAX),
            }),
        accepted_config: s.gate.accepted.clone(),
        rejected_config: s.gate.rejected.clone(),
        shards: s.plan.shards.clone(),
        step: s.plan.step.as_ref(),
        balance: &s.plan.balance,
        moved: s.outcome.moved,
        acted: s.outcome.acted,
        retry_in: s.plan.retry_in,
        events,
        now: Time(s.now),
    }
}

/// The facts the conditions are derived from.
pub fn derive(s: &Stages<'_>) -> Facts {
    let (vc, observed, plan) = (s.effective, s.observed, s.plan);
    let spec = &vc.spec;
    Facts {
        invalid_tls: s.tls.invalid.clone(),
        resize_infeasible: resize_infeasible(&observed.nodes),
        invalid_config: s.gate.warning(&s.requested.spec),
        desired_shards: vc.spec.shards.max(0),
        apply_error: s.applied.failure.clone(),
        unschedulable: observed
            .pods
            .iter()
            .find_map(observe::unschedulable_message),
        pod_creation_failed: observed.nodes.iter().find_map(observe::pod_creation_failure),
        acl_admin_warning: crate::render::acl::acl_admin_warning(spec),
        system_users_refused: observe::system_users_refused(&observed.topology),
        unready_pods: observe::unready(&observed.pods, crate::cluster::plan::layout(vc)),
        unreachable_pods: observe::unreachable(&observed.topology, &observed.pods),
        restore: crate::status::RestoreGate::of(s.requested),
        shard_restart: crate::status::shard_restart::shard_restart(
            observed
                .pods
                .iter()
                .filter_map(|p| Some((observe::position(p)?.0, p))),
            &crate::status::shard_restart::served_shards(vc.status.as_ref()),
            spec,
            s.now,
        ),
        grace_period_warning: spec.grace_period_too_short().then(|| {
            format!(
                "terminationGracePeriodSeconds {} is below the recommended {} s (cluster-manual-failover-timeout + 10 s): a primary may be killed before its replica takes over",
                spec.termination_grace_period_seconds(),
                spec.recommended_termination_grace_period_seconds()
            )
        }),
        topology: TopologyFacts {
            slots_to_move: match &plan.balance {
                Balance::Moving { remaining, .. } | Balance::NoRoom { remaining, .. } => {
                    u32::try_from(*remaining).unwrap_or(u32::MAX)
                }
                _ => 0,
            },
            surplus_nodes: i32::try_from(plan.surplus_nodes).unwrap_or(i32::MAX),
            balance_blocked: match &plan.balance {
                Balance::Blocked(why) => Some(why.clone()),
                _ => None,
            },
            drain_no_room: match &plan.balance {
                Balance::NoRoom { reason, .. } => Some(reason.clone()),
                _ => None,
            },
            ..plan.facts.clone()
        },
        progress: progress(s),
        step_failure: s.outcome.failure.clone(),
    }
}

/// What the cluster is busy with, most specific first: nodes just created, a rolling update,
/// nodes updated, the step's own progress, a slot balance, surplus nodes, pods waiting for the
/// new TLS or ACL files, a config check, users' rules waiting for a server.
fn progress(s: &Stages<'_>) -> Option<Progress> {
    let (plan, applied, live) = (s.plan, s.applied, s.live);
    if applied.created_nodes > 0 {
        return Some(Progress::new(
            Activity::AddingNodes,
            format!("created {} ValkeyNodes", applied.created_nodes),
        ));
    }
    if let Some(p) = &plan.roll_progress {
        return Some(Progress::new(Activity::UpdatingNodes, p.clone()));
    }
    if applied.updated_nodes > 0 {
        return Some(Progress::new(
            Activity::UpdatingNodes,
            format!("updated {} ValkeyNodes", applied.updated_nodes),
        ));
    }
    // Until the ValkeyNode controller has seen a new spec, a roll it is about to hold back
    // does not show: the cluster is not Ready yet.
    if plan.unobserved_nodes > 0 {
        return Some(Progress::new(
            Activity::UpdatingNodes,
            format!(
                "waiting for {} ValkeyNodes to report on their new spec",
                plan.unobserved_nodes
            ),
        ));
    }
    s.outcome
        .progress
        .clone()
        .or_else(|| match &plan.balance {
            Balance::Moving {
                remaining,
                draining,
            } => Some(Progress::new(
                Activity::RebalancingSlots,
                if draining.is_empty() {
                    format!("{remaining} slots still move to balance the shards")
                } else {
                    let d: Vec<String> = draining.iter().map(ToString::to_string).collect();
                    format!(
                        "draining shard(s) {}: {remaining} slots still move",
                        crate::text::list("shards", &d)
                    )
                },
            )),
            _ => None,
        })
        .or_else(|| {
            (plan.surplus_nodes > 0).then(|| {
                Progress::new(
                    Activity::Reconciling,
                    format!(
                        "removing {} ValkeyNodes outside the layout",
                        plan.surplus_nodes
                    ),
                )
            })
        })
        .or_else(|| {
            (live.tls_pending > 0).then(|| {
                Progress::new(
                    Activity::UpdatingNodes,
                    format!(
                        "waiting for {} pods to serve the TLS Secret's new certificate",
                        live.tls_pending
                    ),
                )
            })
        })
        .or_else(|| {
            (live.acl_pending > 0).then(|| {
                Progress::new(
                    Activity::UpdatingNodes,
                    format!(
                        "waiting for {} pods to see the new ACL file",
                        live.acl_pending
                    ),
                )
            })
        })
        .or_else(|| {
            s.gate
                .checking(&s.requested.spec)
                .map(|m| Progress::new(Activity::Reconciling, m))
        })
        .or_else(|| {
            (s.desired.users_unchecked > 0).then(|| {
                Progress::new(
                    Activity::UpdatingNodes,
                    format!(
                        "waiting for a server to check the rules of {} users",
                        s.desired.users_unchecked
                    ),
                )
            })
        })
}

/// The ValkeyNodes whose claim cannot grow (their `PersistentVolumeClaimSizeReady` condition,
/// reason `PersistentVolumeClaimResizeInfeasible`): the cluster's warning message.
fn resize_infeasible(nodes: &[ValkeyNode]) -> Option<String> {
    use valkey_api::status::{node_condition, node_reason};
    let stuck: Vec<(String, String)> = nodes
        .iter()
        .filter_map(|n| {
            let c = n.status.as_ref()?.conditions.iter().find(|c| {
                c.type_ == node_condition::PVC_SIZE_READY
                    && c.reason == node_reason::PVC_RESIZE_INFEASIBLE
            })?;
            Some((n.name_any(), c.message.clone()))
        })
        .collect();
    let (first, why) = stuck.first()?;
    Some(format!(
        "{} ValkeyNode claims cannot grow (first, {first}: {why}); use a StorageClass with allowVolumeExpansion or set spec.persistence.size back",
        stuck.len()
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use valkey_ops::client::{ClientConfig, NodePool};

    use super::*;
    use crate::cluster::{build, config_gate, plan};
    use crate::render::secrets::system_passwords;

    fn cluster() -> ValkeyCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"shards": 3, "replicas": 1}
        }))
        .unwrap()
    }

    fn observed() -> Observed {
        Observed {
            system_secret: None,
            system_backup_secret: None,
            acl_secret: None,
            service: None,
            config_map: None,
            pdbs: Vec::new(),
            network_policy: None,
            nodes: Vec::new(),
            pods: Vec::new(),
            check_pods: Vec::new(),
            user_secrets: BTreeMap::new(),
            passwords: system_passwords(&[]),
            tls_secret: None,
            tls_ca: None,
            topology: Default::default(),
            pod_ips: Default::default(),
            pod_zones: Default::default(),
            terminating: Default::default(),
            pool: NodePool::new(ClientConfig::new("_operator", "pw")),
        }
    }

    /// The plan and facts of a pass over `observed`, with what applying and the live pass did.
    fn pass_over(
        vc: &ValkeyCluster,
        observed: &Observed,
        applied: &ApplyReport,
        live: &live::Summary,
    ) -> (Plan, Facts) {
        let gate = config_gate::gate(vc, &[], false);
        let desired = build::build(vc, observed, &BTreeMap::new(), &gate);
        let plan = plan::plan(&crate::cluster::controller::plan_input(
            vc, vc, observed, &desired,
        ));
        let facts = derive(&Stages {
            requested: vc,
            effective: vc,
            observed,
            gate: &gate,
            desired: &desired,
            applied,
            plan: &plan,
            outcome: &Outcome::default(),
            live,
            tls: &TlsCheck::default(),
            now: Timestamp::now(),
        });
        (plan, facts)
    }

    /// The facts of a first pass over an empty cluster, with what applying and the live pass
    /// did.
    fn first_pass(applied: &ApplyReport, live: &live::Summary) -> Facts {
        pass_over(&cluster(), &observed(), applied, live).1
    }

    #[test]
    fn facts_of_a_first_pass_name_what_the_cluster_is_busy_with() {
        let created = ApplyReport {
            created_nodes: 6,
            ..Default::default()
        };
        let f = first_pass(&created, &live::Summary::default());
        assert_eq!(f.desired_shards, 3);
        assert_eq!(f.topology.missing_shards, 3);
        let p = f.progress.expect("busy");
        assert_eq!(p.activity, Activity::AddingNodes);
        assert_eq!(p.message, "created 6 ValkeyNodes");

        // Nothing created: the pods that wait for the ACL file are what remains.
        let waiting = live::Summary {
            acl_pending: 2,
            ..Default::default()
        };
        let f = first_pass(&ApplyReport::default(), &waiting);
        let p = f.progress.expect("busy");
        assert_eq!(p.message, "waiting for 2 pods to see the new ACL file");
        assert!(f.apply_error.is_none() && f.step_failure.is_none());
    }

    /// A 1,000-shard cluster (2,000 pods) whose every pod is Ready for Kubernetes but
    /// unreachable for the operator, in a rolling update, draining, with every shard restarted
    /// and every step failing on every target: no condition or event message exceeds the API's
    /// limits before any clamping, and each says how many it summarises.
    #[tokio::test]
    async fn the_messages_of_a_1000_shard_cluster_stay_within_the_api_limits() {
        use std::net::SocketAddr;

        use crate::cluster::operation::{self, Pass};
        use crate::cluster::steps::{self, Step, Transfer};
        use crate::cluster::steps::{Reporting, TargetError, each_target};
        use crate::status::{FailureKind, next_status, transition_events};
        use crate::text::{CONDITION_MESSAGE_MAX, EVENT_NOTE_MAX};
        use valkey_api::labels;
        use valkey_ops::{Member, Topology};

        const SHARDS: i32 = 1000;
        let mut vc = cluster();
        vc.spec.shards = SHARDS;
        let addr = |s: i32, i: i32| -> SocketAddr {
            format!("10.{}.{}.{}:6379", s / 250, s % 250, i + 1)
                .parse()
                .unwrap()
        };
        let positions: Vec<(i32, i32)> = (0..SHARDS).flat_map(|s| [(s, 0), (s, 1)]).collect();
        let mut observed = observed();
        observed.pods = positions
            .iter()
            .map(|&(s, i)| {
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("c-{s}-{i}"), "labels": {
                        labels::SHARD_INDEX: s.to_string(), labels::NODE_INDEX: i.to_string()}},
                    "status": {"phase": "Running", "podIP": addr(s, i).ip().to_string(),
                        "conditions": [{"type": "Ready", "status": "True"}]},
                }))
                .unwrap()
            })
            .collect();
        observed.topology = Topology::new(
            positions
                .iter()
                .map(|&(s, i)| Member {
                    shard: s,
                    index: i,
                    pod: format!("c-{s}-{i}"),
                    addr: addr(s, i),
                    view: None,
                    refused: false,
                    auth_refused: None,
                    error: Some(format!("timeout talking to {}", addr(s, i))),
                })
                .collect(),
        );
        let (plan, facts) = pass_over(
            &vc,
            &observed,
            &ApplyReport::default(),
            &live::Summary::default(),
        );
        assert_eq!(facts.unreachable_pods.len(), 2000);
        let now = Time(Timestamp::now());
        let status = next_status(None, &facts, plan.shards.clone(), Some(1), &now);
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason, "PodsUnreachable");
        assert!(
            ready
                .message
                .contains("2000 pods: c-0-0 (timeout talking to 10.0.0.1:6379)"),
            "{}",
            ready.message
        );
        let mut messages: Vec<(usize, String)> = status
            .conditions
            .iter()
            .map(|c| (CONDITION_MESSAGE_MAX, c.message.clone()))
            .collect();
        messages.extend(
            transition_events(None, &status)
                .into_iter()
                .map(|e| (EVENT_NOTE_MAX, e.note)),
        );

        // A step failing on every one of 1,000 targets: one Warning event, summarised.
        let mut out = Outcome::default();
        let targets: Vec<i32> = (0..SHARDS).collect();
        each_target(
            &mut out,
            &Reporting {
                action: "Replicate",
                done: None,
                failed: Some("ReplicaCreationFailed"),
                failure: Some(FailureKind::NodeAddFailed),
            },
            &targets,
            |s| async move {
                Err(valkey_ops::commands::CommandError::Refused(format!(
                    "shard {s} refuses"
                )))
            },
            |s, e| TargetError {
                event: format!("attaching c-{s}-1: {e}"),
                failure: format!("attaching c-{s}-1: {e}"),
            },
            |done| done.join(", "),
        )
        .await;
        assert_eq!(out.events.len(), 1);
        assert!(out.events[0].note.starts_with("1000 failures: "));
        messages.extend(out.events.into_iter().map(|e| (EVENT_NOTE_MAX, e.note)));
        messages.extend(out.failure.map(|f| (CONDITION_MESSAGE_MAX, f.message)));

        // Every node rolling, every shard draining into one, every shard restarted.
        let nodes: Vec<ValkeyNode> = positions
            .iter()
            .map(|&(s, i)| {
                let mut n: ValkeyNode = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("c-{s}-{i}"), "generation": 2,
                        "annotations": {}},
                    "spec": {"clusterName": "c", "shardIndex": s, "nodeIndex": i,
                        "image": "valkey/valkey:9.0.0", "terminationGracePeriodSeconds": 30},
                }))
                .unwrap();
                n.status = Some(valkey_api::ValkeyNodeStatus {
                    applied_workload_revision: Some("old".into()),
                    ..Default::default()
                });
                n
            })
            .collect();
        let rolling = plan::roll::progress(&nodes).expect("rolling");
        assert!(rolling.contains("2000 nodes: c-0-0, c-0-1,"), "{rolling}");
        messages.push((CONDITION_MESSAGE_MAX, rolling));
        let transfers: Vec<Transfer> = (1..SHARDS)
            .map(|s| Transfer {
                source: addr(s, 0),
                source_shard: s,
                target: addr(0, 0),
                target_id: "0".repeat(40),
                target_shard: 0,
                ranges: vec![valkey_ops::SlotRange::new(16, 16).unwrap()],
                draining: true,
            })
            .collect();
        let step = Step::MigrateSlots(steps::MigrateSlots {
            transfers,
            by_key: false,
            others: Vec::new(),
        });
        let balance = Balance::Moving {
            remaining: 16_000,
            draining: (1..SHARDS).collect(),
        };
        let op = operation::operation(
            Pass {
                step: Some(&step),
                balance: &balance,
                moved: None,
                now: &now,
            },
            None,
        )
        .expect("an operation");
        let detail = op.detail.unwrap_or_default();
        assert!(detail.contains("999 shards: 1, 2,"), "{detail}");
        assert!(
            detail.contains("999 transfers: 1 slots shard 1 -> 0,"),
            "{detail}"
        );
        messages.push((CONDITION_MESSAGE_MAX, detail));

        for (max, m) in &messages {
            assert!(m.len() <= *max, "{} bytes > {max}: {}…", m.len(), &m[..200]);
        }
        assert!(messages.len() >= 8, "{}", messages.len());
    }
}
