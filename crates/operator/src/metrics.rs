//! Prometheus metrics of the operator: reconcile counts, errors and durations per controller,
//! and the state of every ValkeyCluster.

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

    /// Removes the state gauges of a deleted cluster.
    pub fn forget_cluster(&self, namespace: &str, name: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counts_and_states() {
        let m = Metrics::new();
        m.reconciled("valkeycluster", Duration::from_millis(20), false);
        m.reconciled("valkeycluster", Duration::from_millis(20), true);
        m.set_cluster_state("ns", "c", ClusterState::Ready);
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
        m.forget_cluster("ns", "c");
        assert!(!m.encode().contains("name=\"c\""));
    }
}
