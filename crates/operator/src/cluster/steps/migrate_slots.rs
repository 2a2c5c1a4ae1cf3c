//! `MigrateSlots`: one batch of the minimal-move plan, whose transfers (distinct sources and
//! targets) run concurrently: atomic `CLUSTER MIGRATESLOTS` on Valkey 9, key by key with
//! `MIGRATE` on Valkey 8.

use std::net::SocketAddr;
use std::time::Duration;

use tracing::warn;
use valkey_api::status::event;
use valkey_ops::commands::{self, KeyMigrationOptions};

use super::{Act, Actor, OperationView, Moved, Outcome};
use valkey_ops::SlotRange;
use crate::status::{Activity, EventSpec, FailureKind, Progress, StepFailure, text};

/// Longest wait for one slot-migration batch.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Move slots between shard primaries: one batch of the minimal-move plan, whose transfers
/// are independent (distinct sources and targets) and run concurrently.
#[derive(Clone, Debug, PartialEq)]
pub struct MigrateSlots {
    /// The transfers of the batch.
    pub transfers: Vec<Transfer>,
    /// Key by key with `MIGRATE` (Valkey 8) instead of atomic `CLUSTER MIGRATESLOTS`.
    pub by_key: bool,
    /// Every reachable member, told the new owner after a key-by-key transfer.
    pub others: Vec<SocketAddr>,
}

impl Act for MigrateSlots {
    fn operation_view(&self) -> Option<OperationView> {
        let routes = self
            .transfers
            .iter()
            .map(|t| {
                format!(
                    "{} slots shard {} -> {}",
                    t.slot_count(),
                    t.source_shard,
                    t.target_shard
                )
            })
            .collect();
        Some(OperationView::Batch { routes })
    }

    /// Runs the transfers of one migration batch concurrently.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let Self {
            transfers,
            by_key,
            others,
        } = self;
        let by_key = *by_key;
        let others: Vec<String> = others.iter().map(ToString::to_string).collect();
        let results = futures::future::join_all(transfers.iter().map(|t| {
            let others = &others;
            async move {
                let src = t.source.to_string();
                let slots: Vec<u16> = t.ranges.iter().flat_map(|r| r.iter()).collect();
                let r = if by_key {
                    let opts = KeyMigrationOptions::default();
                    let tgt = t.target.to_string();
                    commands::migrate_slot_keys(pool, &src, &tgt, &slots, others, &opts)
                        .await
                        .map(|keys| (t.slot_count(), Some(keys)))
                } else {
                    // The slots move with their keys in one job: count them first (best effort).
                    let keys = commands::count_keys_in_slots(pool, &src, &slots).await.ok();
                    let mv = [commands::AtomicMove {
                        ranges: t.ranges.clone(),
                        target_id: t.target_id.clone(),
                    }];
                    commands::migrate_slots_atomic(pool, &src, &mv, MIGRATION_TIMEOUT)
                        .await
                        .map(|n| (n, keys.filter(|_| n > 0)))
                };
                (t, r)
            }
        }))
        .await;
        let mut out = Outcome::default();
        let mut moved = Moved::default();
        for (t, r) in results {
            let (what, ok_reason, failed_reason) = if t.draining {
                ("draining", event::SLOTS_DRAINING, event::DRAIN_FAILED)
            } else {
                (
                    "moving",
                    event::SLOTS_REBALANCING,
                    event::SLOT_REBALANCE_FAILED,
                )
            };
            let route = format!(
                "{} slots from shard {} ({}) to shard {} ({})",
                t.slot_count(),
                t.source_shard,
                t.source,
                t.target_shard,
                t.target
            );
            match r {
                Ok((slots, keys)) => {
                    out.acted |= slots > 0;
                    moved.slots += slots;
                    moved.keys = match (moved.keys, keys) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    };
                    if slots > 0 {
                        out.events.push(EventSpec::normal(
                            ok_reason,
                            "MigrateSlots",
                            format!("{what} {route}"),
                        ));
                    }
                }
                Err(e) => {
                    warn!(source = %t.source, target = %t.target, error = %e, "slot migration failed");
                    out.events.push(EventSpec::warning(
                        failed_reason,
                        "MigrateSlots",
                        format!("{what} {route}: {e}"),
                    ));
                    out.failure = Some(StepFailure::new(
                        FailureKind::RebalanceFailed,
                        format!("{what} {route}: {e}"),
                    ));
                }
            }
        }
        let routes: Vec<String> = transfers
            .iter()
            .map(|t| format!("shard {} -> {}", t.source_shard, t.target_shard))
            .collect();
        out.progress = Some(Progress::new(
            Activity::RebalancingSlots,
            format!("moving slots: {}", text::list("transfers", &routes)),
        ));
        out.moved = Some(moved);
        out
    }
}

/// Slots moving from one shard primary to another.
#[derive(Clone, Debug, PartialEq)]
pub struct Transfer {
    /// Address of the source primary.
    pub source: SocketAddr,
    /// Shard index of the source.
    pub source_shard: i32,
    /// Address of the target primary.
    pub target: SocketAddr,
    /// Node id of the target primary.
    pub target_id: String,
    /// Shard index of the target.
    pub target_shard: i32,
    /// The slots.
    pub ranges: Vec<SlotRange>,
    /// The source's shard is being removed (a drain).
    pub draining: bool,
}

impl Transfer {
    /// Number of slots.
    pub fn slot_count(&self) -> usize {
        self.ranges.iter().map(SlotRange::len).sum()
    }
}
