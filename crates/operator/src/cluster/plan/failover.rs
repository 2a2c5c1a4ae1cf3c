//! Operator-driven failover (pure): when a shard's slot-owning primary is down and Valkey's own
//! election cannot succeed or would only start late, which replica to promote and how.
//!
//! # The rule
//!
//! A slot-owning primary that no reachable member is counts as **down** when either
//!
//! - some reachable node flags it `fail`: a majority of primaries agreed (`fail?`, one node's
//!   suspicion, is not enough), or
//! - it is **gone**: no reachable node has a live cluster-bus link to it ([`Topology::heard`]:
//!   connected, not suspected, no ping pending for over half `cluster-node-timeout`), and its
//!   pod is deleted or the pod at its address refuses connections (the process died).
//!
//! A primary the operator cannot reach that is neither counts as alive: the operator may be
//! the one cut off, on the minority side of a partition, and must not take over shards whose
//! primaries still serve on the other side. For a shard without a writer whose primary is down:
//!
//! - `TAKEOVER` when the slot-owning primaries that are not down are no majority, so no
//!   replica can win an election (for example one of two shards lost its primary);
//! - `FORCE` (an election without the old primary's agreement) when a majority is up and the
//!   primary is gone but not flagged `fail` yet: Valkey would start its election only after its
//!   failure detection;
//! - otherwise Valkey's own election runs (the primary is flagged `fail` and a majority is up),
//!   or the primary is not known to be down, and the operator waits ([`FailoverWait`]).
//!
//! # Staleness bound
//!
//! A replica is promoted only when it streamed from the failed primary in its current life
//! (`master_link_down_since_seconds` ≥ 0: one that restarted holds only its own older files) and
//! its link broke at most `cluster-node-timeout` before the cluster last heard the primary
//! (the replica's `server_time_usec` less its link-down time, against the latest `pong_recv`
//! any reachable node reports for the primary). Without those clocks its link must be down for
//! at most `cluster-node-timeout` + `repl-timeout`. Among the fresh replicas the highest
//! replication offset wins; when every replica is staler, nothing is promoted and the wait says so.

use std::collections::BTreeSet;
use std::net::IpAddr;

use valkey_ops::commands::FailoverMode;
use valkey_ops::model::ClusterNode;
use valkey_ops::{Layout, Member, NodeView, Topology};

use crate::cluster::steps::{self, Step};

/// Start of the ClusterFormed message of a shard whose failover is stuck (it also marks the
/// transition that emits `FailoverFailed`).
pub const FAILOVER_STUCK: &str = "no failover for shard";

/// The timing settings the failover rule derives its bounds from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverTiming {
    /// `cluster-node-timeout` in milliseconds.
    pub node_timeout_ms: u64,
    /// `repl-timeout` in milliseconds.
    pub repl_timeout_ms: u64,
}

impl Default for FailoverTiming {
    /// The operator's default `cluster-node-timeout` and Valkey's default `repl-timeout`.
    fn default() -> Self {
        Self {
            node_timeout_ms: 5_000,
            repl_timeout_ms: 60_000,
        }
    }
}

impl FailoverTiming {
    /// The longest link-down time of a promotable replica when the clocks are not reported.
    pub fn staleness_bound_ms(&self) -> u64 {
        self.node_timeout_ms + self.repl_timeout_ms
    }

    /// How long a writer-less shard waits for Valkey before the status calls it stuck.
    pub fn stuck_after_ms(&self) -> u64 {
        2 * self.node_timeout_ms
    }
}

/// Why a shard without a writer gets no operator-driven failover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// Its primary is unreachable by the operator but neither agreed failed nor gone: it may
    /// still serve on the other side of a partition. Valkey's failure detection decides.
    NotKnownDown,
    /// Its primary is flagged `fail` and a majority of primaries is up: Valkey's election runs.
    ElectionRunning,
    /// No replica streamed from the failed primary in its current life.
    NoStreamedReplica,
    /// Every replica that streamed from it lost its link too long before the primary was last
    /// heard (more than the staleness bound).
    StaleReplicas,
}

/// A shard waiting for its writer, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailoverWait {
    /// Shard index.
    pub shard: i32,
    /// Why the operator does not promote a replica.
    pub reason: WaitReason,
    /// How long the cluster has not heard the failed primary (ms), when the clocks tell.
    pub silent_ms: Option<u64>,
}

impl FailoverWait {
    /// What the status says about a shard that has waited past `timing`'s bound, with what to
    /// do; `None` while it is still within the normal failure-detection time.
    pub fn stuck_message(&self, timing: FailoverTiming) -> Option<String> {
        // The threshold, not the growing silence, goes into the message: a stuck cluster's
        // status is written once, not on every pass.
        self.silent_ms.filter(|s| *s > timing.stuck_after_ms())?;
        let secs = timing.stuck_after_ms().div_ceil(1000);
        let shard = self.shard;
        Some(match self.reason {
            WaitReason::NotKnownDown => format!(
                "{FAILOVER_STUCK} {shard}: its primary has not been heard for over {secs} s but no majority of primaries flags it failed and its pod still exists; \
                 if that pod is gone for good, delete it so the operator can fail over"
            ),
            WaitReason::ElectionRunning => format!(
                "{FAILOVER_STUCK} {shard}: its primary failed over {secs} s ago and Valkey's election has not promoted a replica; check the replicas' logs"
            ),
            WaitReason::NoStreamedReplica => format!(
                "{FAILOVER_STUCK} {shard}: its primary is down and no replica streamed from it since starting (they hold only older data); \
                 bring the primary's pod back, or promote a replica by hand with CLUSTER FAILOVER TAKEOVER accepting the loss"
            ),
            WaitReason::StaleReplicas => format!(
                "{FAILOVER_STUCK} {shard}: its primary is down and every replica lost its link more than the staleness bound before the primary was last heard; \
                 bring the primary's pod back, or promote a replica by hand with CLUSTER FAILOVER TAKEOVER accepting the loss"
            ),
        })
    }
}

/// What the failover rule decided for the layout's shards.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FailoverDecision {
    /// The failover to drive now, if any (one per pass).
    pub step: Option<Step>,
    /// Shards without a writer that wait, and why.
    pub waits: Vec<FailoverWait>,
}

/// The liveness facts of the rule, read from the live views.
struct Liveness<'a> {
    topology: &'a Topology,
    timing: FailoverTiming,
    live_ids: BTreeSet<&'a str>,
    pod_ips: Option<&'a BTreeSet<IpAddr>>,
}

impl Liveness<'_> {
    /// The pod at the node's address is deleted, or refuses connections.
    fn no_process(&self, n: &ClusterNode) -> bool {
        let Ok(ip) = n.addr.ip.parse::<IpAddr>() else {
            return false;
        };
        self.pod_ips.is_some_and(|ips| !ips.contains(&ip))
            || self
                .topology
                .members()
                .iter()
                .any(|m| m.refused && m.view.is_none() && m.ip() == ip)
    }

    fn unreachable(&self, n: &ClusterNode) -> bool {
        !self.live_ids.contains(n.id.as_str())
    }

    /// Certainly not serving: no live bus link to it anywhere, and no process at its address.
    fn gone(&self, n: &ClusterNode) -> bool {
        self.unreachable(n)
            && !self.topology.heard(&n.id, self.timing.node_timeout_ms / 2)
            && self.no_process(n)
    }

    fn agreed_failed(&self, n: &ClusterNode) -> bool {
        self.unreachable(n) && self.topology.agreed_failed(&n.id)
    }

    fn down(&self, n: &ClusterNode) -> bool {
        self.agreed_failed(n) || self.gone(n)
    }
}

/// The latest clock any reachable node reported (Unix ms): the "now" of the views.
fn views_now(topology: &Topology) -> Option<u64> {
    topology
        .reachable()
        .filter_map(|m| m.view.as_ref()?.time_ms)
        .max()
}

/// Whether replica view `v` is fresh enough to be promoted in place of `failed` (see the
/// module's staleness bound).
fn fresh(v: &NodeView, last_heard_ms: Option<u64>, timing: FailoverTiming) -> bool {
    let Some(down_s) = v.link_down_since.filter(|s| *s >= 0) else {
        return false;
    };
    let down_ms = u64::try_from(down_s).unwrap_or(0).saturating_mul(1000);
    match (v.time_ms, last_heard_ms) {
        (Some(now), Some(heard)) => now.saturating_sub(down_ms) + timing.node_timeout_ms >= heard,
        _ => down_ms <= timing.staleness_bound_ms(),
    }
}

/// The failover the operator must drive, and the shards that wait (see the module docs).
pub fn failover_decision(
    layout: Layout,
    topology: &Topology,
    pod_ips: Option<&BTreeSet<IpAddr>>,
    timing: FailoverTiming,
) -> FailoverDecision {
    let mut decision = FailoverDecision::default();
    let Some(seed) = topology.seed_view() else {
        return decision;
    };
    let live = Liveness {
        topology,
        timing,
        live_ids: topology.live_ids(),
        pod_ips,
    };
    let serving: Vec<&ClusterNode> = seed.nodes.iter().filter(|n| n.owns_slots()).collect();
    let alive = serving.iter().filter(|n| !live.down(n)).count();
    let majority = alive * 2 > serving.len();
    let now = views_now(topology);
    for shard in 0..layout.shards {
        if topology.writer(shard).is_some() {
            continue;
        }
        // The slot-owning primary the shard's members follow (in the seed's view).
        let followers: Vec<(&Member, &NodeView, &ClusterNode)> = topology
            .shard(shard)
            .filter_map(|m| {
                let v = m.view.as_ref()?;
                let me = v.me()?;
                let failed = me.primary_id.as_deref().filter(|_| me.is_replica())?;
                let seen = seed.get(failed).filter(|n| n.owns_slots())?;
                (!v.primary_link_up).then_some((m, v, seen))
            })
            .collect();
        // Nobody follows a slot-owning primary: nothing the operator could promote.
        let Some(&(_, _, failed)) = followers.first() else {
            continue;
        };
        let last_heard = topology.last_heard_ms(&failed.id);
        let silent_ms = now.zip(last_heard).map(|(n, h)| n.saturating_sub(h));
        let wait = |reason| FailoverWait {
            shard,
            reason,
            silent_ms,
        };
        let streamed: Vec<_> = followers
            .iter()
            .filter(|(_, v, n)| n.id == failed.id && v.link_down_since.is_some_and(|s| s >= 0))
            .collect();
        let best = streamed
            .iter()
            .filter(|(_, v, _)| fresh(v, last_heard, timing))
            .max_by_key(|(m, v, _)| (v.repl_offset, -m.index));
        // Why no replica can be promoted, if none can: also what keeps Valkey's own election
        // from succeeding for long.
        let unpromotable = match best {
            Some(_) => None,
            None if streamed.is_empty() => Some(WaitReason::NoStreamedReplica),
            None => Some(WaitReason::StaleReplicas),
        };
        let mode = if !live.down(failed) {
            decision.waits.push(wait(WaitReason::NotKnownDown));
            continue;
        } else if !majority {
            FailoverMode::Takeover
        } else if live.gone(failed) && !live.agreed_failed(failed) {
            FailoverMode::Force
        } else {
            decision
                .waits
                .push(wait(unpromotable.unwrap_or(WaitReason::ElectionRunning)));
            continue;
        };
        match best {
            Some((m, ..)) if decision.step.is_none() => {
                decision.step = Some(Step::Failover(steps::Failover {
                    replica: m.addr,
                    shard,
                    failed: failed.id.clone(),
                    mode,
                }));
            }
            Some(_) => {}
            None => decision.waits.extend(unpromotable.map(wait)),
        }
    }
    decision
}

/// The failover step of [`failover_decision`], if any.
pub fn failover_step(
    layout: Layout,
    topology: &Topology,
    pod_ips: Option<&BTreeSet<IpAddr>>,
    timing: FailoverTiming,
) -> Option<Step> {
    failover_decision(layout, topology, pod_ips, timing).step
}

#[cfg(test)]
mod tests {
    use super::super::testworld::*;
    use super::super::topology::next_step;
    use super::*;
    use valkey_ops::model::LinkState;

    #[test]
    fn two_shards_losing_a_primary_take_over_on_the_most_caught_up_replica() {
        // 2 shards × 2 replicas; shard 0's primary (1) is down and replaced by node 7. One live
        // slot owner out of two is no majority: no election can succeed.
        let d = Layout {
            shards: 2,
            replicas: 2,
        };
        let mut n = formed22();
        n[0].fail = true;
        n.push(node(7, 0, 0));
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        // Node 3 has the highest replication offset in the test world.
        assert_eq!(
            next_step(d, &m, None, FailoverTiming::default()),
            Some(Step::Failover(steps::Failover {
                replica: addr(3),
                shard: 0,
                failed: id(1),
                mode: FailoverMode::Takeover,
            }))
        );
        // Once a replica owns the slots, the shard is left to the usual steps.
        n[2].primary_of = None;
        n[2].slots = "0-8191";
        n[0].slots = "";
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        assert!(!matches!(
            next_step(d, &m, None, FailoverTiming::default()),
            Some(Step::Failover(steps::Failover { .. }))
        ));
    }

    #[test]
    fn no_takeover_while_a_majority_of_primaries_is_alive() {
        // 3 shards: two live primaries out of three can elect; Valkey promotes the replica.
        let mut n = formed31();
        n[0].fail = true;
        let m = world(&n, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(next_step(D31, &m, None, FailoverTiming::default()), None);
    }

    /// Sets node `of` as every member in `viewers` sees it.
    fn seen(m: &mut [Member], viewers: &[u32], of: u32, f: impl Fn(&mut ClusterNode)) {
        for x in m
            .iter_mut()
            .filter(|x| viewers.iter().any(|v| addr(*v) == x.addr))
        {
            if let Some(n) = x
                .view
                .as_mut()
                .and_then(|v| v.nodes.nodes.iter_mut().find(|n| n.id == id(of)))
            {
                f(n);
            }
        }
    }

    /// No live bus link to it: disconnected and suspected.
    fn lost(n: &mut ClusterNode) {
        n.link_state = LinkState::Disconnected;
        n.flags.pfail = true;
    }

    /// Shard 0's primary (node 1) is unreachable, every peer lost its bus link to it (`fail?`,
    /// not yet `fail`), and its replica's link is down.
    fn primary_unreachable(n: &[N]) -> Vec<Member> {
        let mut m = members(&world(n, &[1, 2, 3, 4, 5, 6, 7]));
        m.retain(|x| x.addr != addr(1));
        for x in m.iter_mut().filter(|x| x.shard == 0) {
            if let Some(v) = x.view.as_mut() {
                v.primary_link_up = false;
            }
        }
        seen(&mut m, &[2, 3, 4, 5, 6, 7], 1, lost);
        m
    }

    #[test]
    fn a_primary_still_heard_by_a_peer_is_not_failed_over() {
        // Node 1's pod is gone from the operator's list, but node 3 still has a live link to
        // it: it serves somewhere (a partition, a stale pod list).
        let mut m = primary_unreachable(&formed31());
        seen(&mut m, &[3], 1, |n| {
            n.link_state = LinkState::Connected;
            n.flags.pfail = false;
        });
        let t = Topology::new(m);
        let d = failover_decision(D31, &t, Some(&ips(1, 6)), FailoverTiming::default());
        assert_eq!(d.step, None);
        assert_eq!(d.waits[0].reason, WaitReason::NotKnownDown);
        // Connected but suspected (a connect in progress to a dead address) is no live link.
        let mut m = primary_unreachable(&formed31());
        seen(&mut m, &[3], 1, |n| n.link_state = LinkState::Connected);
        assert!(matches!(
            next_step(
                D31,
                &Topology::new(m),
                Some(&ips(1, 6)),
                FailoverTiming::default()
            ),
            Some(Step::Failover(steps::Failover {
                mode: FailoverMode::Force,
                ..
            }))
        ));
        // Connected, not suspected yet, but a ping unanswered for 4 s (over half the 5 s
        // cluster-node-timeout, by node 3's clock): no live link either. 1 s is.
        for (pending_ms, heard) in [(4_000, false), (1_000, true)] {
            let mut m = primary_unreachable(&formed31());
            seen(&mut m, &[3], 1, |n| {
                n.link_state = LinkState::Connected;
                n.flags.pfail = false;
                n.ping_sent = NOW - pending_ms;
            });
            for x in m.iter_mut().filter(|x| x.addr == addr(3)) {
                x.view.as_mut().expect("view").time_ms = Some(NOW);
            }
            let step = next_step(
                D31,
                &Topology::new(m),
                Some(&ips(1, 6)),
                FailoverTiming::default(),
            );
            assert_eq!(
                step.is_none(),
                heard,
                "ping pending {pending_ms} ms: {step:?}"
            );
        }
    }

    #[test]
    fn the_operator_on_the_minority_side_takes_nothing_over() {
        // A partition: the operator reaches node 1 (shard 0's primary) and node 4 (shard 1's
        // replica) only. They lost shard 1's and 2's primaries (`fail?`, no majority to agree
        // on `fail`), whose pods still exist and do not refuse: they serve on the other side.
        let mut m = members(&world(&formed31(), &[1, 2, 3, 4, 5, 6]));
        m.retain(|x| [addr(1), addr(4)].contains(&x.addr));
        for p in [3, 5] {
            seen(&mut m, &[1, 4], p, lost);
        }
        for x in m.iter_mut().filter(|x| x.addr == addr(4)) {
            x.view.as_mut().expect("view").primary_link_up = false;
        }
        let t = Topology::new(m);
        for pods in [None, Some(ips(0, 6))] {
            let d = failover_decision(D31, &t, pods.as_ref(), FailoverTiming::default());
            assert_eq!(d.step, None);
            assert_eq!(
                d.waits,
                vec![FailoverWait {
                    shard: 1,
                    reason: WaitReason::NotKnownDown,
                    silent_ms: None,
                }]
            );
        }
    }

    /// Shard 0 of `primary_unreachable` with clocks: now is `NOW`, the cluster last heard the
    /// primary at `heard`, and replica node 2's link has been down for `down_s` seconds.
    fn with_clocks(heard: Option<u64>, down_s: i64) -> Topology {
        let mut m = primary_unreachable(&formed31());
        for x in m.iter_mut() {
            let v = x.view.as_mut().expect("view");
            v.time_ms = heard.map(|_| NOW);
            if x.addr == addr(2) {
                v.link_down_since = Some(down_s);
            }
        }
        if let Some(h) = heard {
            seen(&mut m, &[3, 5], 1, |n| n.pong_recv = h);
        }
        Topology::new(m)
    }

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn an_agreed_failure_with_only_stale_replicas_says_so() {
        // Node 1 is flagged `fail` (a majority agreed): Valkey's election is left to run, but
        // its only replica lost its link 100 s before the primary was last heard, so the wait
        // is reported as stale replicas, not as an election that will come.
        let mut m = with_clocks(Some(NOW - 3_000), 100).members().to_vec();
        seen(&mut m, &[2, 3, 4, 5, 6, 7], 1, |n| {
            n.flags.pfail = false;
            n.flags.fail = true;
        });
        let t = Topology::new(m);
        let d = failover_decision(D31, &t, None, FailoverTiming::default());
        assert_eq!(d.step, None);
        assert_eq!(d.waits[0].reason, WaitReason::StaleReplicas);
        // With a fresh replica the operator waits for the election.
        let mut m = with_clocks(Some(NOW - 3_000), 4).members().to_vec();
        seen(&mut m, &[2, 3, 4, 5, 6, 7], 1, |n| {
            n.flags.pfail = false;
            n.flags.fail = true;
        });
        let d = failover_decision(D31, &Topology::new(m), None, FailoverTiming::default());
        assert_eq!(d.step, None);
        assert_eq!(d.waits[0].reason, WaitReason::ElectionRunning);
    }

    #[test]
    fn a_replica_whose_link_broke_long_before_the_primary_was_last_heard_is_not_promoted() {
        let timing = FailoverTiming::default();
        let gone = ips(1, 6);
        let decide = |t: &Topology| failover_decision(D31, t, Some(&gone), timing);
        // Heard 3 s ago, link down 4 s: broke 1 s before, within cluster-node-timeout (5 s).
        assert!(decide(&with_clocks(Some(NOW - 3_000), 4)).step.is_some());
        // Link down 100 s while the primary was heard 3 s ago: 97 s of writes missing.
        let d = decide(&with_clocks(Some(NOW - 3_000), 100));
        assert_eq!(d.step, None);
        assert_eq!(d.waits[0].reason, WaitReason::StaleReplicas);
        assert_eq!(d.waits[0].silent_ms, Some(3_000));
        // The primary died long ago with its replica attached: the link broke when the
        // primary was last heard, however long ago that is.
        assert!(
            decide(&with_clocks(Some(NOW - 600_000), 601))
                .step
                .is_some()
        );
        // Without clocks: at most cluster-node-timeout + repl-timeout (65 s) of link-down time.
        assert!(decide(&with_clocks(None, 60)).step.is_some());
        assert_eq!(decide(&with_clocks(None, 70)).step, None);
        let slow = FailoverTiming {
            node_timeout_ms: 15_000,
            repl_timeout_ms: 60_000,
        };
        assert!(
            failover_decision(D31, &with_clocks(None, 70), Some(&gone), slow)
                .step
                .is_some()
        );
    }

    #[test]
    fn the_freshest_replica_wins_over_a_more_caught_up_stale_one() {
        // 2 shards × 2 replicas, shard 0's primary (1) gone: node 3 has the highest offset but
        // lost its link long before node 1 was last heard; node 2 is promoted.
        let d = Layout {
            shards: 2,
            replicas: 2,
        };
        let n = formed22();
        let mut m = primary_unreachable(&n);
        seen(&mut m, &[4, 5, 6], 1, |n| n.pong_recv = NOW - 2_000);
        for x in m.iter_mut() {
            let v = x.view.as_mut().expect("view");
            v.time_ms = Some(NOW);
            if x.addr == addr(3) {
                v.link_down_since = Some(300);
            }
        }
        let t = Topology::new(m);
        let step = failover_step(d, &t, Some(&ips(1, 6)), FailoverTiming::default());
        assert!(
            matches!(step, Some(Step::Failover(steps::Failover { replica, mode: FailoverMode::Takeover, .. })) if replica == addr(2)),
            "{step:?}"
        );
    }

    #[test]
    fn a_shard_waiting_past_twice_the_node_timeout_is_reported_stuck() {
        let timing = FailoverTiming::default();
        let wait = |reason, silent_ms| FailoverWait {
            shard: 1,
            reason,
            silent_ms,
        };
        assert_eq!(
            wait(WaitReason::NotKnownDown, Some(9_000)).stuck_message(timing),
            None
        );
        assert_eq!(
            wait(WaitReason::NotKnownDown, None).stuck_message(timing),
            None
        );
        let msg = wait(WaitReason::NotKnownDown, Some(11_000))
            .stuck_message(timing)
            .expect("stuck");
        assert!(msg.starts_with("no failover for shard 1:"), "{msg}");
        assert!(msg.contains("over 10 s"), "{msg}");
        // The message does not grow with the silence (no status write on every pass).
        assert_eq!(
            wait(WaitReason::NotKnownDown, Some(50_000)).stuck_message(timing),
            Some(msg)
        );
        assert!(
            wait(WaitReason::StaleReplicas, Some(11_000))
                .stuck_message(timing)
                .is_some_and(|m| m.contains("TAKEOVER"))
        );
    }

    #[test]
    fn gone_primary_pod_is_failed_over_at_once_with_force() {
        let m = Topology::new(primary_unreachable(&formed31()));
        assert_eq!(
            next_step(D31, &m, Some(&ips(1, 6)), FailoverTiming::default()),
            Some(Step::Failover(steps::Failover {
                replica: addr(2),
                shard: 0,
                failed: id(1),
                mode: FailoverMode::Force,
            }))
        );
        // Its pod still exists (a restart, a terminating pod handing over): wait.
        assert_eq!(
            next_step(D31, &m, Some(&ips(0, 6)), FailoverTiming::default()),
            None
        );
        // Pods unknown: wait for Valkey.
        assert_eq!(next_step(D31, &m, None, FailoverTiming::default()), None);
        // Valkey already flagged it failed: its own election runs.
        let mut n = formed31();
        n[0].fail = true;
        let m = world(&n, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            next_step(D31, &m, Some(&ips(1, 6)), FailoverTiming::default()),
            None
        );
    }

    #[test]
    fn gone_primary_pod_of_two_shards_is_taken_over_at_once() {
        let d = Layout {
            shards: 2,
            replicas: 1,
        };
        let mut n = vec![node(1, 0, 0), node(2, 0, 1), node(3, 1, 0), node(4, 1, 1)];
        n[0].slots = "0-8191";
        n[2].slots = "8192-16383";
        n[1].primary_of = Some(1);
        n[3].primary_of = Some(3);
        let m = Topology::new(primary_unreachable(&n));
        assert_eq!(
            next_step(d, &m, Some(&ips(1, 4)), FailoverTiming::default()),
            Some(Step::Failover(steps::Failover {
                replica: addr(2),
                shard: 0,
                failed: id(1),
                mode: FailoverMode::Takeover,
            }))
        );
        assert_eq!(
            next_step(d, &m, Some(&ips(0, 4)), FailoverTiming::default()),
            None
        );
    }

    #[test]
    fn primary_whose_pod_refuses_connections_is_failed_over_at_once() {
        // The server process of node 1 died; its pod (same IP) refuses connections.
        let mut m = primary_unreachable(&formed31());
        m.push(unreachable(1, 0, 0, true));
        let all = ips(0, 6);
        assert!(matches!(
            next_step(
                D31,
                &Topology::new(m.clone()),
                Some(&all),
                FailoverTiming::default()
            ),
            Some(Step::Failover(steps::Failover {
                mode: FailoverMode::Force,
                ..
            }))
        ));
        // Unreachable but not refusing (a timeout, a partition): wait for Valkey.
        for x in m.iter_mut().filter(|x| x.addr == addr(1)) {
            x.refused = false;
        }
        assert_eq!(
            next_step(
                D31,
                &Topology::new(m),
                Some(&all),
                FailoverTiming::default()
            ),
            None
        );
    }

    #[test]
    fn replica_that_restarted_since_its_primary_failed_is_not_promoted() {
        // Every pod restarted (persistence): the replica loaded its own files and never
        // streamed from the primary, whose pod is still being recreated. Wait for it.
        let mut m = primary_unreachable(&formed31());
        for x in m.iter_mut().filter(|x| x.shard == 0) {
            if let Some(v) = x.view.as_mut() {
                v.link_down_since = Some(-1);
            }
        }
        assert_eq!(
            next_step(
                D31,
                &Topology::new(m),
                Some(&ips(1, 6)),
                FailoverTiming::default()
            ),
            None
        );
    }

    /// How a reachable node sees a primary's bus link.
    #[derive(Clone, Copy, Debug)]
    enum Link {
        Live,
        Suspected,
        Failed,
    }

    /// One generated 3 × 1 world: the truth (which primaries serve) and what the operator sees.
    #[derive(Clone, Debug)]
    struct Case {
        /// Per shard: its primary serves (on the majority side of any partition).
        alive: [bool; 3],
        /// Per shard: a dead primary's pod is deleted (else it exists).
        deleted: [bool; 3],
        /// Per shard: a dead primary's pod refuses connections.
        refusing: [bool; 3],
        /// Per node 1..=6: the operator reaches it (a dead primary never).
        reached: [bool; 6],
        /// Per viewer node 1..=6 and shard: how it sees that shard's primary.
        links: [[Link; 3]; 6],
        /// Per replica (shard): its link is up; seconds since it broke (-1: never streamed).
        replica_link: [(bool, i64); 3],
        /// Whether the operator knows the pods.
        pods_known: bool,
    }

    fn link() -> impl proptest::strategy::Strategy<Value = Link> {
        proptest::prop_oneof![
            proptest::strategy::Just(Link::Live),
            proptest::strategy::Just(Link::Suspected),
            proptest::strategy::Just(Link::Failed),
        ]
    }

    fn case() -> impl proptest::strategy::Strategy<Value = Case> {
        use proptest::prelude::*;
        (
            any::<[bool; 3]>(),
            any::<[bool; 3]>(),
            any::<[bool; 3]>(),
            any::<[bool; 6]>(),
            proptest::array::uniform6(proptest::array::uniform3(link())),
            proptest::array::uniform3((any::<bool>(), -1i64..120)),
            any::<bool>(),
        )
            .prop_map(
                |(alive, deleted, refusing, reached, links, replica_link, pods_known)| Case {
                    alive,
                    deleted,
                    refusing,
                    reached,
                    links,
                    replica_link,
                    pods_known,
                },
            )
    }

    impl Case {
        /// The topology and pod IPs the operator observes. Physical constraints: a serving
        /// primary's pod exists and accepts connections, and no majority flags it `fail` (it is
        /// on the majority side); a dead primary is unreachable; a replica's link to a dead
        /// primary is down.
        fn observe(&self) -> (Topology, BTreeSet<IpAddr>) {
            let primary = |s: usize| u32::try_from(2 * s + 1).expect("node");
            let mut m = members(&world(&formed31(), &[1, 2, 3, 4, 5, 6]));
            let mut refused = Vec::new();
            for s in 0..3 {
                if !self.alive[s] {
                    m.retain(|x| x.addr != addr(primary(s)));
                    if !self.deleted[s] && self.refusing[s] {
                        refused.push(s);
                    }
                }
            }
            m.retain(|x| {
                let n = (1..=6u32).find(|n| addr(*n) == x.addr).expect("node");
                self.reached[usize::try_from(n - 1).expect("index")]
            });
            for (viewer, links) in (1..=6u32).zip(self.links) {
                for (s, l) in links.into_iter().enumerate() {
                    let p = primary(s);
                    if p == viewer {
                        continue;
                    }
                    let l = match l {
                        Link::Failed if self.alive[s] => Link::Suspected,
                        l => l,
                    };
                    seen(&mut m, &[viewer], p, |n| match l {
                        Link::Live => {}
                        Link::Suspected => lost(n),
                        Link::Failed => {
                            lost(n);
                            n.flags.pfail = false;
                            n.flags.fail = true;
                        }
                    });
                }
            }
            for x in &mut m {
                let Some(v) = x.view.as_mut() else { continue };
                if x.index == 1 {
                    let s = usize::try_from(x.shard).expect("shard");
                    let (up, since) = self.replica_link[s];
                    v.primary_link_up = up && self.alive[s];
                    v.link_down_since = (!v.primary_link_up).then_some(since);
                }
            }
            for s in refused {
                m.push(unreachable(
                    primary(s),
                    i32::try_from(s).expect("shard"),
                    0,
                    true,
                ));
            }
            let pods = (1..=6u32)
                .filter(|n| {
                    let s = usize::try_from((n - 1) / 2).expect("shard");
                    !(n % 2 == 1 && !self.alive[s] && self.deleted[s])
                })
                .map(|n| ip(n).parse().expect("ip"))
                .collect();
            (Topology::new(m), pods)
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Over generated views: the operator never fails over a shard whose primary serves,
        /// and takes over only when the serving primaries are no majority.
        #[test]
        fn forced_failovers_only_replace_dead_primaries(c in case()) {
            let (t, pods) = c.observe();
            let pods = c.pods_known.then_some(&pods);
            if let Some(Step::Failover(steps::Failover { shard, mode, failed, .. })) =
                failover_step(D31, &t, pods, FailoverTiming::default())
            {
                let s = usize::try_from(shard).expect("shard");
                proptest::prop_assert!(!c.alive[s], "failed over a serving primary: {c:?}");
                proptest::prop_assert_eq!(failed, id(u32::try_from(2 * s + 1).expect("node")));
                let serving = c.alive.iter().filter(|a| **a).count();
                if mode == FailoverMode::Takeover {
                    proptest::prop_assert!(serving * 2 <= 3, "took over with a majority up: {c:?}");
                }
            }
        }
    }

    /// The generator reaches both forced modes, so the property above is not vacuous.
    #[test]
    fn generated_views_exercise_force_and_takeover() {
        use proptest::strategy::{Strategy, ValueTree};
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut force, mut takeover) = (0, 0);
        for _ in 0..2000 {
            let c = case().new_tree(&mut runner).expect("case").current();
            let (t, pods) = c.observe();
            match failover_step(
                D31,
                &t,
                c.pods_known.then_some(&pods),
                FailoverTiming::default(),
            ) {
                Some(Step::Failover(steps::Failover {
                    mode: FailoverMode::Force,
                    ..
                })) => force += 1,
                Some(Step::Failover(steps::Failover {
                    mode: FailoverMode::Takeover,
                    ..
                })) => takeover += 1,
                _ => {}
            }
        }
        assert!(
            force > 10 && takeover > 10,
            "force {force}, takeover {takeover}"
        );
    }
}
