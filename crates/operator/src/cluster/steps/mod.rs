//! Acting: runs the one step of a pass (idempotent Valkey commands, or the ValkeyNode write
//! that authorizes a roll or removes a surplus node), reporting what happened as events and
//! as the Progressing/Degraded facts of the pass.
//!
//! One module per step, each with a `run` function; the per-target loop that most steps share
//! (call each target, count what changed, report each failure) is [`each_target`]. A new step
//! is a variant of [`Step`] (planned in `plan/`), its module here, and its line in [`execute`].

mod assign_slots;
mod authorize_roll;
mod coordinated_failover;
mod finish_open_slots;
mod forced_failover;
mod forget;
mod meet;
mod migrate_slots;
mod replicate;
mod retire;

use std::future::Future;

use kube::Api;
use tracing::{info, warn};
use valkey_api::ValkeyNode;
use valkey_ops::client::NodePool;
use valkey_ops::commands::CommandError;

use super::plan::Step;
use crate::bounded::map_in_order;
use crate::status::{EventSpec, FailureKind, Progress, StepFailure, text};

/// Outcome of a step.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Events to publish.
    pub events: Vec<EventSpec>,
    /// The work in progress while the step's effect is pending.
    pub progress: Option<Progress>,
    /// The failure, when the step failed.
    pub failure: Option<StepFailure>,
    /// Whether any command changed the cluster.
    pub acted: bool,
    /// What a migration batch moved.
    pub moved: Option<Moved>,
}

/// What a migration batch moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Slots that changed owner.
    pub slots: usize,
    /// Keys moved (counted by key-by-key migration; for atomic migration, the keys its slots
    /// held when the batch started).
    pub keys: Option<u64>,
}

/// What a step acts through.
pub struct Actor<'a> {
    /// The cluster's connection pool.
    pub pool: &'a NodePool,
    /// The ValkeyNodes of the cluster's namespace; `None` where only Valkey is driven (tests
    /// of the topology loop against bare servers), and the ValkeyNode steps do nothing.
    pub nodes: Option<&'a Api<ValkeyNode>>,
}

/// Runs `step`.
pub async fn execute(actor: &Actor<'_>, step: &Step) -> Outcome {
    let pool = actor.pool;
    match step {
        Step::Meet { seed, nodes } => meet::run(pool, *seed, nodes, false).await,
        Step::ReMeet { seed, nodes } => meet::run(pool, *seed, nodes, true).await,
        Step::AssignSlots { assignments } => assign_slots::run(pool, assignments).await,
        Step::Replicate { attachments } => replicate::run(pool, attachments).await,
        Step::MigrateSlots {
            transfers,
            by_key,
            others,
        } => migrate_slots::run(pool, transfers, *by_key, others).await,
        Step::FinishOpenSlots { primaries } => finish_open_slots::run(pool, primaries).await,
        Step::Failover {
            replica,
            shard,
            failed,
            mode,
        } => forced_failover::run(pool, *replica, *shard, failed, *mode).await,
        Step::Forget { node_id, addrs } => forget::run(pool, node_id, addrs).await,
        Step::Retire {
            forget,
            at,
            reset,
            names,
        } => match actor.nodes {
            Some(nodes) => retire::run(pool, nodes, forget, at, reset, names).await,
            None => Outcome::default(),
        },
        Step::HandOver {
            replica,
            shard,
            primary,
        } => coordinated_failover::run(pool, *replica, *shard, primary).await,
        Step::AuthorizeRoll { node } => match actor.nodes {
            Some(nodes) => authorize_roll::run(nodes, node).await,
            None => Outcome::default(),
        },
    }
}

/// How many targets of a step are called at once.
pub const TARGETS_IN_FLIGHT: usize = 16;

/// How a step built on [`each_target`] reports.
pub struct Reporting {
    /// The events' action.
    pub action: &'static str,
    /// The Normal event's reason when one target, and when several, changed something.
    pub done: Option<(&'static str, &'static str)>,
    /// The Warning event's reason of a failed target (none: the failure is only logged).
    pub failed: Option<&'static str>,
    /// The pass's failure kind when a target failed (none: the pass does not fail).
    pub failure: Option<FailureKind>,
}

/// Why a target failed: the Warning event's message and the pass's failure message.
pub struct TargetError {
    /// The event's message.
    pub event: String,
    /// The failure's message.
    pub failure: String,
}

/// The per-target loop of a step: calls `call` on every target, a bounded number at once
/// ([`TARGETS_IN_FLIGHT`]; the targets of a step are independent), and reads the results in
/// the targets' order. A call returns the
/// label of what it changed (joined into one Normal event, `done_message`), `None` when
/// there was nothing to do, or an error: `NotReady` counts the target as waiting (logged);
/// any other error is logged and, per `reporting`, fails the pass and is told in the pass's
/// one Warning event (`describe`; several failures are summarised in one event, so a large
/// cluster does not flood its events). Returns the number of waiting targets.
pub async fn each_target<'t, T, F, Fut>(
    out: &mut Outcome,
    reporting: &Reporting,
    targets: &'t [T],
    call: F,
    describe: impl Fn(&T, &CommandError) -> TargetError,
    done_message: impl FnOnce(&[String]) -> String,
) -> usize
where
    T: std::fmt::Debug,
    F: Fn(&'t T) -> Fut,
    Fut: Future<Output = Result<Option<String>, CommandError>> + 't,
{
    let mut done = Vec::new();
    let mut failed = Vec::new();
    let mut waiting = 0;
    let results = map_in_order(targets, TARGETS_IN_FLIGHT, &call).await;
    for (target, result) in targets.iter().zip(results) {
        match result {
            Ok(Some(label)) => done.push(label),
            Ok(None) => {}
            Err(CommandError::NotReady(m)) => {
                waiting += 1;
                info!(action = reporting.action, ?target, "waits: {m}");
            }
            Err(e) => {
                warn!(action = reporting.action, ?target, error = %e, "step target failed");
                failed.push(describe(target, &e));
            }
        }
    }
    if let Some(first) = failed.first() {
        let more = |one: &str| match failed.len() {
            1 => one.to_owned(),
            n => format!("{one} (and {} more failed)", n - 1),
        };
        if let Some(reason) = reporting.failed {
            let events: Vec<&str> = failed.iter().map(|f| f.event.as_str()).collect();
            let note = match events.len() {
                1 => events[0].to_owned(),
                _ => text::list("failures", &events),
            };
            out.events
                .push(EventSpec::warning(reason, reporting.action, note));
        }
        if let Some(kind) = reporting.failure {
            out.failure = Some(StepFailure::new(kind, more(&first.failure)));
        }
    }
    if !done.is_empty() {
        out.acted = true;
        if let Some((one, many)) = reporting.done {
            let reason = if done.len() == 1 { one } else { many };
            out.events.push(EventSpec::normal(
                reason,
                reporting.action,
                done_message(&done),
            ));
        }
    }
    waiting
}
