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
use crate::status::{Activity, EventSpec, FailureKind, Progress, StepFailure};
use crate::text;

/// Longest wait for one slot-migration batch.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Move slots between shard primaries: up to a batch's worth of the minimal-move plan's
/// transfers, run concurrently (key by key, with distinct sources and targets; atomically,
/// one command per source for all its targets, a target importing from several sources).
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

    /// Runs the transfers of one step concurrently: key by key, each on its own; atomically,
    /// one `CLUSTER MIGRATESLOTS` per source for all its targets. Reports one event per kind
    /// of outcome (moving, draining, failed), however many transfers the step has.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let by_key = self.by_key;
        let others: Vec<String> = self.others.iter().map(ToString::to_string).collect();
        let others = &others;
        let results = futures::future::join_all(groups(&self.transfers, by_key).into_iter().map(
            |group| async move {
                let src = group[0].source.to_string();
                let slots: Vec<u16> = group
                    .iter()
                    .flat_map(|t| t.ranges.iter().flat_map(|r| r.iter()))
                    .collect();
                let r = if by_key {
                    let opts = KeyMigrationOptions::default();
                    let tgt = group[0].target.to_string();
                    commands::migrate_slot_keys(pool, &src, &tgt, &slots, others, &opts)
                        .await
                        .map(|keys| (slots.len(), Some(keys)))
                } else {
                    // The slots move with their keys: count them first (best effort).
                    let keys = commands::count_keys_in_slots(pool, &src, &slots).await.ok();
                    let moves: Vec<commands::AtomicMove> = group
                        .iter()
                        .map(|t| commands::AtomicMove {
                            ranges: t.ranges.clone(),
                            target_id: t.target_id.clone(),
                        })
                        .collect();
                    commands::migrate_slots_atomic(pool, &src, &moves, MIGRATION_TIMEOUT)
                        .await
                        .map(|n| (n, keys.filter(|_| n > 0)))
                };
                (group, r)
            },
        ))
        .await;
        let mut out = Outcome::default();
        let mut moved = Moved::default();
        let (mut moving, mut draining, mut failed) = (Vec::new(), Vec::new(), Vec::new());
        for (group, r) in results {
            match r {
                Ok((slots, keys)) => {
                    out.acted |= slots > 0;
                    moved.slots += slots;
                    moved.keys = match (moved.keys, keys) {
                        (Some(a), Some(b)) => Some(a + b),
                        (a, b) => a.or(b),
                    };
                    if slots > 0 {
                        for t in group {
                            let done = if t.draining { &mut draining } else { &mut moving };
                            done.push(t.route());
                        }
                    }
                }
                Err(e) => {
                    let source = group[0].source;
                    warn!(%source, error = %e, "slot migration failed");
                    let routes: Vec<String> = group.iter().map(|t| t.route()).collect();
                    failed.push((group[0].draining, text::list("transfers", &routes), e));
                }
            }
        }
        for (routes, reason, what) in [
            (moving, event::SLOTS_REBALANCING, "moving"),
            (draining, event::SLOTS_DRAINING, "draining"),
        ] {
            if !routes.is_empty() {
                out.events.push(EventSpec::normal(
                    reason,
                    "MigrateSlots",
                    format!("{what} {}", text::list("transfers", &routes)),
                ));
            }
        }
        if let Some((drain, _, _)) = failed.first() {
            let (what, reason) = if *drain {
                ("draining", event::DRAIN_FAILED)
            } else {
                ("moving", event::SLOT_REBALANCE_FAILED)
            };
            let notes: Vec<String> = failed
                .iter()
                .map(|(_, routes, e)| format!("{routes}: {e}"))
                .collect();
            let note = format!("{what} {}", text::list("failures", &notes));
            out.events
                .push(EventSpec::warning(reason, "MigrateSlots", note.clone()));
            out.failure = Some(StepFailure::new(FailureKind::RebalanceFailed, note));
        }
        let routes: Vec<String> = self
            .transfers
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

/// The transfers run together: key by key each alone, atomically those of one source.
fn groups(transfers: &[Transfer], by_key: bool) -> Vec<Vec<&Transfer>> {
    let mut groups: Vec<Vec<&Transfer>> = Vec::new();
    for t in transfers {
        match groups.iter_mut().find(|g| !by_key && g[0].source == t.source) {
            Some(g) => g.push(t),
            None => groups.push(vec![t]),
        }
    }
    groups
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
    /// `N slots from shard S (addr) to shard T (addr)`.
    fn route(&self) -> String {
        format!(
            "{} slots from shard {} ({}) to shard {} ({})",
            self.slot_count(),
            self.source_shard,
            self.source,
            self.target_shard,
            self.target
        )
    }

    /// Number of slots.
    pub fn slot_count(&self) -> usize {
        self.ranges.iter().map(SlotRange::len).sum()
    }
}
