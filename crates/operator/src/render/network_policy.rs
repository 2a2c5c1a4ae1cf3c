//! The NetworkPolicy `valkey-<cluster>` (`networking.networkPolicy`): ingress to the
//! cluster's pods from its own pods (replication and cluster bus), the operator, the
//! configured clients and the monitoring peers; egress is not restricted.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use valkey_api::ValkeyClusterSpec;
use valkey_api::defaults::{CLUSTER_BUS_PORT, EXPORTER_PORT, VALKEY_PORT};
use valkey_api::labels::APP_NAME;

use super::names;

/// The `app.kubernetes.io/name` of the operator's pods in its manifest and chart.
pub const OPERATOR_APP_NAME: &str = "valkey-operator";

/// The cluster's NetworkPolicy, or `None` unless `networking.networkPolicy.enabled` (the
/// caller then deletes an existing one).
pub fn network_policy(
    cluster: &str,
    namespace: &str,
    spec: &ValkeyClusterSpec,
    owner: Option<OwnerReference>,
) -> Option<NetworkPolicy> {
    let np = spec.network_policy()?;
    let selector = || LabelSelector {
        match_labels: Some(names::cluster_selector(cluster)),
        ..Default::default()
    };
    let operator = np.operator.clone().unwrap_or_else(|| NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector::default()),
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                APP_NAME.to_owned(),
                OPERATOR_APP_NAME.to_owned(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    });
    let own = NetworkPolicyPeer {
        pod_selector: Some(selector()),
        ..Default::default()
    };
    let mut ingress = vec![
        rule(vec![own], &[VALKEY_PORT, CLUSTER_BUS_PORT]),
        rule(vec![operator], &[VALKEY_PORT]),
    ];
    if let Some(clients) = np.clients.clone().filter(|c| !c.is_empty()) {
        ingress.push(rule(clients, &[VALKEY_PORT]));
    }
    if let Some(monitoring) = np.monitoring.clone().filter(|m| !m.is_empty()) {
        ingress.push(rule(monitoring, &[EXPORTER_PORT]));
    }
    Some(NetworkPolicy {
        metadata: names::child_meta(
            names::network_policy_name(cluster),
            cluster,
            namespace,
            owner,
        ),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector()),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(ingress),
            ..Default::default()
        }),
    })
}

/// Ingress from `from` to the TCP `ports`.
fn rule(from: Vec<NetworkPolicyPeer>, ports: &[i32]) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(from),
        ports: Some(
            ports
                .iter()
                .map(|p| NetworkPolicyPort {
                    port: Some(IntOrString::Int(*p)),
                    protocol: Some("TCP".to_owned()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(networking: serde_json::Value) -> ValkeyClusterSpec {
        serde_json::from_value(serde_json::json!({"shards": 3, "networking": networking})).unwrap()
    }

    #[test]
    fn network_policy_snapshot_with_clients_and_monitoring() {
        let s = spec(serde_json::json!({"networkPolicy": {
            "enabled": true,
            "clients": [{"podSelector": {"matchLabels": {"app": "shop"}}}],
            "monitoring": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "monitoring"}}}],
        }}));
        insta::assert_yaml_snapshot!(network_policy("c", "ns", &s, None));
    }

    #[test]
    fn only_own_pods_and_the_operator_without_peers_and_nothing_when_off() {
        let s = spec(serde_json::json!({"networkPolicy": {
            "enabled": true,
            "operator": {"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "valkey-system"}}},
        }}));
        let np = network_policy("c", "ns", &s, None).unwrap();
        let ingress = np.spec.unwrap().ingress.unwrap();
        assert_eq!(ingress.len(), 2);
        let operator = &ingress[1].from.as_ref().unwrap()[0];
        assert!(operator.pod_selector.is_none(), "the given peer, as given");
        for off in [
            serde_json::json!({"networkPolicy": {"enabled": false, "clients": []}}),
            serde_json::json!({}),
        ] {
            assert!(network_policy("c", "ns", &spec(off), None).is_none());
        }
    }
}
