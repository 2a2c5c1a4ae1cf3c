//! The PodDisruptionBudget `valkey-<cluster>` (mode Cluster: `maxUnavailable: 1` over all pods).

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use valkey_api::ValkeyClusterSpec;

use super::names;

/// The cluster's PodDisruptionBudget, or `None` when `podDisruptionBudget.mode` is Disabled
/// (the caller then deletes an existing one).
pub fn pod_disruption_budget(
    cluster: &str,
    namespace: &str,
    spec: &ValkeyClusterSpec,
    owner: Option<OwnerReference>,
) -> Option<PodDisruptionBudget> {
    spec.pdb_enabled().then(|| PodDisruptionBudget {
        metadata: names::child_meta(names::pdb_name(cluster), cluster, namespace, owner),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(names::cluster_selector(cluster)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdb_snapshot_and_disabled() {
        let s: ValkeyClusterSpec =
            serde_json::from_value(serde_json::json!({"shards": 1})).unwrap();
        insta::assert_yaml_snapshot!(pod_disruption_budget("c", "ns", &s, None));
        let s: ValkeyClusterSpec = serde_json::from_value(
            serde_json::json!({"shards": 1, "podDisruptionBudget": {"mode": "Disabled"}}),
        )
        .unwrap();
        assert!(pod_disruption_budget("c", "ns", &s, None).is_none());
    }
}
