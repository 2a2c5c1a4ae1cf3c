//! CRD generation.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{ValkeyBackup, ValkeyCluster, ValkeyNode, ValkeyScheduledBackup};

/// Errors of CRD rendering.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CRD could not be converted to JSON.
    #[error("serializing CRD to JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The CRD could not be rendered as YAML.
    #[error("serializing CRD to YAML: {0}")]
    Yaml(#[from] serde_saphyr::ser_error::Error),
}

/// Every CRD: ValkeyCluster first, then ValkeyNode, ValkeyBackup, ValkeyScheduledBackup.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ValkeyCluster::crd(),
        ValkeyNode::crd(),
        ValkeyBackup::crd(),
        ValkeyScheduledBackup::crd(),
    ]
}

/// One CRD as a YAML document.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    let value = serde_json::to_value(crd)?;
    Ok(serde_saphyr::to_string(&value)?)
}

/// Every CRD as multi-document YAML (what `valkey-operator crd` prints).
pub fn crds_yaml() -> Result<String, CrdError> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&crd_yaml(&crd)?);
    }
    Ok(out)
}
