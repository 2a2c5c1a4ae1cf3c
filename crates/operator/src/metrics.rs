//! Prometheus metrics of the operator: reconcile counts, errors (by reason) and durations per
//! controller, and per ValkeyCluster its state, desired and ready shards, slots with an owner,
//! slots still to move and failovers (a shard's primary pod changed).

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use valkey_api::status::ClusterState;

/// Label set naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `valkeycluster` or `valkeynode`.
    pub controller: String,
}

/// Label set of a cluster state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    /// Namespace of the ValkeyCluster.
    pub namespace: String,
    /// Name of the ValkeyCluster.
    pub name: String,
    /// One of the states; the gauge is 1 for the current state and 0 for the others.
    pub state: String,
}

/// Label set naming a ValkeyCluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabels {
    /// Namespace of the ValkeyCluster.
    pub namespace: String,
    /// Name of the ValkeyCluster.
    pub name: String,
}

/// Label set of a failed reconcile pass.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// `valkeycluster` or `valkeynode`.
    pub controller: String,
    /// What failed (`observe`, `report`, ...).
    pub reason: String,
}

/// What a reconcile pass saw of one cluster (see [`Metrics::set_cluster_figures`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterFigures {
    /// `spec.shards`.
    pub desired_shards: i64,
    /// Shards with a primary and the desired number of synced replicas.
    pub ready_shards: i64,
    /// Slots with an owner (16384 when covered).
    pub slots_assigned: i64,
    /// Slots still to move to balance the shards (0 when no migration is in progress).
    pub slots_to_move: i64,
}

/// Label set of a topology step counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabels {
    /// Step kind (`Meet`, `AssignSlots`, ...).
    pub kind: String,
}

const STATES: [ClusterState; 5] = [
    ClusterState::Initializing,
    ClusterState::Reconciling,
    ClusterState::Ready,
    ClusterState::Degraded,
    ClusterState::Failed,
];

/// All operator metrics, registered in one registry.
pub struct Metrics {
    registry: Mutex<Registry>,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    cluster_state: Family<ClusterLabels, Gauge>,
    steps: Family<StepLabels, Counter>,
    failures: Family<FailureLabels, Counter>,
    desired_shards: Family<NameLabels, Gauge>,
    ready_shards: Family<NameLabels, Gauge>,
    slots_assigned: Family<NameLabels, Gauge>,
    slots_to_move: Family<NameLabels, Gauge>,
    failovers: Family<NameLabels, Counter>,
    slots_migrated: Counter,
    keys_migrated: Counter,
    migration_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    leader: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn controller(c: &str) -> ControllerLabels {
    ControllerLabels {
        controller: c.to_owned(),
    }
}

fn names(namespace: &str, name: &str) -> NameLabels {
    NameLabels {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

impl Metrics {
    /// Creates and registers the metrics.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("valkey_operator");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let errors = Family::<ControllerLabels, Counter>::default();
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let cluster_state = Family::<ClusterLabels, Gauge>::default();
        let steps = Family::<StepLabels, Counter>::default();
        let failures = Family::<FailureLabels, Counter>::default();
        let desired_shards = Family::<NameLabels, Gauge>::default();
        let ready_shards = Family::<NameLabels, Gauge>::default();
        let slots_assigned = Family::<NameLabels, Gauge>::default();
        let slots_to_move = Family::<NameLabels, Gauge>::default();
        let failovers = Family::<NameLabels, Counter>::default();
        let slots_migrated = Counter::default();
        let keys_migrated = Counter::default();
        let migration_seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        let leader = Gauge::default();
        registry.register("reconciles", "Reconcile passes", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Failed reconcile passes",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconcile passes",
            durations.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Failed reconcile passes by what failed",
            failures.clone(),
        );
        registry.register(
            "cluster_shards_desired",
            "spec.shards of each ValkeyCluster",
            desired_shards.clone(),
        );
        registry.register(
            "cluster_shards_ready",
            "Shards of each ValkeyCluster with a primary and the desired number of synced replicas",
            ready_shards.clone(),
        );
        registry.register(
            "cluster_slots_assigned",
            "Hash slots with an owner in each ValkeyCluster (16384 when every slot is covered)",
            slots_assigned.clone(),
        );
        registry.register(
            "cluster_slots_to_move",
            "Hash slots each ValkeyCluster still has to move to balance its shards (a migration is in progress while above 0)",
            slots_to_move.clone(),
        );
        registry.register(
            "cluster_failovers",
            "Failovers seen in each ValkeyCluster (a shard's primary moved to another pod)",
            failovers.clone(),
        );
        registry.register(
            "cluster_state",
            "State of each ValkeyCluster (1 for the current state)",
            cluster_state.clone(),
        );
        registry.register(
            "topology_steps",
            "Topology steps executed by the ValkeyCluster controller",
            steps.clone(),
        );
        registry.register(
            "slots_migrated",
            "Slots moved to another shard (rebalance and drain)",
            slots_migrated.clone(),
        );
        registry.register(
            "keys_migrated",
            "Keys moved with their slots",
            keys_migrated.clone(),
        );
        registry.register(
            "slot_migration_seconds",
            "Time spent moving slots (the migration steps themselves, excluding the passes between them)",
            migration_seconds.clone(),
        );
        registry.register(
            "leader",
            "1 while this instance runs the controllers (holds the Lease, or leader election is off)",
            leader.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            reconciles,
            errors,
            durations,
            cluster_state,
            steps,
            failures,
            desired_shards,
            ready_shards,
            slots_assigned,
            slots_to_move,
            failovers,
            slots_migrated,
            keys_migrated,
            migration_seconds,
            leader,
        }
    }

    /// Records whether this instance runs the controllers.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Records one reconcile pass of `controller_name`.
    pub fn reconciled(&self, controller_name: &str, took: Duration, failed: bool) {
        let l = controller(controller_name);
        self.reconciles.get_or_create(&l).inc();
        if failed {
            self.errors.get_or_create(&l).inc();
        }
        self.durations.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// Runs one reconcile pass of `controller_name`, recording its count, duration and outcome.
    pub async fn reconcile<T, E>(
        &self,
        controller_name: &str,
        pass: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = std::time::Instant::now();
        let r = pass.await;
        self.reconciled(controller_name, started.elapsed(), r.is_err());
        r
    }

    /// Creates the failure counters of `controller_name` at 0, one per reason, so that
    /// `rate()` and `increase()` see the first failure.
    pub fn declare_failures(&self, controller_name: &str, reasons: &[&str]) {
        for reason in reasons {
            let _ = self.failures.get_or_create(&FailureLabels {
                controller: controller_name.to_owned(),
                reason: (*reason).to_owned(),
            });
        }
    }

    /// [`Self::declare_failures`] of every reason the errors `E` of a controller can have.
    pub fn declare_failures_of<E: FailureReason>(&self, controller_name: &str) {
        self.declare_failures(controller_name, E::REASONS);
    }

    /// Records a failed reconcile pass of `controller_name` and what failed.
    pub fn failed(&self, controller_name: &str, reason: &str) {
        self.failures
            .get_or_create(&FailureLabels {
                controller: controller_name.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records a pass of `controller_name` that failed with `err` (labelled by its reason).
    pub fn failed_with<E: FailureReason>(&self, controller_name: &str, err: &E) {
        self.failed(controller_name, err.reason());
    }

    /// Sets the figures of one cluster.
    pub fn set_cluster_figures(&self, namespace: &str, name: &str, f: ClusterFigures) {
        let l = names(namespace, name);
        self.desired_shards.get_or_create(&l).set(f.desired_shards);
        self.ready_shards.get_or_create(&l).set(f.ready_shards);
        self.slots_assigned.get_or_create(&l).set(f.slots_assigned);
        self.slots_to_move.get_or_create(&l).set(f.slots_to_move);
        // The counter exists from the start at 0, so `increase()` counts the first failover.
        let _ = self.failovers.get_or_create(&l);
    }

    /// Counts `n` failovers of one cluster.
    pub fn failovers(&self, namespace: &str, name: &str, n: u64) {
        self.failovers
            .get_or_create(&names(namespace, name))
            .inc_by(n);
    }

    /// Records an executed topology step.
    pub fn step(&self, kind: &str) {
        self.steps
            .get_or_create(&StepLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Records one slot migration step: slots and keys moved, and how long it took.
    pub fn migrated(&self, slots: usize, keys: Option<u64>, took: Duration) {
        self.slots_migrated
            .inc_by(u64::try_from(slots).unwrap_or(u64::MAX));
        self.keys_migrated.inc_by(keys.unwrap_or(0));
        self.migration_seconds.inc_by(took.as_secs_f64());
    }

    /// Sets the state gauges of one cluster.
    pub fn set_cluster_state(&self, namespace: &str, name: &str, state: ClusterState) {
        for s in STATES {
            let v = i64::from(s == state);
            self.cluster_state
                .get_or_create(&ClusterLabels {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    state: format!("{s:?}"),
                })
                .set(v);
        }
    }

    /// Removes the series of a deleted cluster.
    pub fn forget_cluster(&self, namespace: &str, name: &str) {
        let l = names(namespace, name);
        for family in [
            &self.desired_shards,
            &self.ready_shards,
            &self.slots_assigned,
            &self.slots_to_move,
        ] {
            family.remove(&l);
        }
        self.failovers.remove(&l);
        for s in STATES {
            self.cluster_state.remove(&ClusterLabels {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                state: format!("{s:?}"),
            });
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

/// The error of a controller's pass, labelled for `valkey_operator_reconcile_failures_total`
/// by what failed (a bounded set of labels).
pub trait FailureReason {
    /// Every label the errors of this type can have.
    const REASONS: &'static [&'static str];
    /// This error's label (one of [`Self::REASONS`]).
    fn reason(&self) -> &'static str;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counts_and_states() {
        let m = Metrics::new();
        m.reconciled("valkeycluster", Duration::from_millis(20), false);
        m.reconciled("valkeycluster", Duration::from_millis(20), true);
        m.set_cluster_state("ns", "c", ClusterState::Ready);
        m.set_cluster_figures(
            "ns",
            "c",
            ClusterFigures {
                desired_shards: 3,
                ready_shards: 2,
                slots_assigned: 16384,
                slots_to_move: 120,
            },
        );
        m.failovers("ns", "c", 2);
        m.failed("valkeycluster", "observe");
        m.set_leader(true);
        let text = m.encode();
        assert!(text.contains("valkey_operator_leader 1"), "{text}");
        assert!(text.contains("valkey_operator_reconciles_total{controller=\"valkeycluster\"} 2"));
        assert!(
            text.contains("valkey_operator_reconcile_errors_total{controller=\"valkeycluster\"} 1")
        );
        assert!(text.contains(
            "valkey_operator_cluster_state{namespace=\"ns\",name=\"c\",state=\"Ready\"} 1"
        ));
        assert!(text.contains("state=\"Failed\"} 0"));
        for line in [
            "valkey_operator_cluster_shards_desired{namespace=\"ns\",name=\"c\"} 3",
            "valkey_operator_cluster_shards_ready{namespace=\"ns\",name=\"c\"} 2",
            "valkey_operator_cluster_slots_assigned{namespace=\"ns\",name=\"c\"} 16384",
            "valkey_operator_cluster_slots_to_move{namespace=\"ns\",name=\"c\"} 120",
            "valkey_operator_cluster_failovers_total{namespace=\"ns\",name=\"c\"} 2",
            "valkey_operator_reconcile_failures_total{controller=\"valkeycluster\",reason=\"observe\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        m.forget_cluster("ns", "c");
        assert!(!m.encode().contains("name=\"c\""));
    }
}
