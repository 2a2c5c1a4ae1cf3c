//! `status.operation`: the risky topology operation in progress (a slot rebalance or an
//! operator-driven failover), shown to users while it runs. Pure; the operator itself resumes
//! from the live view (open slots, migrations, replica links), never from this record.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use valkey_api::status::OperationStatus;

use super::topology::Step;

/// The operation of a pass that executed `step` (`None` once no risky step runs). The start
/// time is kept while the same kind of operation continues over several passes.
pub fn operation(
    step: Option<&Step>,
    previous: Option<&OperationStatus>,
    now: &Time,
) -> Option<OperationStatus> {
    let (shard_index, detail) = match step? {
        Step::MigrateSlots { source, moves } => {
            let targets: Vec<String> = moves
                .iter()
                .map(|(_, shard, ranges)| {
                    let r: Vec<String> = ranges.iter().map(ToString::to_string).collect();
                    format!("{} to shard {shard}", r.join(","))
                })
                .collect();
            (
                None,
                format!("moving slots from {source}: {}", targets.join("; ")),
            )
        }
        Step::Failover {
            replica,
            shard,
            failed,
            mode,
        } => (
            Some(*shard),
            format!("promoting {replica} ({mode:?}) in place of failed primary {failed}"),
        ),
        _ => return None,
    };
    let kind = step?.kind().to_owned();
    let started_at = previous
        .filter(|p| p.kind == kind)
        .and_then(|p| p.started_at.clone())
        .or_else(|| Some(now.clone()));
    Some(OperationStatus {
        kind,
        started_at,
        shard_index,
        detail: Some(detail),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use valkey_ops::SlotRange;
    use valkey_ops::commands::FailoverMode;

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).expect("time"))
    }

    fn migrate(target: i32) -> Step {
        Step::MigrateSlots {
            source: "10.0.0.1:6379".into(),
            moves: vec![(
                "id".into(),
                target,
                vec![SlotRange::new(0, 4095).expect("range")],
            )],
        }
    }

    #[test]
    fn rebalance_keeps_its_start_time_across_batches_and_clears_when_done() {
        let first = operation(Some(&migrate(3)), None, &at(10)).expect("operation");
        assert_eq!(first.kind, "MigrateSlots");
        assert_eq!(first.started_at, Some(at(10)));
        assert!(
            first
                .detail
                .as_deref()
                .is_some_and(|d| d.contains("0-4095 to shard 3"))
        );
        let next = operation(Some(&migrate(4)), Some(&first), &at(20)).expect("operation");
        assert_eq!(next.started_at, Some(at(10)));
        let meet = Step::Meet {
            seed: "a".into(),
            nodes: vec!["b".into()],
        };
        assert_eq!(operation(Some(&meet), Some(&next), &at(30)), None);
        assert_eq!(operation(None, Some(&next), &at(30)), None);
    }

    #[test]
    fn failover_names_its_shard() {
        let step = Step::Failover {
            replica: "10.0.0.2:6379".into(),
            shard: 1,
            failed: "abc".into(),
            mode: FailoverMode::Takeover,
        };
        let op = operation(Some(&step), None, &at(5)).expect("operation");
        assert_eq!((op.kind.as_str(), op.shard_index), ("Failover", Some(1)));
    }
}
