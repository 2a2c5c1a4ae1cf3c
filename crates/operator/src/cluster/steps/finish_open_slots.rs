//! `FinishOpenSlots`: complete slots left half-migrated (`MIGRATING`/`IMPORTING`) by an
//! interrupted key-by-key migration, toward the target they were going to.

use std::net::SocketAddr;

use tracing::{info, warn};
use valkey_ops::commands::{self, KeyMigrationOptions};

use super::{Act, Actor, Outcome};
use crate::status::{Activity, FailureKind, Progress, StepFailure};

/// Complete slots left half-migrated (`MIGRATING`/`IMPORTING`) by an interrupted key-by-key
/// migration, toward the target they were going to.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishOpenSlots {
    /// Addresses of every shard primary.
    pub primaries: Vec<SocketAddr>,
}

impl Act for FinishOpenSlots {
    /// Finishes the open slots of every primary at `primaries`.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let primaries = &self.primaries;
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
}
