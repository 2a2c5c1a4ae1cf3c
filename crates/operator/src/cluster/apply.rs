//! Server-side apply of owned objects, skipped when the observed object already carries every
//! field the operator renders (so an idle cluster makes no writes).

use std::fmt::Debug;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use valkey_api::labels::CLUSTER_FIELD_MANAGER;

/// What applying one object did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// The object did not exist and was created.
    Created,
    /// The object differed and was patched.
    Updated,
    /// Nothing to do.
    Unchanged,
}

/// Whether every field present in `desired` has the same value in `observed` (objects compared
/// key by key, lists element by element with equal length, scalars by equality).
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d
            .iter()
            .all(|(k, dv)| dv.is_null() || o.get(k).is_some_and(|ov| is_subset(dv, ov))),
        (Value::Array(d), Value::Array(o)) => {
            d.len() == o.len() && d.iter().zip(o).all(|(dv, ov)| is_subset(dv, ov))
        }
        (d, o) => d == o,
    }
}

/// Whether `desired` must be applied over `observed`: some rendered field differs, or one of the
/// `exact` top-level keys (such as `spec` of a custom resource or `data` of a ConfigMap, where a
/// removed entry matters) is not equal.
pub fn needs_apply(desired: &Value, observed: &Value, exact: &[&str]) -> bool {
    let mut d = desired.clone();
    let mut o = observed.clone();
    // Generated metadata never counts.
    for v in [&mut d, &mut o] {
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "managedFields",
            ] {
                m.remove(k);
            }
        }
    }
    !is_subset(&d, &o) || exact.iter().any(|k| d.get(*k) != o.get(*k))
}

/// Applies `desired` (server-side, forced, with the cluster controller's field manager) unless
/// `observed` already matches it.
pub async fn apply<K>(
    api: &Api<K>,
    desired: &K,
    observed: Option<&K>,
    exact: &[&str],
) -> Result<Applied, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let name = desired.name_any();
    let mut body = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    if let Some(obj) = body.as_object_mut() {
        obj.insert("apiVersion".into(), K::api_version(&()).into());
        obj.insert("kind".into(), K::kind(&()).into());
        obj.remove("status");
    }
    if let Some(o) = observed {
        let ov = serde_json::to_value(o).map_err(kube::Error::SerdeError)?;
        let mut dv = body.clone();
        if let (Some(d), Some(ovo)) = (dv.as_object_mut(), ov.as_object()) {
            // apiVersion/kind are not serialized on typed k8s-openapi objects read back.
            for k in ["apiVersion", "kind"] {
                if !ovo.contains_key(k) {
                    d.remove(k);
                }
            }
        }
        if !needs_apply(&dv, &ov, exact) {
            return Ok(Applied::Unchanged);
        }
    }
    let pp = PatchParams::apply(CLUSTER_FIELD_MANAGER).force();
    api.patch(&name, &pp, &Patch::Apply(&body)).await?;
    Ok(if observed.is_some() {
        Applied::Updated
    } else {
        Applied::Created
    })
}

/// Deletes an object, treating "already gone" as success.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<bool, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_do_not_trigger_apply() {
        let desired = json!({"metadata": {"name": "s", "labels": {"a": "1"}},
            "spec": {"ports": [{"name": "valkey", "port": 6379}]}});
        let observed = json!({"metadata": {"name": "s", "labels": {"a": "1", "b": "2"},
            "resourceVersion": "7", "uid": "u"},
            "spec": {"ports": [{"name": "valkey", "port": 6379, "protocol": "TCP",
                "targetPort": 6379}], "clusterIP": "None"}});
        assert!(!needs_apply(&desired, &observed, &[]));
    }

    #[test]
    fn changed_or_removed_fields_trigger_apply() {
        let observed = json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}});
        let changed = json!({"metadata": {"name": "c"}, "data": {"a": "9", "b": "2"}});
        let removed = json!({"metadata": {"name": "c"}, "data": {"a": "1"}});
        assert!(needs_apply(&changed, &observed, &[]));
        assert!(!needs_apply(&removed, &observed, &[]));
        assert!(needs_apply(&removed, &observed, &["data"]));
        let list = json!({"spec": {"ports": [{"port": 1}, {"port": 2}]}});
        let shorter = json!({"spec": {"ports": [{"port": 1}]}});
        assert!(needs_apply(&shorter, &list, &[]));
    }
}
