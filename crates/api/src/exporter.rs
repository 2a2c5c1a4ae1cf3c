//! `spec.exporter`: the Prometheus metrics exporter sidecar.

use k8s_openapi::api::core::v1::{ResourceRequirements, SecurityContext};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;

/// Metrics exporter sidecar settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExporterSpec {
    /// Run a `metrics-exporter` sidecar (oliver006/redis_exporter) in every Valkey pod, exposing
    /// Prometheus metrics on port 9121. Defaults to true, also when only `image`, `args` or
    /// `resources` are given; set to false to run no exporter.
    #[serde(default = "enabled_default")]
    pub enabled: bool,

    /// Exporter container image. Defaults to `oliver006/redis_exporter:v1.80.0`.
    #[serde(default = "image_default")]
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// Extra command-line flags for the exporter, for example `-ping-on-connect`. Flags take
    /// precedence over the environment variables the operator sets, so they can override them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,

    /// Compute resources (requests/limits) of the exporter container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Security context of the exporter container. Omitted: `allowPrivilegeEscalation: false`,
    /// every capability dropped and a read-only root filesystem. When set, it replaces that
    /// default as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

fn enabled_default() -> bool {
    true
}

fn image_default() -> String {
    defaults::EXPORTER_IMAGE.to_owned()
}

impl Default for ExporterSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            image: image_default(),
            args: None,
            resources: None,
            security_context: None,
        }
    }
}
