//! Strategic merge of `spec.containers` onto the rendered containers.
//!
//! There is no strategic-merge-patch crate for Rust, so this implements the subset Kubernetes
//! applies to `Container` over `serde_json::Value`: a patch entry whose name matches a rendered
//! container (`server`, `metrics-exporter`) is merged into it, any other entry is appended as
//! a sidecar. Inside a container, objects merge recursively (so `resources.limits` merges per
//! resource), lists with a Kubernetes merge key merge element-wise by that key (see
//! [`MERGE_KEYS`]), other lists (`command`, `args`, `envFrom`, ...) and scalars are replaced.
//! One-of fields are kept consistent: a probe handler (`exec`, `httpGet`, `tcpSocket`, `grpc`)
//! or an env var source (`value`, `valueFrom`) from the patch replaces the rendered one.

use k8s_openapi::api::core::v1::Container;
use serde_json::{Map, Value};
use valkey_api::defaults::EXPORTER_CONTAINER;

/// Lists inside a container merged by key (field path → merge key), as in the Kubernetes API's
/// `patchMergeKey` annotations.
pub const MERGE_KEYS: &[(&str, &str)] = &[
    ("env", "name"),
    ("ports", "containerPort"),
    ("volumeMounts", "mountPath"),
    ("volumeDevices", "devicePath"),
    ("resizePolicy", "resourceName"),
    ("resources.claims", "name"),
];

const PROBES: &[&str] = &["livenessProbe", "readinessProbe", "startupProbe"];
const PROBE_HANDLERS: &[&str] = &["exec", "httpGet", "tcpSocket", "grpc"];
const ENV_SOURCES: &[&str] = &["value", "valueFrom"];

/// Errors of the merge (a patched container no longer is a valid `Container`).
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// The merged container does not deserialize.
    #[error("merging spec.containers entry {name:?}: {source}")]
    Invalid {
        /// Container name.
        name: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
}

/// Merges `patches` onto `rendered`. Entries naming a rendered container are merged into it;
/// an entry named `metrics-exporter` while the exporter is disabled is dropped (it would be an
/// incomplete container); any other entry is appended as a sidecar, in patch order.
pub fn merge_containers(
    mut rendered: Vec<Container>,
    patches: &[Container],
) -> Result<Vec<Container>, MergeError> {
    for patch in patches {
        if let Some(base) = rendered.iter_mut().find(|c| c.name == patch.name) {
            *base = merge_container(base, patch)?;
        } else if patch.name == EXPORTER_CONTAINER {
            tracing::debug!("dropping metrics-exporter patch: the exporter is disabled");
        } else {
            rendered.push(patch.clone());
        }
    }
    Ok(rendered)
}

/// Strategic merge of one container `patch` onto `base`.
pub fn merge_container(base: &Container, patch: &Container) -> Result<Container, MergeError> {
    let invalid = |source| MergeError::Invalid {
        name: patch.name.clone(),
        source,
    };
    let mut b = serde_json::to_value(base).map_err(invalid)?;
    let p = serde_json::to_value(patch).map_err(invalid)?;
    merge_value(&mut b, &p, "");
    serde_json::from_value(b).map_err(invalid)
}

fn merge_key(path: &str) -> Option<&'static str> {
    MERGE_KEYS.iter().find(|(p, _)| *p == path).map(|(_, k)| *k)
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Merges `patch` into `base` at `path` (dot-separated field path inside the container).
fn merge_value(base: &mut Value, patch: &Value, path: &str) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => merge_object(b, p, path),
        (Value::Array(b), Value::Array(p)) => match merge_key(path) {
            Some(key) => merge_list(b, p, key, path),
            None => *b = p.clone(),
        },
        (b, p) => *b = p.clone(),
    }
}

fn merge_object(base: &mut Map<String, Value>, patch: &Map<String, Value>, path: &str) {
    // One-of groups: a member set by the patch evicts the other members from the base.
    let one_of: &[&str] = if PROBES.contains(&path) {
        PROBE_HANDLERS
    } else if path == "env" {
        ENV_SOURCES
    } else {
        &[]
    };
    if one_of.iter().any(|k| patch.contains_key(*k)) {
        for k in one_of {
            if !patch.contains_key(*k) {
                base.remove(*k);
            }
        }
    }
    for (k, pv) in patch {
        if pv.is_null() {
            base.remove(k);
            continue;
        }
        let cp = child_path(path, k);
        match base.get_mut(k) {
            Some(bv) => merge_value(bv, pv, &cp),
            None => {
                base.insert(k.clone(), pv.clone());
            }
        }
    }
}

fn merge_list(base: &mut Vec<Value>, patch: &[Value], key: &str, path: &str) {
    for pv in patch {
        let existing = pv
            .get(key)
            .and_then(|kv| base.iter_mut().find(|bv| bv.get(key) == Some(kv)));
        match existing {
            // Elements of keyed lists merge at the list's own path (for one-of handling).
            Some(bv) => merge_value(bv, pv, path),
            None => base.push(pv.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(json: serde_json::Value) -> Container {
        serde_json::from_value(json).unwrap()
    }

    fn server() -> Container {
        c(serde_json::json!({
            "name": "server", "image": "valkey/valkey:9.0.0",
            "args": ["valkey-server", "/etc/valkey/config/valkey.conf"],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "A", "value": "1"}],
            "ports": [{"name": "valkey", "containerPort": 6379}, {"name": "cluster-bus", "containerPort": 16379}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/etc/valkey/config", "readOnly": true}],
            "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
            "readinessProbe": {"exec": {"command": ["sh", "r.sh"]}, "periodSeconds": 5}
        }))
    }

    fn exporter() -> Container {
        c(
            serde_json::json!({"name": "metrics-exporter", "image": "oliver006/redis_exporter:v1.80.0"}),
        )
    }

    #[test]
    fn env_merged_by_name_and_value_replaces_value_from() {
        let out = merge_container(
            &server(),
            &c(serde_json::json!({"name": "server", "env": [
                {"name": "MY_VAR", "value": "example"},
                {"name": "POD_IP", "value": "1.2.3.4"},
                {"name": "A", "value": "2"}]})),
        )
        .unwrap();
        let env = out.env.unwrap();
        let names: Vec<_> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["POD_IP", "A", "MY_VAR"]);
        assert_eq!(env[0].value.as_deref(), Some("1.2.3.4"));
        assert!(env[0].value_from.is_none());
        assert_eq!(env[1].value.as_deref(), Some("2"));
        assert_eq!(out.image.as_deref(), Some("valkey/valkey:9.0.0"));
    }

    #[test]
    fn ports_mounts_and_resources_merge_by_key() {
        let out = merge_container(
            &server(),
            &c(serde_json::json!({"name": "server",
                "ports": [{"containerPort": 6379, "name": "client"}, {"containerPort": 7000}],
                "volumeMounts": [{"name": "other", "mountPath": "/data"}, {"name": "x", "mountPath": "/x"}],
                "resources": {"limits": {"cpu": "2"}}})),
        )
        .unwrap();
        let ports = out.ports.unwrap();
        assert_eq!(ports.len(), 3);
        assert_eq!(ports[0].name.as_deref(), Some("client"));
        let mounts = out.volume_mounts.unwrap();
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[0].name, "other");
        assert_eq!(mounts[1].read_only, Some(true));
        let res = out.resources.unwrap();
        assert_eq!(res.limits.as_ref().unwrap().len(), 2);
        assert_eq!(res.requests.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn args_replaced_and_probe_handler_swapped() {
        let out = merge_container(
            &server(),
            &c(serde_json::json!({"name": "server", "args": ["x"],
                "readinessProbe": {"tcpSocket": {"port": 6379}}})),
        )
        .unwrap();
        assert_eq!(out.args.unwrap(), ["x"]);
        let p = out.readiness_probe.unwrap();
        assert!(p.exec.is_none());
        assert!(p.tcp_socket.is_some());
        assert_eq!(p.period_seconds, Some(5));
        // Only a field of the probe: the handler stays.
        let out = merge_container(
            &server(),
            &c(serde_json::json!({"name": "server", "readinessProbe": {"periodSeconds": 9}})),
        )
        .unwrap();
        let p = out.readiness_probe.unwrap();
        assert!(p.exec.is_some());
        assert_eq!(p.period_seconds, Some(9));
    }

    #[test]
    fn sidecars_appended_and_exporter_merged_or_dropped() {
        let patches = [
            c(
                serde_json::json!({"name": "my-sidecar", "image": "busybox:latest",
                "command": ["sh", "-c", "sleep infinity"]}),
            ),
            c(serde_json::json!({"name": "metrics-exporter", "image": "custom/exporter:1"})),
        ];
        let out = merge_containers(vec![server(), exporter()], &patches).unwrap();
        let names: Vec<_> = out.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["server", "metrics-exporter", "my-sidecar"]);
        assert_eq!(out[1].image.as_deref(), Some("custom/exporter:1"));
        let out = merge_containers(vec![server()], &patches).unwrap();
        let names: Vec<_> = out.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["server", "my-sidecar"]);
    }

    #[test]
    fn empty_patch_is_identity() {
        let s = server();
        assert_eq!(
            merge_container(&s, &c(serde_json::json!({"name": "server"}))).unwrap(),
            s
        );
        assert_eq!(merge_containers(vec![s.clone()], &[]).unwrap(), vec![s]);
    }
}
