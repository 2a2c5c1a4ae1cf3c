//! Applying the built objects: server-side apply of each child, skipped when the observed
//! object already carries every field the operator renders (so an idle cluster makes no
//! writes), with the contract's events; a child that is no longer desired (the
//! PodDisruptionBudget of `mode: Disabled`) is deleted. Surplus ValkeyNodes are not deleted
//! here: removing a node is a planned step (see [`super::plan`]).

use std::fmt::Debug;

use crate::bounded::map_in_order;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use valkey_api::ValkeyNode;
use valkey_api::labels::CLUSTER_FIELD_MANAGER;
use valkey_api::status::event;

use super::build::Desired;
use super::observe::Observed;
use crate::status::{Child, ChildFailure, EventSpec};

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

/// What the status and the event say of a failed write: the API server's own message, and for
/// a refusal by RBAC (403) what to change.
pub fn failure_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{}: the operator's ServiceAccount lacks this permission; grant it in the operator's \
             ClusterRole (deploy/operator.yaml or the Helm chart)",
            s.message
        ),
        kube::Error::Api(s) => format!("{} ({} {})", s.message, s.code, s.reason),
        e => e.to_string(),
    }
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

fn body<K>(desired: &K) -> Result<Value, kube::Error>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut body = serde_json::to_value(desired).map_err(kube::Error::SerdeError)?;
    if let Some(obj) = body.as_object_mut() {
        obj.insert("apiVersion".into(), K::api_version(&()).into());
        obj.insert("kind".into(), K::kind(&()).into());
        obj.remove("status");
    }
    Ok(body)
}

/// Applies `desired` (server-side, forced, with the cluster controller's field manager).
pub async fn apply_now<K>(api: &Api<K>, desired: &K) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let pp = PatchParams::apply(CLUSTER_FIELD_MANAGER).force();
    api.patch(&desired.name_any(), &pp, &Patch::Apply(&body(desired)?))
        .await?;
    Ok(())
}

/// Applies `desired` (see [`apply_now`]) unless `observed` already matches it.
pub async fn apply<K>(
    api: &Api<K>,
    desired: &K,
    observed: Option<&K>,
    exact: &[&str],
) -> Result<Applied, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    if let Some(o) = observed {
        let ov = serde_json::to_value(o).map_err(kube::Error::SerdeError)?;
        let mut dv = body(desired)?;
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
    apply_now(api, desired).await?;
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

/// The contract's events of a child: created, updated, and the Warning when applying fails.
struct Events {
    created: Option<&'static str>,
    updated: Option<&'static str>,
    failed: Option<&'static str>,
}

impl Child {
    fn events(self) -> Events {
        let (created, updated, failed) = match self {
            Child::SystemUsers => (
                Some(event::INTERNAL_SECRETS_CREATED),
                Some(event::INTERNAL_SECRETS_UPDATED),
                None,
            ),
            Child::Service => (
                Some(event::SERVICE_CREATED),
                Some(event::SERVICE_UPDATED),
                Some(event::SERVICE_UPDATE_FAILED),
            ),
            Child::ConfigMap => (
                Some(event::CONFIG_MAP_CREATED),
                Some(event::CONFIG_MAP_UPDATED),
                Some(event::CONFIG_MAP_UPDATE_FAILED),
            ),
            Child::PodDisruptionBudget => {
                (Some(event::PDB_CREATED), Some(event::PDB_UPDATED), None)
            }
            Child::NetworkPolicy => (
                Some(event::NETWORK_POLICY_CREATED),
                Some(event::NETWORK_POLICY_UPDATED),
                None,
            ),
            // ValkeyNodes are counted and reported once per pass (see `ApplyReport`); the
            // config check reports its verdict in the status.
            Child::UsersAcl | Child::ValkeyNode | Child::ConfigCheck => (None, None, None),
        };
        Events {
            created,
            updated,
            failed,
        }
    }

    /// Top-level keys compared exactly (a removed entry matters there).
    fn exact(self) -> &'static [&'static str] {
        match self {
            Child::SystemUsers | Child::UsersAcl | Child::ConfigMap => &["data"],
            Child::ValkeyNode | Child::NetworkPolicy => &["spec"],
            Child::Service | Child::PodDisruptionBudget | Child::ConfigCheck => &[],
        }
    }
}

/// Applies the optional child `desired`, or deletes the `observed` one no longer desired.
async fn apply_or_delete<K>(
    api: &Api<K>,
    child: Child,
    desired: Option<&K>,
    observed: Option<&K>,
    report: &mut ApplyReport,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    match (desired, observed) {
        (Some(want), seen) => {
            let r = apply(api, want, seen, child.exact()).await;
            report.record(child, &want.name_any(), r);
        }
        (None, Some(orphan)) => {
            let name = orphan.name_any();
            let r = delete(api, &name).await;
            report.deleted(child, &name, r);
        }
        (None, None) => {}
    }
}

/// Applies the desired PodDisruptionBudgets, then, only once every one of them is in place,
/// deletes those of `owned` that [`retired_pdbs`] allows.
async fn apply_pdbs(
    client: &Client,
    ns: &str,
    desired: &[PodDisruptionBudget],
    owned: &[PodDisruptionBudget],
    pods: &[Pod],
    report: &mut ApplyReport,
) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let child = Child::PodDisruptionBudget;
    let mut all_applied = true;
    for want in desired {
        let name = want.name_any();
        let seen = owned.iter().find(|p| p.name_any() == name);
        let r = apply(&api, want, seen, child.exact()).await;
        all_applied &= r.is_ok();
        report.record(child, &name, r);
    }
    if !all_applied {
        return;
    }
    for name in retired_pdbs(desired, owned, pods) {
        let r = delete(&api, &name).await;
        report.deleted(child, &name, r);
    }
}

/// The budgets of `owned` to delete: those not `desired` whose pods a desired budget covers
/// (switching between one budget for the cluster and one per shard never leaves a pod
/// unprotected, and a removed shard keeps its budget until its pods are gone), or all of
/// them when none is desired (mode Disabled).
pub fn retired_pdbs(
    desired: &[PodDisruptionBudget],
    owned: &[PodDisruptionBudget],
    pods: &[Pod],
) -> Vec<String> {
    let selects = |pdb: &PodDisruptionBudget, pod: &Pod| {
        let labels = pod.labels();
        pdb.spec
            .as_ref()
            .and_then(|s| s.selector.as_ref()?.match_labels.as_ref())
            .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
    };
    owned
        .iter()
        .filter(|o| desired.iter().all(|d| d.name_any() != o.name_any()))
        .filter(|o| {
            desired.is_empty()
                || pods
                    .iter()
                    .filter(|p| selects(o, p))
                    .all(|p| desired.iter().any(|d| selects(d, p)))
        })
        .map(|o| o.name_any())
        .collect()
}

/// What applying the children of a pass did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Events to publish.
    pub events: Vec<EventSpec>,
    /// The first child that failed.
    pub failure: Option<ChildFailure>,
    /// ValkeyNodes created.
    pub created_nodes: usize,
    /// ValkeyNodes updated.
    pub updated_nodes: usize,
}

impl ApplyReport {
    fn record(&mut self, child: Child, name: &str, r: Result<Applied, kube::Error>) {
        let ev = child.events();
        match r {
            Ok(Applied::Created) if child == Child::ValkeyNode => self.created_nodes += 1,
            Ok(Applied::Updated) if child == Child::ValkeyNode => self.updated_nodes += 1,
            Ok(Applied::Created) => self.events.extend(
                ev.created
                    .map(|r| EventSpec::normal(r, "Apply", format!("created {name}"))),
            ),
            Ok(Applied::Updated) => self.events.extend(
                ev.updated
                    .map(|r| EventSpec::normal(r, "Apply", format!("updated {name}"))),
            ),
            Ok(Applied::Unchanged) => {}
            Err(e) => {
                let message = failure_message(&e);
                self.events.extend(
                    ev.failed
                        .map(|r| EventSpec::warning(r, "Apply", message.clone())),
                );
                self.failure
                    .get_or_insert_with(|| ChildFailure::new(child, message));
            }
        }
    }

    fn deleted(&mut self, child: Child, name: &str, r: Result<bool, kube::Error>) {
        match r {
            Ok(true) if child == Child::PodDisruptionBudget => self.events.push(EventSpec::normal(
                event::PDB_DELETED,
                "Delete",
                format!("deleted {name} (no longer wanted by podDisruptionBudget.mode)"),
            )),
            Ok(true) if child == Child::NetworkPolicy => self.events.push(EventSpec::normal(
                event::NETWORK_POLICY_DELETED,
                "Delete",
                format!("deleted {name} (networking.networkPolicy.enabled is off)"),
            )),
            Ok(_) => {}
            Err(e) => {
                self.failure
                    .get_or_insert_with(|| ChildFailure::new(child, failure_message(&e)));
            }
        }
    }

    /// The nodes' events: one for all created, one for all updated.
    fn node_events(&mut self) {
        if self.created_nodes > 0 {
            self.events.push(EventSpec::normal(
                event::VALKEY_NODE_CREATED,
                "Apply",
                format!("created {} ValkeyNodes", self.created_nodes),
            ));
        }
        if self.updated_nodes > 0 {
            self.events.push(EventSpec::normal(
                event::VALKEY_NODE_UPDATED,
                "Apply",
                format!("updated {} ValkeyNodes", self.updated_nodes),
            ));
        }
    }
}

/// Applies every child of `desired` in the namespace `ns` (in order: Secrets, Service,
/// ConfigMap, PodDisruptionBudgets, NetworkPolicy, config-check pods, ValkeyNodes), and deletes
/// the PodDisruptionBudgets and the NetworkPolicy no longer desired. Failures are reported, not returned: the pass goes on.
pub async fn apply_all(
    client: &Client,
    ns: &str,
    desired: &Desired,
    observed: &Observed,
) -> ApplyReport {
    let mut report = ApplyReport::default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut secret_children = vec![
        (
            Child::SystemUsers,
            &desired.system_secret,
            &observed.system_secret,
        ),
        (
            Child::SystemUsers,
            &desired.system_backup_secret,
            &observed.system_backup_secret,
        ),
    ];
    secret_children.push((Child::UsersAcl, &desired.acl.1, &observed.acl_secret));
    if let Some(e) = &desired.acl_problem {
        report.failure = Some(e.failure());
    }
    for (child, obj, seen) in secret_children {
        let r = apply(&secrets, obj, seen.as_ref(), child.exact()).await;
        report.record(child, &obj.name_any(), r);
    }
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let r = apply(
        &services,
        &desired.service,
        observed.service.as_ref(),
        Child::Service.exact(),
    )
    .await;
    report.record(Child::Service, &desired.service.name_any(), r);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let child = Child::ConfigMap;
    let r = apply(
        &config_maps,
        &desired.config_map,
        observed.config_map.as_ref(),
        child.exact(),
    )
    .await;
    report.record(child, &desired.config_map.name_any(), r);
    // The cluster's own budgets only: a user's PodDisruptionBudget that carries the cluster's
    // label is not ours to delete.
    let owner: Vec<&str> = desired
        .service
        .owner_references()
        .iter()
        .map(|o| o.uid.as_str())
        .collect();
    let owned: Vec<PodDisruptionBudget> = observed
        .pdbs
        .iter()
        .filter(|p| {
            p.owner_references()
                .iter()
                .any(|o| owner.contains(&o.uid.as_str()))
        })
        .cloned()
        .collect();
    apply_pdbs(
        client,
        ns,
        &desired.pdbs,
        &owned,
        &observed.pods,
        &mut report,
    )
    .await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let (want, seen) = (
        desired.network_policy.as_ref(),
        observed.network_policy.as_ref(),
    );
    apply_or_delete(&policies, Child::NetworkPolicy, want, seen, &mut report).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    if let Some(pod) = &desired.check_pod {
        let r = apply_now(&pods, pod).await.map(|()| Applied::Created);
        report.record(Child::ConfigCheck, &pod.name_any(), r);
    }
    for name in &desired.finished_checks {
        let r = delete(&pods, name).await;
        report.deleted(Child::ConfigCheck, name, r);
    }
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), ns);
    let nodes = &nodes;
    // Many at once (a bounded number in flight): a large cluster's nodes are created in a few
    // round trips, not one per node.
    let results = map_in_order(&desired.nodes, NODE_WRITES_IN_FLIGHT, |node| async move {
        let name = node.name_any();
        let r = apply(nodes, node, observed.node(&name), Child::ValkeyNode.exact()).await;
        (name, r)
    })
    .await;
    for (name, r) in results {
        report.record(Child::ValkeyNode, &name, r);
    }
    report.node_events();
    report
}

/// How many ValkeyNode writes are in flight at once.
const NODE_WRITES_IN_FLIGHT: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn budgets(v: serde_json::Value) -> Vec<PodDisruptionBudget> {
        let spec: valkey_api::ValkeyClusterSpec = serde_json::from_value(v).expect("spec");
        crate::render::pdb::pod_disruption_budgets("c", "ns", &spec, None)
    }

    fn pods(shards: i32) -> Vec<Pod> {
        (0..shards)
            .flat_map(|s| (0..2).map(move |i| (s, i)))
            .map(|(s, i)| {
                let mut p = Pod::default();
                p.metadata.labels = Some(crate::render::names::node_labels("c", s, i));
                p
            })
            .collect()
    }

    #[test]
    fn budgets_are_retired_only_once_others_cover_their_pods() {
        let cluster = budgets(json!({"shards": 3, "replicas": 1}));
        let shard = |n: i32| {
            budgets(json!({"shards": n, "replicas": 1, "podDisruptionBudget": {"mode": "Shard"}}))
        };
        // Cluster -> Shard and back: the old budgets go once the new ones are applied.
        assert_eq!(retired_pdbs(&shard(3), &cluster, &pods(3)), ["valkey-c"]);
        assert_eq!(
            retired_pdbs(&cluster, &shard(3), &pods(3)),
            ["valkey-c-shard-0", "valkey-c-shard-1", "valkey-c-shard-2"]
        );
        // 3 -> 2 shards: shard 2's budget stays while its pods (draining) exist.
        assert!(retired_pdbs(&shard(2), &shard(3), &pods(3)).is_empty());
        assert_eq!(
            retired_pdbs(&shard(2), &shard(3), &pods(2)),
            ["valkey-c-shard-2"]
        );
        // Disabled: every budget goes.
        assert_eq!(retired_pdbs(&[], &cluster, &pods(3)), ["valkey-c"]);
        // Steady: nothing.
        assert!(retired_pdbs(&shard(3), &shard(3), &pods(3)).is_empty());
    }

    #[test]
    fn a_forbidden_write_says_what_to_grant() {
        let status = |code: u16, reason: &str| {
            let s: kube::core::Status = serde_json::from_value(json!({
                "code": code, "reason": reason,
                "message": "poddisruptionbudgets.policy \"p\" is forbidden: User \"u\" cannot patch resource"
            }))
            .expect("status");
            kube::Error::Api(Box::new(s))
        };
        let m = failure_message(&status(403, "Forbidden"));
        assert!(
            m.starts_with("poddisruptionbudgets.policy \"p\" is forbidden"),
            "{m}"
        );
        assert!(m.contains("grant it in the operator's ClusterRole"), "{m}");
        assert!(!m.contains("Status {"), "{m}");
        let m = failure_message(&status(422, "Invalid"));
        assert!(m.ends_with("(422 Invalid)"), "{m}");
    }

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
