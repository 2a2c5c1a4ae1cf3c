//! The downward API: values of `fieldRef` and `resourceFieldRef` selectors,
//! as the kubelet resolves them for env vars and downwardAPI volumes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use thiserror::Error;

use super::quantity::{QuantityError, div_ceil, parse_nanos};

/// A selector the downward API does not support (or a bad quantity).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FieldPathError {
    /// The field path is not one the downward API exposes.
    #[error("unsupported fieldPath {0:?}")]
    UnsupportedField(String),
    /// The resource name is not one the downward API exposes.
    #[error("unsupported resource {0:?}")]
    UnsupportedResource(String),
    /// The container named by a resourceFieldRef does not exist.
    #[error("container {0:?} not found")]
    NoContainer(String),
    /// A quantity did not parse.
    #[error(transparent)]
    Quantity(#[from] QuantityError),
}

/// Runtime facts of a pod the downward API needs besides the pod object.
#[derive(Debug, Clone, Default)]
pub struct PodRuntimeInfo {
    /// Pod IPs (first is `status.podIP`).
    pub pod_ips: Vec<String>,
    /// The node's IP.
    pub host_ip: String,
}

/// Formats a map like the kubelet does for downwardAPI volume files:
/// sorted `key="value"` lines, Go-quoted values, no trailing newline.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Quotes a string like Go's `%q`.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Parses `metadata.labels['key']` into `("metadata.labels", "key")`.
fn subscript(path: &str) -> Option<(&str, &str)> {
    let open = path.find("['")?;
    let rest = path.strip_suffix("']")?;
    Some((&path[..open], &rest[open + 2..]))
}

/// Resolves a `fieldRef.fieldPath` for a pod. `for_volume` selects the
/// volume flavour, where whole `metadata.labels`/`metadata.annotations`
/// maps are allowed.
pub fn field_value(
    pod: &Pod,
    info: &PodRuntimeInfo,
    path: &str,
    for_volume: bool,
) -> Result<String, FieldPathError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    if let Some((base, key)) = subscript(path) {
        let map = match base {
            "metadata.labels" => &meta.labels,
            "metadata.annotations" => &meta.annotations,
            _ => return Err(FieldPathError::UnsupportedField(path.to_string())),
        };
        return Ok(map
            .as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default());
    }
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" if for_volume => format_map(&meta.labels.clone().unwrap_or_default()),
        "metadata.annotations" if for_volume => {
            format_map(&meta.annotations.clone().unwrap_or_default())
        }
        "spec.nodeName" if !for_volume => {
            spec.and_then(|s| s.node_name.clone()).unwrap_or_default()
        }
        "spec.serviceAccountName" if !for_volume => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" if !for_volume => info.host_ip.clone(),
        "status.hostIPs" if !for_volume => info.host_ip.clone(),
        "status.podIP" if !for_volume => info.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" if !for_volume => info.pod_ips.join(","),
        _ => return Err(FieldPathError::UnsupportedField(path.to_string())),
    };
    Ok(value)
}

/// Resolves a `resourceFieldRef` (`limits.cpu`, `requests.memory`, ...) of
/// `container` with `divisor` (default `1`). Unset limits fall back to the
/// node's allocatable, as the kubelet does.
pub fn resource_value(
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
    node_allocatable: &BTreeMap<String, String>,
) -> Result<String, FieldPathError> {
    let (kind, name) = resource
        .split_once('.')
        .ok_or_else(|| FieldPathError::UnsupportedResource(resource.to_string()))?;
    if !matches!(name, "cpu" | "memory" | "ephemeral-storage") && !name.starts_with("hugepages-") {
        return Err(FieldPathError::UnsupportedResource(resource.to_string()));
    }
    let resources = container.resources.as_ref();
    let set = match kind {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => return Err(FieldPathError::UnsupportedResource(resource.to_string())),
    };
    let quantity = set.and_then(|m| m.get(name)).map(|q| q.0.clone());
    let quantity = match (quantity, kind) {
        (Some(q), _) => q,
        (None, "limits") => node_allocatable
            .get(name)
            .cloned()
            .unwrap_or_else(|| "0".to_string()),
        (None, _) => "0".to_string(),
    };
    let divisor = divisor.filter(|d| !d.is_empty()).unwrap_or("1");
    let value = parse_nanos(&quantity)?;
    // A zero divisor (what the API server stores when none is given) means 1, as in the kubelet.
    let div = match parse_nanos(divisor)? {
        0 => 1_000_000_000,
        d => d,
    };
    if div < 0 {
        return Err(FieldPathError::Quantity(QuantityError(divisor.to_string())));
    }
    if name == "cpu" {
        // The kubelet divides milli-values and rounds up.
        let milli = div_ceil(value, 1_000_000);
        let div_milli = div_ceil(div, 1_000_000).max(1);
        return Ok(div_ceil(milli, div_milli).to_string());
    }
    Ok(div_ceil(value, div).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u-1".into()),
                labels: Some(
                    [
                        ("app".to_string(), "web".to_string()),
                        ("b".into(), "x\"y\n".into()),
                    ]
                    .into(),
                ),
                annotations: Some([("note".to_string(), "hi".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-1".into()),
                service_account_name: Some("sa".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn env_fields() {
        let info = PodRuntimeInfo {
            pod_ips: vec!["10.0.0.5".into()],
            host_ip: "10.0.0.1".into(),
        };
        let p = pod();
        let f = |path| field_value(&p, &info, path, false);
        assert_eq!(f("metadata.name").unwrap(), "p");
        assert_eq!(f("metadata.namespace").unwrap(), "ns");
        assert_eq!(f("metadata.uid").unwrap(), "u-1");
        assert_eq!(f("metadata.labels['app']").unwrap(), "web");
        assert_eq!(f("metadata.labels['missing']").unwrap(), "");
        assert_eq!(f("metadata.annotations['note']").unwrap(), "hi");
        assert_eq!(f("spec.nodeName").unwrap(), "node-1");
        assert_eq!(f("spec.serviceAccountName").unwrap(), "sa");
        assert_eq!(f("status.podIP").unwrap(), "10.0.0.5");
        assert_eq!(f("status.podIPs").unwrap(), "10.0.0.5");
        assert_eq!(f("status.hostIP").unwrap(), "10.0.0.1");
        assert!(f("metadata.labels").is_err());
        assert!(f("spec.containers").is_err());
    }

    #[test]
    fn volume_maps_are_go_quoted_and_sorted() {
        let info = PodRuntimeInfo::default();
        let v = field_value(&pod(), &info, "metadata.labels", true).unwrap();
        assert_eq!(v, "app=\"web\"\nb=\"x\\\"y\\n\"");
        assert!(field_value(&pod(), &info, "spec.nodeName", true).is_err());
    }

    #[test]
    fn resources_with_divisors() {
        let c = Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                limits: Some(
                    [
                        ("cpu".to_string(), Quantity("1250m".into())),
                        ("memory".to_string(), Quantity("64Mi".into())),
                    ]
                    .into(),
                ),
                requests: Some([("cpu".to_string(), Quantity("250m".into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let alloc: BTreeMap<String, String> = [
            ("memory".to_string(), "8Gi".to_string()),
            ("cpu".into(), "4".into()),
        ]
        .into();
        let r = |res, div| resource_value(&c, res, div, &alloc).unwrap();
        assert_eq!(r("limits.cpu", None), "2");
        assert_eq!(r("limits.cpu", Some("1m")), "1250");
        assert_eq!(r("requests.cpu", Some("1m")), "250");
        assert_eq!(r("requests.cpu", None), "1");
        assert_eq!(r("limits.memory", None), "67108864");
        assert_eq!(r("limits.memory", Some("1Mi")), "64");
        // The API server stores a missing volume-item divisor as "0": it means 1.
        assert_eq!(r("limits.memory", Some("0")), "67108864");
        assert_eq!(r("limits.cpu", Some("0")), "2");
        assert_eq!(r("requests.memory", None), "0");
        let bare = Container {
            name: "b".into(),
            ..Default::default()
        };
        assert_eq!(
            resource_value(&bare, "limits.memory", Some("1Gi"), &alloc).unwrap(),
            "8"
        );
        assert_eq!(
            resource_value(&bare, "limits.cpu", None, &alloc).unwrap(),
            "4"
        );
        assert!(resource_value(&c, "limits.gpu", None, &alloc).is_err());
    }
}
