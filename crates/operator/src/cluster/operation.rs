//! `status.operation`: the risky topology operation in progress (a slot rebalance or drain, or
//! an operator-driven failover), shown to users while it runs. Pure; the operator itself
//! resumes from the live view (open slots, migrations, replica links), never from this record.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use valkey_api::status::OperationStatus;

use super::plan::Balance;
use super::steps::{Moved, OperationView, Step};
use crate::text;

/// What the operation of a pass is derived from.
#[derive(Clone, Copy, Debug)]
pub struct Pass<'a> {
    /// The step executed, if any.
    pub step: Option<&'a Step>,
    /// The slot balance observed before the step.
    pub balance: &'a Balance,
    /// What the step moved.
    pub moved: Option<Moved>,
    /// Now.
    pub now: &'a Time,
}

/// The operation of a pass (`None` once nothing risky is under way). A slot balance lasts
/// until the slots are balanced, over many passes: its start time and counters are carried
/// from `previous`.
pub fn operation(pass: Pass<'_>, previous: Option<&OperationStatus>) -> Option<OperationStatus> {
    let view = pass.step.and_then(Step::operation_view);
    if let (Some(step), Some(OperationView::Own { shard, detail })) = (pass.step, &view) {
        let kind = step.kind();
        return Some(OperationStatus {
            kind: kind.into(),
            started_at: started(previous, kind, pass.now),
            shard_index: Some(*shard),
            detail: Some(detail.clone()),
            slots_total: None,
            slots_moved: None,
            keys_moved: None,
            keys_per_second: None,
            eta_seconds: None,
        });
    }
    let Balance::Moving {
        remaining,
        draining,
    } = pass.balance
    else {
        return None;
    };
    const KIND: &str = "MigrateSlots";
    let prev = previous.filter(|p| p.kind == KIND);
    let moved_now = pass.moved.unwrap_or_default();
    let slots_moved = prev.and_then(|p| p.slots_moved).unwrap_or(0)
        + i32::try_from(moved_now.slots).unwrap_or(i32::MAX);
    let left = i32::try_from(remaining.saturating_sub(moved_now.slots)).unwrap_or(i32::MAX);
    let keys_moved = match (prev.and_then(|p| p.keys_moved), moved_now.keys) {
        (Some(a), Some(b)) => Some(a + i64::try_from(b).unwrap_or(i64::MAX)),
        (a, b) => a.or(b.and_then(|b| i64::try_from(b).ok())),
    };
    let started_at = started(previous, KIND, pass.now);
    let elapsed = started_at
        .as_ref()
        .map(|s| pass.now.0.as_second() - s.0.as_second())
        .unwrap_or(0);
    let eta_seconds = (slots_moved > 0 && elapsed > 0)
        .then(|| i64::from(left) * elapsed / i64::from(slots_moved));
    let routes = match view {
        Some(OperationView::Batch { routes }) => routes,
        _ => Vec::new(),
    };
    let routes = if routes.is_empty() {
        "waiting for the next batch".into()
    } else {
        text::list("transfers", &routes)
    };
    let detail = if draining.is_empty() {
        format!("rebalancing: {routes}")
    } else {
        let d: Vec<String> = draining.iter().map(ToString::to_string).collect();
        format!("draining shard(s) {}: {routes}", text::list("shards", &d))
    };
    Some(OperationStatus {
        kind: KIND.into(),
        started_at,
        shard_index: None,
        detail: Some(detail),
        slots_total: Some(slots_moved + left),
        slots_moved: Some(slots_moved),
        keys_moved,
        keys_per_second: keys_moved.filter(|_| elapsed > 0).map(|k| k / elapsed),
        eta_seconds,
    })
}

fn started(previous: Option<&OperationStatus>, kind: &str, now: &Time) -> Option<Time> {
    previous
        .filter(|p| p.kind == kind)
        .and_then(|p| p.started_at.clone())
        .or_else(|| Some(now.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::steps::{self, Transfer};
    use k8s_openapi::jiff::Timestamp;
    use valkey_ops::SlotRange;
    use valkey_ops::commands::FailoverMode;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).expect("time"))
    }

    fn migrate(source: i32, target: i32) -> Step {
        Step::MigrateSlots(steps::MigrateSlots {
            transfers: vec![Transfer {
                source: "10.0.0.1:6379".parse().unwrap(),
                source_shard: source,
                target: "10.0.0.2:6379".parse().unwrap(),
                target_id: "id".into(),
                target_shard: target,
                ranges: vec![SlotRange::new(0, 1023).expect("range")],
                draining: source > 2,
            }],
            by_key: false,
            others: vec![],
        })
    }

    fn moving(remaining: usize, draining: Vec<i32>) -> Balance {
        Balance::Moving {
            remaining,
            draining,
        }
    }

    #[test]
    fn a_rebalance_counts_slots_and_estimates_until_balanced() {
        let b = moving(4096, vec![3]);
        let moved = Some(Moved {
            slots: 1024,
            keys: Some(50_000),
        });
        let pass = |step, balance, moved, now| Pass {
            step,
            balance,
            moved,
            now,
        };
        let (t10, t20, t30, t40) = (at(10), at(20), at(30), at(40));
        let step = migrate(3, 0);
        let first = operation(pass(Some(&step), &b, moved, &t10), None).expect("op");
        assert_eq!(first.kind, "MigrateSlots");
        assert_eq!(first.started_at, Some(at(10)));
        assert_eq!(
            (first.slots_moved, first.slots_total),
            (Some(1024), Some(4096))
        );
        assert!(
            first
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("draining shard(s) 3"))
        );
        // A pass that only waits keeps the counters and the start.
        let b2 = moving(3072, vec![3]);
        let wait = operation(pass(None, &b2, None, &t20), Some(&first)).expect("op");
        assert_eq!(
            (wait.slots_moved, wait.slots_total),
            (Some(1024), Some(4096))
        );
        assert_eq!(wait.eta_seconds, Some(30));
        let next = operation(pass(Some(&step), &b2, moved, &t30), Some(&wait)).expect("op");
        assert_eq!(next.started_at, Some(at(10)));
        assert_eq!(
            (next.slots_moved, next.slots_total),
            (Some(2048), Some(4096))
        );
        assert_eq!(next.eta_seconds, Some(20));
        assert_eq!(
            (next.keys_moved, next.keys_per_second),
            (Some(100_000), Some(5_000))
        );
        // Balanced: cleared.
        assert_eq!(
            operation(pass(None, &Balance::Balanced, None, &t40), Some(&next)),
            None
        );
    }

    #[test]
    fn failover_names_its_shard() {
        let step = Step::Failover(steps::Failover {
            replica: "10.0.0.2:6379".parse().unwrap(),
            shard: 1,
            failed: "abc".into(),
            mode: FailoverMode::Takeover,
        });
        let now = at(5);
        let pass = Pass {
            step: Some(&step),
            balance: &Balance::Balanced,
            moved: None,
            now: &now,
        };
        let op = operation(pass, None).expect("operation");
        assert_eq!((op.kind.as_str(), op.shard_index), ("Failover", Some(1)));
    }
}
