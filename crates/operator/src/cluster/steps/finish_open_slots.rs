//! `FinishOpenSlots`: complete slots left half-migrated (`MIGRATING`/`IMPORTING`) by an
//! interrupted key-by-key migration, toward the target they were going to.

use std::net::SocketAddr;

use tracing::{info, warn};
use valkey_ops::client::NodePool;
use valkey_ops::commands::{self, KeyMigrationOptions};

use super::Outcome;
use crate::status::{Activity, FailureKind, Progress, StepFailure};

/// Finishes the open slots of every primary at `primaries`.
pub async fn run(pool: &NodePool, primaries: &[SocketAddr]) -> Outcome {
    let mut out = Outcome::default();
    let addrs: Vec<String> = primaries.iter().map(ToString::to_string).collect();
    match commands::finish_open_slots(pool, &addrs, &KeyMigrationOptions::default()).await {
        Ok(done) => {
            out.acted = !done.is_empty();
            info!(slots = done.len(), "finished half-migrated slots");
        }
        Err(e) => {
            warn!(error = %e, "finishing half-migrated slots failed");
            out.failure = Some(StepFailure::new(
                FailureKind::RebalanceFailed,
                format!("finishing half-migrated slots: {e}"),
            ));
        }
    }
    out.progress = Some(Progress::new(
        Activity::RebalancingSlots,
        "finishing slots left half-migrated",
    ));
    out
}
