//! Node and zone spread rendering (`scheduling.node.spread`, `scheduling.zone.spread`) and the
//! pod's resolved scheduling.
//!
//! Node axis (`kubernetes.io/hostname`): `shard` → pod anti-affinity over the shard's pods
//! (Preferred: a weight-100 preferred term, Required: a required term); `primaries` → a
//! topology spread constraint over the cluster's node-index-0 pods, rendered onto node-index-0
//! pods only; `pods` → a topology spread constraint over all pods of the cluster. Zone axis
//! (`topology.kubernetes.io/zone`): all three are topology spread constraints (`shard` scoped
//! to the shard's pods). Preferred → `ScheduleAnyway`, Required → `DoNotSchedule`, `maxSkew: 1`.
//! A Disabled dimension renders nothing, so a cluster that enables nothing renders exactly its
//! pass-through fields. Rendered constraints and anti-affinity terms come first, the user's
//! `topologySpreadConstraints` and `affinity` terms are appended verbatim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, PodAffinityTerm, PodAntiAffinity, TopologySpreadConstraint, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use valkey_api::labels;
use valkey_api::node::NodeScheduling;
use valkey_api::scheduling::{
    HOSTNAME_TOPOLOGY_KEY, SchedulingSpec, SpreadMode, ZONE_TOPOLOGY_KEY,
};

use super::names;

fn selector(labels: BTreeMap<String, String>) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    })
}

fn primaries_selector(cluster: &str) -> BTreeMap<String, String> {
    let mut l = names::cluster_selector(cluster);
    l.insert(labels::NODE_INDEX.to_owned(), "0".to_owned());
    l
}

fn constraint(
    mode: SpreadMode,
    topology_key: &str,
    labels: BTreeMap<String, String>,
) -> Option<TopologySpreadConstraint> {
    Some(TopologySpreadConstraint {
        max_skew: 1,
        topology_key: topology_key.to_owned(),
        when_unsatisfiable: mode.when_unsatisfiable()?.to_owned(),
        label_selector: selector(labels),
        ..Default::default()
    })
}

/// The topology spread constraints the spread axes render for the pod at (`shard_index`,
/// `node_index`), without the pass-through ones.
pub fn spread_constraints(
    scheduling: &SchedulingSpec,
    cluster: &str,
    shard_index: i32,
    node_index: i32,
) -> Vec<TopologySpreadConstraint> {
    let node = &scheduling.node.spread;
    let zone = &scheduling.zone.spread;
    let is_primary_position = node_index == 0;
    let mut out = Vec::new();
    if is_primary_position {
        out.extend(constraint(
            node.primaries.mode,
            HOSTNAME_TOPOLOGY_KEY,
            primaries_selector(cluster),
        ));
    }
    out.extend(constraint(
        node.pods.mode,
        HOSTNAME_TOPOLOGY_KEY,
        names::cluster_selector(cluster),
    ));
    out.extend(constraint(
        zone.shard.mode,
        ZONE_TOPOLOGY_KEY,
        names::shard_selector(cluster, shard_index),
    ));
    if is_primary_position {
        out.extend(constraint(
            zone.primaries.mode,
            ZONE_TOPOLOGY_KEY,
            primaries_selector(cluster),
        ));
    }
    out.extend(constraint(
        zone.pods.mode,
        ZONE_TOPOLOGY_KEY,
        names::cluster_selector(cluster),
    ));
    out
}

/// Merges the `node.spread.shard` anti-affinity into the user's affinity (rendered term first,
/// the user's terms after it; node and pod affinity untouched).
pub fn affinity(scheduling: &SchedulingSpec, cluster: &str, shard_index: i32) -> Option<Affinity> {
    let user = scheduling.affinity.clone();
    let mode = scheduling.node.spread.shard.mode;
    if !mode.is_enabled() {
        return user;
    }
    let term = PodAffinityTerm {
        label_selector: selector(names::shard_selector(cluster, shard_index)),
        topology_key: HOSTNAME_TOPOLOGY_KEY.to_owned(),
        ..Default::default()
    };
    let mut affinity = user.unwrap_or_default();
    let mut anti: PodAntiAffinity = affinity.pod_anti_affinity.take().unwrap_or_default();
    match mode {
        SpreadMode::Required => {
            let mut terms = vec![term];
            terms.extend(
                anti.required_during_scheduling_ignored_during_execution
                    .take()
                    .unwrap_or_default(),
            );
            anti.required_during_scheduling_ignored_during_execution = Some(terms);
        }
        SpreadMode::Preferred => {
            let mut terms = vec![WeightedPodAffinityTerm {
                weight: 100,
                pod_affinity_term: term,
            }];
            terms.extend(
                anti.preferred_during_scheduling_ignored_during_execution
                    .take()
                    .unwrap_or_default(),
            );
            anti.preferred_during_scheduling_ignored_during_execution = Some(terms);
        }
        SpreadMode::Disabled => {}
    }
    affinity.pod_anti_affinity = Some(anti);
    Some(affinity)
}

/// The resolved scheduling of the pod at (`shard_index`, `node_index`): pass-through
/// tolerations, node selector and priority class; affinity with the shard anti-affinity;
/// rendered spread constraints followed by the pass-through ones.
pub fn node_scheduling(
    scheduling: &SchedulingSpec,
    cluster: &str,
    shard_index: i32,
    node_index: i32,
) -> NodeScheduling {
    let mut tsc = spread_constraints(scheduling, cluster, shard_index, node_index);
    tsc.extend(
        scheduling
            .topology_spread_constraints
            .iter()
            .flatten()
            .cloned(),
    );
    NodeScheduling {
        tolerations: scheduling.tolerations.clone(),
        node_selector: scheduling.node_selector.clone(),
        affinity: affinity(scheduling, cluster, shard_index),
        priority_class_name: scheduling.priority_class_name.clone(),
        topology_spread_constraints: (!tsc.is_empty()).then_some(tsc),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn match_labels(
        selector: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    ) -> &std::collections::BTreeMap<String, String> {
        selector.unwrap().match_labels.as_ref().unwrap()
    }

    fn sched(json: serde_json::Value) -> SchedulingSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn disabled_renders_nothing() {
        let s = sched(serde_json::json!({}));
        assert_eq!(node_scheduling(&s, "c", 0, 0), NodeScheduling::default());
        // Pass-through only: verbatim.
        let s = sched(serde_json::json!({
            "tolerations": [{"key": "k", "operator": "Exists"}],
            "topologySpreadConstraints": [{"maxSkew": 2, "topologyKey": "rack",
                "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"a": "b"}}}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "x", "operator": "Exists"}]}]}}}
        }));
        let n = node_scheduling(&s, "c", 1, 0);
        assert_eq!(n.topology_spread_constraints, s.topology_spread_constraints);
        assert_eq!(n.affinity, s.affinity);
        assert_eq!(n.tolerations, s.tolerations);
    }

    #[test]
    fn node_shard_required_and_preferred() {
        let s = sched(serde_json::json!({"node": {"spread": {"shard": {"mode": "Required"}}}}));
        let a = affinity(&s, "c", 2).unwrap();
        let req = a
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(req.len(), 1);
        assert_eq!(req[0].topology_key, "kubernetes.io/hostname");
        let ml = match_labels(req[0].label_selector.as_ref());
        assert_eq!(ml["valkey.io/cluster"], "c");
        assert_eq!(ml["valkey.io/shard-index"], "2");
        assert!(!ml.contains_key("valkey.io/node-index"));
        let s = sched(serde_json::json!({"node": {"spread": {"shard": {"mode": "Preferred"}}}}));
        let pref = affinity(&s, "c", 2)
            .unwrap()
            .pod_anti_affinity
            .unwrap()
            .preferred_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(pref[0].weight, 100);
    }

    #[test]
    fn user_affinity_is_merged_not_replaced() {
        let s = sched(serde_json::json!({
            "node": {"spread": {"shard": {"mode": "Required"}}},
            "affinity": {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app.kubernetes.io/name": "valkey"}},
                     "topologyKey": "kubernetes.io/hostname"}]},
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [{"key": "x", "operator": "Exists"}]}]}}
            }
        }));
        let a = affinity(&s, "c", 0).unwrap();
        assert!(a.node_affinity.is_some());
        let req = a
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(req.len(), 2);
        assert!(
            req[1]
                .label_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["app.kubernetes.io/name"]
                == "valkey"
        );
    }

    #[test]
    fn primaries_only_on_node_index_zero() {
        let s = sched(serde_json::json!({
            "node": {"spread": {"primaries": {"mode": "Required"}, "pods": {"mode": "Preferred"}}},
            "zone": {"spread": {"primaries": {"mode": "Preferred"}}}
        }));
        let p = spread_constraints(&s, "c", 1, 0);
        let r = spread_constraints(&s, "c", 1, 1);
        assert_eq!(p.len(), 3);
        assert_eq!(r.len(), 1);
        assert_eq!(p[0].when_unsatisfiable, "DoNotSchedule");
        assert_eq!(p[0].topology_key, "kubernetes.io/hostname");
        let ml = match_labels(p[0].label_selector.as_ref());
        assert_eq!(ml["valkey.io/node-index"], "0");
        assert_eq!(r[0].when_unsatisfiable, "ScheduleAnyway");
        assert_eq!(
            r[0].label_selector.as_ref().unwrap().match_labels,
            Some(names::cluster_selector("c"))
        );
        assert_eq!(p[2].topology_key, "topology.kubernetes.io/zone");
    }

    #[test]
    fn all_dimensions_snapshot() {
        let s = sched(serde_json::json!({
            "node": {"spread": {"shard": {"mode": "Preferred"}, "primaries": {"mode": "Required"},
                                "pods": {"mode": "Preferred"}}},
            "zone": {"spread": {"shard": {"mode": "Required"}, "pods": {"mode": "Preferred"}}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "rack",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"valkey.io/cluster": "c"}}}]
        }));
        insta::assert_yaml_snapshot!(node_scheduling(&s, "c", 1, 0));
    }
}
