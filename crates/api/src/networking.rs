//! `spec.networking`: TLS and the NetworkPolicy.

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Message: empty TLS secret name.
pub const TLS_SECRET_MESSAGE: &str = "spec.networking.tls.certificate.secretName must name a Secret \
     (lowercase DNS name) holding ca.crt, tls.crt and tls.key";

/// Network settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkingSpec {
    /// Enables TLS for all client, replication and cluster-bus traffic. When set,
    /// `certificate.secretName` is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// A NetworkPolicy `valkey-<cluster>` that admits to the cluster's pods only: the
    /// cluster's own pods (client port 6379 for replication and cluster bus 16379), the
    /// operator (6379), the `clients` (6379) and `monitoring` (exporter port 9121). It only
    /// takes effect where the cluster's network plugin enforces NetworkPolicies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,
}

/// The cluster's NetworkPolicy (ingress only; egress is not restricted).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Renders the NetworkPolicy. Turning it off deletes it.
    #[serde(default)]
    pub enabled: bool,
    /// Who may connect to the client port (6379), as NetworkPolicy peers (`podSelector`,
    /// `namespaceSelector`, `ipBlock`). Empty: no application client can connect, only the
    /// cluster's own pods and the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<Vec<NetworkPolicyPeer>>,
    /// Who may scrape the metrics exporter (port 9121), for example the namespace of your
    /// Prometheus. Empty: nobody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<Vec<NetworkPolicyPeer>>,
    /// Where the operator runs, so that it can reach every pod on 6379. Defaults to pods
    /// labelled `app.kubernetes.io/name: valkey-operator` in any namespace (the labels of
    /// the operator's manifest and chart); narrow it with a `namespaceSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<NetworkPolicyPeer>,
}

/// TLS settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// The certificate every Valkey node serves and uses for cluster-bus and replication links.
    pub certificate: TlsCertificate,
}

/// Reference to the TLS certificate Secret.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsCertificate {
    /// Name of a Secret in the cluster's namespace with keys `ca.crt` (certificate authority),
    /// `tls.crt` (server certificate or chain) and `tls.key` (private key), as cert-manager
    /// writes them. The certificate must carry the DNS name
    /// `*.valkey-<cluster>.<namespace>.svc` (add `*.valkey-<cluster>.<namespace>.svc.cluster.local`
    /// for clients using the full name) and be valid for both server and client auth. An
    /// updated Secret is reloaded by every pod without a restart (`status.tls`).
    #[schemars(length(max = 253))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message(TLS_SECRET_MESSAGE))]
    pub secret_name: String,
}
