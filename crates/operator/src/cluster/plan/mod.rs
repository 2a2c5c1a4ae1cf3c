//! Planning (pure): from the observed world, the one risky step of a pass.
//!
//! In priority order: a failover a shard without a writer needs ([`failover`]), the hand-over
//! of a primary whose pod is being deleted ([`handover`]), the rest of the topology of the
//! layout (MEET, re-MEET, slot assignment, replica attachment, forgetting a departed node;
//! [`topology`]), the hand-over of a surplus primary ([`removal`]), slots left half-migrated,
//! the next batch of the slot balance ([`rebalance`]), the retirement of surplus ValkeyNodes
//! that serve nothing ([`removal`]), the next rolling-update step ([`roll`]), then a primary's
//! failback to its node-index-0 pod once the cluster is quiet ([`home_primaries`]). At most one step is returned;
//! running it is [`super::steps`]' job, and the next pass plans again from the live view, so
//! an interrupted step is resumed from what the cluster shows, never from memory.

pub mod failover;
mod handover;
mod home_primaries;
pub mod rebalance;
mod removal;
pub mod roll;
pub mod shards;
#[cfg(test)]
pub(crate) mod testworld;
mod topology;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use valkey_api::ValkeyNode;
use valkey_api::status::ShardStatus;
use valkey_ops::{Layout, Topology};

pub use failover::FailoverTiming;
pub use rebalance::{Balance, KEY_MIGRATION_BATCH_SLOTS, REBALANCE_BATCH_SLOTS};

use shards::{TopologyFacts, analyze};

use crate::cluster::steps::{self, Step};

/// What planning reads.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The desired layout.
    pub layout: Layout,
    /// Every member (inside and outside the layout).
    pub topology: &'a Topology,
    /// IPs of the cluster's pods that still exist (a primary whose IP no pod holds is gone for certain).
    pub pod_ips: &'a BTreeSet<IpAddr>,
    /// IP → name of the cluster's pods being deleted that still run (see [`handover`]).
    pub terminating: &'a BTreeMap<IpAddr, String>,
    /// The ValkeyNodes as observed.
    pub nodes: &'a [ValkeyNode],
    /// The ValkeyNodes as built this pass (the current workload revisions).
    pub desired_nodes: &'a [ValkeyNode],
    /// The cluster's failure-detection timing (bounds of the failover rule).
    pub timing: FailoverTiming,
    /// When the pass runs (a rolling update's settle time, see [`roll::ROLL_SETTLE`]).
    pub now: k8s_openapi::jiff::Timestamp,
    /// The failback quiet period, `None` when failback is disabled (see [`home_primaries`]).
    pub failback: Option<std::time::Duration>,
    /// The shard entries of the status so far (the failback due times they keep).
    pub previous_shards: &'a [ShardStatus],
}

/// The plan of a pass: its step and the facts the status is derived from.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The one step to execute, if any.
    pub step: Option<Step>,
    /// The live topology of the layout, summarised.
    pub facts: TopologyFacts,
    /// Per-shard status entries.
    pub shards: Vec<ShardStatus>,
    /// The rolling update's Progressing message while one is under way.
    pub roll_progress: Option<String>,
    /// How far the slots are from the balance of the layout.
    pub balance: Balance,
    /// ValkeyNodes outside the layout still to be removed.
    pub surplus_nodes: usize,
    /// ValkeyNodes whose status does not describe their current spec yet.
    pub unobserved_nodes: usize,
    /// Look again after this long: a rolling update waits for its nodes to settle.
    pub retry_in: Option<std::time::Duration>,
}

/// The layout `vc` asks for.
pub fn layout(vc: &valkey_api::ValkeyCluster) -> Layout {
    Layout {
        shards: vc.spec.shards.max(0),
        replicas: vc.spec.replicas.max(0),
    }
}

/// The failure-detection timing of `vc` (its `cluster-node-timeout` and `repl-timeout`, else
/// the operator's and Valkey's defaults).
pub fn failover_timing(vc: &valkey_api::ValkeyCluster) -> FailoverTiming {
    let default = FailoverTiming::default();
    let ms = |key: &str, scale: u64, fallback: u64| {
        vc.spec
            .config_value(key)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(fallback, |v| v.saturating_mul(scale))
    };
    FailoverTiming {
        node_timeout_ms: ms("cluster-node-timeout", 1, default.node_timeout_ms),
        repl_timeout_ms: ms("repl-timeout", 1000, default.repl_timeout_ms),
    }
}

/// Plans one pass.
pub fn plan(input: &Input<'_>) -> Plan {
    let within = input.topology.within(input.layout);
    let (mut facts, shards) = analyze(input.layout, &within);
    let layout_nodes: Vec<ValkeyNode> = input
        .nodes
        .iter()
        .filter(|n| input.layout.contains(n.spec.shard_index, n.spec.node_index))
        .cloned()
        .collect();
    let balance = rebalance::balance(input.layout, input.topology);
    let surplus_nodes = input.nodes.len() - layout_nodes.len();
    let settle_left = roll::settle_left(&layout_nodes, input.now);
    let failover =
        failover::failover_decision(input.layout, &within, Some(input.pod_ips), input.timing);
    facts.failover_stuck = failover
        .waits
        .iter()
        .find_map(|w| w.stuck_message(input.timing));
    let healthy = facts.cluster_ok
        && facts.missing_shards == 0
        && facts.missing_replicas == 0
        && facts.unjoined_nodes == 0
        && !balance.is_pending()
        && surplus_nodes == 0;
    let step = failover
        .step
        .or_else(|| handover::terminating_primary(&within, input.terminating))
        .or_else(|| {
            let recorded = input
                .previous_shards
                .iter()
                .filter(|s| !s.slots.is_empty())
                .map(|s| s.index)
                .collect();
            topology::topology_step(input.layout, &within, Some(input.pod_ips), &recorded)
        })
        .or_else(|| removal::surplus(input.layout, input.topology, input.nodes))
        .or_else(|| rebalance::open_slots_step(input.layout, input.topology))
        .or_else(|| rebalance::rebalance_step(input.layout, input.topology))
        .or_else(|| {
            match roll::next_roll(&layout_nodes, &within, healthy && settle_left.is_none())? {
                roll::RollStep::Authorize { node } => {
                    let desired = input.desired_nodes.iter().find(|d| d.name_any() == node)?;
                    Some(Step::AuthorizeRoll(steps::AuthorizeRoll {
                        node: Box::new(roll::authorized(desired)),
                    }))
                }
                roll::RollStep::Failover {
                    replica,
                    shard,
                    primary,
                } => Some(Step::HandOver(steps::HandOver {
                    replica,
                    shard,
                    primary,
                })),
            }
        });
    let roll_progress = roll::progress(&layout_nodes);
    let unobserved_nodes = input.nodes.iter().filter(|n| roll::unobserved(n)).count();
    let quiet = home_primaries::Quiet {
        changing: step.is_some()
            || roll_progress.is_some()
            || balance.is_pending()
            || surplus_nodes > 0
            || unobserved_nodes > 0
            || facts.missing_shards > 0
            || facts.unjoined_nodes > 0,
        settled: healthy
            && facts.unconverged_nodes == 0
            && settle_left.is_none()
            && roll::all_ready(&layout_nodes),
    };
    let failbacks = home_primaries::failbacks(
        input.layout,
        &within,
        input.previous_shards,
        input.failback,
        quiet,
        input.now,
    );
    let shards = shards
        .into_iter()
        .map(|s| ShardStatus {
            failback_at: failbacks.due.get(&s.index).map(|t| Time(*t)),
            ..s
        })
        .collect();
    let roll_retry = settle_left.filter(|_| step.is_none() && roll_progress.is_some());
    let step = step.or(failbacks.step.clone());
    let failback_retry = failbacks.next_in(input.now).filter(|_| step.is_none());
    Plan {
        retry_in: roll_retry.into_iter().chain(failback_retry).min(),
        unobserved_nodes,
        step,
        facts,
        shards,
        roll_progress,
        balance,
        surplus_nodes,
    }
}
