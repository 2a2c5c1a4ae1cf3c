//! The PodDisruptionBudgets of a cluster: `valkey-<cluster>` over all pods (mode Cluster), or
//! `valkey-<cluster>-shard-<n>` over each shard's pods (mode Shard), each allowing one of its
//! pods down.
//!
//! "One down" is written `minAvailable: <pods> - 1`, not `maxUnavailable: 1`: for
//! `maxUnavailable` the disruption controller counts the expected pods from the controllers of
//! the pods that exist *now*, and each Valkey pod has its own one-replica StatefulSet or
//! Deployment. Between an evicted pod's deletion and its recreation its controller drops out
//! of the count, the budget's expected size shrinks by one, and it allows a second eviction:
//! a shard's last copy (seen in CI). An integer `minAvailable` is compared with the healthy
//! pods alone.

use std::collections::BTreeMap;

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use valkey_api::ValkeyClusterSpec;
use valkey_api::disruption::PdbMode;

use super::names;

/// The cluster's PodDisruptionBudgets for `podDisruptionBudget.mode` (none when Disabled; the
/// caller deletes those it owns that are not listed, once these are applied).
pub fn pod_disruption_budgets(
    cluster: &str,
    namespace: &str,
    spec: &ValkeyClusterSpec,
    owner: Option<OwnerReference>,
) -> Vec<PodDisruptionBudget> {
    let budget =
        |name: String, selector: BTreeMap<String, String>, pods: i32| PodDisruptionBudget {
            metadata: names::child_meta(name, cluster, namespace, owner.clone()),
            spec: Some(PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int((pods - 1).max(0))),
                selector: Some(LabelSelector {
                    match_labels: Some(selector),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
    let per_shard = spec.replicas.max(0) + 1;
    match spec.pod_disruption_budget.mode {
        PdbMode::Cluster => vec![budget(
            names::pdb_name(cluster),
            names::cluster_selector(cluster),
            spec.shards.max(0) * per_shard,
        )],
        PdbMode::Shard => (0..spec.shards.max(0))
            .map(|s| {
                budget(
                    names::shard_pdb_name(cluster, s),
                    names::shard_selector(cluster, s),
                    per_shard,
                )
            })
            .collect(),
        PdbMode::Disabled => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> ValkeyClusterSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn pdb_snapshot_and_disabled() {
        let s = spec(serde_json::json!({"shards": 1}));
        let pdbs = pod_disruption_budgets("c", "ns", &s, None);
        assert_eq!(pdbs.len(), 1);
        insta::assert_yaml_snapshot!(pdbs.first());
        let s = spec(serde_json::json!({"shards": 1, "podDisruptionBudget": {"mode": "Disabled"}}));
        assert!(pod_disruption_budgets("c", "ns", &s, None).is_empty());
    }

    #[test]
    fn every_budget_allows_exactly_one_pod_down() {
        let min_available = |v: serde_json::Value| -> Vec<Option<IntOrString>> {
            pod_disruption_budgets("c", "ns", &spec(v), None)
                .into_iter()
                .map(|p| p.spec.unwrap().min_available)
                .collect()
        };
        let int = |n| Some(IntOrString::Int(n));
        assert_eq!(
            min_available(serde_json::json!({"shards": 3, "replicas": 2})),
            [int(8)]
        );
        assert_eq!(min_available(serde_json::json!({"shards": 1})), [int(0)]);
        assert_eq!(
            min_available(serde_json::json!({
                "shards": 2, "replicas": 2, "podDisruptionBudget": {"mode": "Shard"}
            })),
            [int(2), int(2)]
        );
    }

    #[test]
    fn shard_mode_has_one_budget_per_shard_over_its_pods() {
        let s = spec(serde_json::json!({
            "shards": 3, "replicas": 1, "podDisruptionBudget": {"mode": "Shard"}
        }));
        let pdbs = pod_disruption_budgets("c", "ns", &s, None);
        let names: Vec<String> = pdbs
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        assert_eq!(
            names,
            ["valkey-c-shard-0", "valkey-c-shard-1", "valkey-c-shard-2"]
        );
        let spec = pdbs[2].spec.as_ref().unwrap();
        assert_eq!(
            (spec.min_available.clone(), spec.max_unavailable.clone()),
            (Some(IntOrString::Int(1)), None),
            "one of a shard's two pods may be down"
        );
        let selector = spec
            .selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap();
        assert_eq!(selector, &names::shard_selector("c", 2));
        assert_eq!(
            pdbs[0].metadata.labels,
            Some(names::cluster_labels("c")),
            "listed (and deleted as orphans) by the cluster label"
        );
    }
}
