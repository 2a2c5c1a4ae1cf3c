//! `AssignSlots`: assign unowned slots to shard primaries (`CLUSTER ADDSLOTSRANGE`).

use std::net::SocketAddr;

use valkey_api::status::event;
use valkey_ops::SlotRange;
use valkey_ops::commands;

use super::{Act, Actor, Outcome, Reporting, TargetError, each_target};
use crate::status::{Activity, FailureKind, Progress};
use crate::text;

pub(super) const REPORTING: Reporting = Reporting {
    action: "AssignSlots",
    done: Some((event::PRIMARY_CREATED, event::PRIMARIES_CREATED)),
    failed: Some(event::SLOT_ASSIGNMENT_FAILED),
    failure: Some(FailureKind::NodeAddFailed),
};

/// Assign unowned slots to shard primaries (the initial plan's ranges).
#[derive(Clone, Debug, PartialEq)]
pub struct AssignSlots {
    /// (primary address, shard index, ranges).
    pub assignments: Vec<(SocketAddr, i32, Vec<SlotRange>)>,
}

impl Act for AssignSlots {
    /// Assigns each (primary address, shard, ranges).
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let assignments = &self.assignments;
        let mut out = Outcome::default();
        each_target(
            &mut out,
            &REPORTING,
            assignments,
            |(addr, shard, ranges)| async move {
                let n = commands::add_slots_range(pool, &addr.to_string(), ranges).await?;
                Ok((n > 0).then(|| format!("shard {shard}: {n} slots")))
            },
            |(addr, shard, _), e| TargetError {
                event: format!("shard {shard} at {addr}: {e}"),
                failure: format!("assigning slots to shard {shard}: {e}"),
            },
            |done| format!("assigned slots: {}", text::list("primaries", done)),
        )
        .await;
        out.progress = Some(Progress::new(
            Activity::AddingNodes,
            "assigning slots to primaries",
        ));
        out
    }
}
