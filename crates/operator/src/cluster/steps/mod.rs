//! Acting: the steps a pass plans, one module each, and how they run (idempotent Valkey
//! commands, or the ValkeyNode write that authorizes a roll or removes a surplus node),
//! reporting what happened as events and as the Progressing/Degraded facts of the pass.
//!
//! A step is a type in its own module: its fields (what the planner decided), its events and
//! failure kind, and how it runs ([`Act`]); what `status.operation` shows of it
//! ([`Act::operation_view`]) when it is an operation of its own. The per-target loop most steps
//! share (call each target, count what changed, report the failures) is [`each_target`].
//! Adding a step is its module, its line in the list below (which declares the module, the
//! [`Step`] variant and its dispatch), and its place in the planner's priority list.

use std::future::Future;

use kube::Api;
use tracing::{info, warn};
use valkey_api::ValkeyNode;
use valkey_ops::client::NodePool;
use valkey_ops::commands::CommandError;

use crate::bounded::map_in_order;
use crate::status::{EventSpec, FailureKind, Progress, StepFailure};
use crate::text;

/// Declares each step's module and the [`Step`] enum over the steps' types.
macro_rules! steps {
    ($($module:ident :: $step:ident),+ $(,)?) => {
        $(mod $module;)+
        $(pub use $module::$step;)+

        /// One bounded step of a pass, planned by `plan/` and run by [`execute`]; its kind (for
        /// logs, metrics and `status.operation`) is its type's name ([`Step::kind`]).
        #[derive(Clone, Debug, PartialEq, strum::IntoStaticStr, strum::VariantNames)]
        pub enum Step {
            $(
                #[doc = concat!("See [`", stringify!($step), "`].")]
                $step($step),
            )+
        }

        $(
            impl From<$step> for Step {
                fn from(step: $step) -> Self {
                    Self::$step(step)
                }
            }
        )+

        impl Step {
            /// What `status.operation` shows of the step.
            pub fn operation_view(&self) -> Option<OperationView> {
                match self {
                    $(Self::$step(step) => step.operation_view(),)+
                }
            }
        }

        /// Runs `step`.
        pub async fn execute(actor: &Actor<'_>, step: &Step) -> Outcome {
            match step {
                $(Step::$step(step) => step.run(actor).await,)+
            }
        }
    };
}

steps! {
    claim_and_meet::ClaimAndMeet,
    meet::Meet,
    re_meet::ReMeet,
    assign_slots::AssignSlots,
    replicate::Replicate,
    migrate_slots::MigrateSlots,
    finish_open_slots::FinishOpenSlots,
    forced_failover::Failover,
    forget::Forget,
    retire::Retire,
    coordinated_failover::HandOver,
    authorize_roll::AuthorizeRoll,
    hand_back::Failback,
}

pub use claim_and_meet::Claim;
pub use migrate_slots::Transfer;

impl Step {
    /// Short CamelCase name (for logs, metrics and `status.operation`): the step's type name.
    pub fn kind(&self) -> &'static str {
        self.into()
    }

    /// Every step's kind.
    pub fn kinds() -> &'static [&'static str] {
        <Self as strum::VariantNames>::VARIANTS
    }
}

/// A step: how it runs, and what `status.operation` shows of it.
pub trait Act {
    /// Runs the step once (idempotent: the next pass plans again from what the cluster shows).
    fn run(&self, actor: &Actor<'_>) -> impl Future<Output = Outcome> + Send;

    /// What `status.operation` shows while the step runs: `None` (the default) when the step is
    /// not an operation users follow.
    fn operation_view(&self) -> Option<OperationView> {
        None
    }
}

/// What `status.operation` shows of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperationView {
    /// An operation of its own, named after the step's kind.
    Own {
        /// The shard it acts on.
        shard: i32,
        /// What it does.
        detail: String,
    },
    /// One batch of the slot balance: its routes (`128 slots shard 0 -> 3`).
    Batch {
        /// The routes of the batch.
        routes: Vec<String>,
    },
}

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
