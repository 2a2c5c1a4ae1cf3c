//! Failback (pure): when a shard's primary is handed back to its node-index-0 pod.
//!
//! After a failover a shard's primary runs on another pod than node-index 0, the pod the
//! `spread.primaries` placement puts where primaries belong. With `failback.mode: Automatic`
//! each such shard gets a due time, `status.shardStatuses[].failbackAt`: the quiet period after the
//! cluster last changed. The wait restarts (the due time is dropped and set again later) when
//! anything changes: another step is planned, a roll or a slot balance runs, ValkeyNodes are
//! added, removed or not yet observed, or the shard's own primary moves again or one of its
//! replicas is not synced. Transient states (gossip converging, `cluster_state` not ok, a
//! replica of another shard not synced, a rolled node settling) only delay the step. The due
//! time is kept in the status, so an operator restart does not restart the wait.
//!
//! At most one shard fails back per pass, and only from a synced node-index-0 replica, so the
//! shard keeps a synced copy (the old primary, demoted) and the hand-over is a coordinated
//! `CLUSTER FAILOVER`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use valkey_api::status::ShardStatus;
use valkey_ops::{Layout, Topology};

use crate::cluster::steps::{self, Step};

/// What the rest of the plan says about the cluster this pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quiet {
    /// Something changes: every shard's wait restarts.
    pub changing: bool,
    /// The cluster has settled (gossip converged, every replica synced, every node ready for a
    /// while): a due failback may start.
    pub settled: bool,
}

/// The failback decision of a pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Failbacks {
    /// Shard → when its primary is handed back (shards waiting for a failback).
    pub due: BTreeMap<i32, Timestamp>,
    /// The failback to run now, if any.
    pub step: Option<Step>,
}

impl Failbacks {
    /// How long until the next failback is due (at least a second), when one waits.
    pub fn next_in(&self, now: Timestamp) -> Option<Duration> {
        let first = self.due.values().min()?;
        let secs = first.as_second().saturating_sub(now.as_second()).max(1);
        Some(Duration::from_secs(secs.unsigned_abs()))
    }
}

/// The failbacks of a pass. `quiet_period`: `None` when failback is disabled; `previous`: the
/// shard entries of the status so far (their `failbackAt`); `within`: the layout's members.
pub fn failbacks(
    layout: Layout,
    within: &Topology,
    previous: &[ShardStatus],
    quiet_period: Option<Duration>,
    quiet: Quiet,
    now: Timestamp,
) -> Failbacks {
    let mut out = Failbacks::default();
    let Some(period) = quiet_period.filter(|_| !quiet.changing) else {
        return out;
    };
    let period = i64::try_from(period.as_secs()).unwrap_or(i64::MAX);
    for shard in 0..layout.shards {
        let Some(primary) = within.writer(shard).filter(|p| p.index != 0) else {
            continue;
        };
        let Some(home) = within.at(shard, 0) else {
            continue;
        };
        let synced = within.synced_replicas(primary).count();
        let home_synced = primary.id().is_some_and(|id| home.is_synced_replica_of(id));
        if !home_synced || i32::try_from(synced).unwrap_or(i32::MAX) < layout.replicas {
            continue;
        }
        // The wait so far, if the shard's primary is the one it was kept for.
        let kept = previous
            .iter()
            .find(|s| s.index == shard && s.primary_pod.as_deref() == Some(primary.pod.as_str()))
            .and_then(|s| s.failback_at.as_ref())
            .map(|t| t.0);
        let due = kept.unwrap_or_else(|| {
            Timestamp::from_second(now.as_second().saturating_add(period)).unwrap_or(now)
        });
        out.due.insert(shard, due);
        if out.step.is_none() && quiet.settled && due <= now {
            out.step = Some(Step::Failback(steps::Failback {
                home: home.addr,
                shard,
                home_pod: home.pod.clone(),
                primary_pod: primary.pod.clone(),
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::super::testworld::*;
    use super::*;

    const PERIOD: Option<Duration> = Some(Duration::from_secs(600));
    const QUIET: Quiet = Quiet {
        changing: false,
        settled: true,
    };

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    /// The status entries a pass with `f` writes (shard 0's primary on `pod`).
    fn status(f: &Failbacks, pod: &str) -> Vec<ShardStatus> {
        (0..3)
            .map(|index| ShardStatus {
                index,
                primary_pod: Some(if index == 0 {
                    pod.into()
                } else {
                    format!("pod-{index}-0")
                }),
                failback_at: f.due.get(&index).map(|t| Time(*t)),
                ..ShardStatus::default()
            })
            .collect()
    }

    fn failback0() -> Step {
        Step::Failback(steps::Failback {
            home: addr(1),
            shard: 0,
            home_pod: "pod-0-0".into(),
            primary_pod: "pod-0-1".into(),
        })
    }

    #[test]
    fn a_shard_off_home_fails_back_after_the_quiet_period_kept_across_passes() {
        let t = world(&failed_over31(), &[1, 2, 3, 4, 5, 6]);
        let first = failbacks(D31, &t, &[], PERIOD, QUIET, at(0));
        assert_eq!(first.due, BTreeMap::from([(0, at(600))]));
        assert_eq!(first.step, None);
        assert_eq!(first.next_in(at(0)), Some(Duration::from_secs(600)));
        // Later passes keep the due time (from the status), and run the step once it passed.
        let prev = status(&first, "pod-0-1");
        let mid = failbacks(D31, &t, &prev, PERIOD, QUIET, at(599));
        assert_eq!((mid.due.clone(), mid.step), (first.due.clone(), None));
        let due = failbacks(D31, &t, &prev, PERIOD, QUIET, at(600));
        assert_eq!(due.step, Some(failback0()));
        // Back home: nothing waits.
        let home = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            failbacks(D31, &home, &prev, PERIOD, QUIET, at(601)),
            Failbacks::default()
        );
    }

    #[test]
    fn disabled_or_changing_means_no_wait_and_unsettled_only_delays() {
        let t = world(&failed_over31(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            failbacks(D31, &t, &[], None, QUIET, at(0)),
            Failbacks::default()
        );
        let prev = status(&failbacks(D31, &t, &[], PERIOD, QUIET, at(0)), "pod-0-1");
        let changing = Quiet {
            changing: true,
            settled: true,
        };
        assert_eq!(
            failbacks(D31, &t, &prev, PERIOD, changing, at(700)),
            Failbacks::default()
        );
        let unsettled = Quiet {
            changing: false,
            settled: false,
        };
        let waits = failbacks(D31, &t, &prev, PERIOD, unsettled, at(700));
        assert_eq!((waits.due.get(&0), waits.step), (Some(&at(600)), None));
    }

    #[test]
    fn a_new_failover_of_the_shard_restarts_its_wait() {
        let t = world(&failed_over31(), &[1, 2, 3, 4, 5, 6]);
        // The status's due time was kept for another primary of shard 0 (it moved since).
        let prev = status(&failbacks(D31, &t, &[], PERIOD, QUIET, at(0)), "pod-0-2");
        let again = failbacks(D31, &t, &prev, PERIOD, QUIET, at(500));
        assert_eq!((again.due.get(&0), again.step), (Some(&at(1100)), None));
    }

    #[test]
    fn a_home_replica_not_synced_restarts_the_wait() {
        let mut m = members(&world(&failed_over31(), &[1, 2, 3, 4, 5, 6]));
        let home = m.iter_mut().find(|m| m.addr == addr(1)).unwrap();
        home.view.as_mut().unwrap().sync_in_progress = true;
        let t = Topology::new(m);
        assert_eq!(
            failbacks(D31, &t, &[], PERIOD, QUIET, at(0)),
            Failbacks::default()
        );
    }

    #[test]
    fn one_shard_per_pass_in_shard_order() {
        // Shards 0 and 1 both off home.
        let mut n = failed_over31();
        n[2].slots = "";
        n[2].primary_of = Some(4);
        n[3].slots = "5461-10922";
        n[3].primary_of = None;
        let t = world(&n, &[1, 2, 3, 4, 5, 6]);
        let first = failbacks(D31, &t, &[], PERIOD, QUIET, at(0));
        assert_eq!(first.due.keys().copied().collect::<Vec<_>>(), [0, 1]);
        let mut prev = status(&first, "pod-0-1");
        prev[1].primary_pod = Some("pod-1-1".into());
        let due = failbacks(D31, &t, &prev, PERIOD, QUIET, at(600));
        assert_eq!(due.step, Some(failback0()));
    }

    /// The production planner with failback on, over `t`, with the status entries `previous`.
    fn plan_at(t: &Topology, previous: &[ShardStatus], now: Timestamp) -> super::super::Plan {
        let ips = ips(0, 6);
        super::super::plan(&super::super::Input {
            layout: D31,
            topology: t,
            pod_ips: &ips,
            terminating: &BTreeMap::new(),
            nodes: &[],
            desired_nodes: &[],
            timing: super::super::FailoverTiming::default(),
            now,
            failback: PERIOD,
            previous_shards: previous,
        })
    }

    #[test]
    fn the_planner_keeps_the_due_time_in_the_shard_status_and_fails_back_last() {
        let t = world(&failed_over31(), &[1, 2, 3, 4, 5, 6]);
        let first = plan_at(&t, &[], at(0));
        assert_eq!(first.step, None);
        assert_eq!(first.shards[0].failback_at, Some(Time(at(600))));
        assert_eq!(first.shards[1].failback_at, None);
        assert_eq!(first.retry_in, Some(Duration::from_secs(600)));
        let due = plan_at(&t, &first.shards, at(600));
        assert_eq!(due.step, Some(failback0()));
        // A departed node to forget is a change: no failback, and the wait restarts.
        let mut n = failed_over31();
        n.push(node(7, 2, 1));
        let departed = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        let busy = plan_at(&departed, &first.shards, at(600));
        assert!(
            !matches!(busy.step, Some(Step::Failback(_)) | None),
            "{:?}",
            busy.step
        );
        assert_eq!(busy.shards[0].failback_at, None);
    }
}
