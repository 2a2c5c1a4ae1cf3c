//! `spec.networking`: TLS.

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
