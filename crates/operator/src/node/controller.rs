//! The ValkeyNode reconcile loop (kube-runtime `Controller`).
//!
//! Per ValkeyNode: keep the PVC-cleanup finalizer when `reclaimPolicy: Delete`; create the claim
//! and grow it when the requested size grows (never shrinks); write the workload only when it
//! is missing, drifted, or its pod template changed and the roll is authorized (see
//! [`super::workload_plan::workload_action`]); find the pod; patch the status only when it changed.
//! Writes use server-side apply with the field manager [`NODE_FIELD_MANAGER`], so an idle node
//! causes no API writes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, info, instrument, warn};
use valkey_api::labels::{self, NODE_FIELD_MANAGER};
use valkey_api::persistence::ReclaimPolicy;
use valkey_api::status::event::{RESIZE_INFEASIBLE, WORKLOAD_ROLL_APPLIED, WORKLOAD_ROLL_DEFERRED};
use valkey_api::status::node_condition::WORKLOAD_ROLL_PENDING;
use valkey_api::{ValkeyNode, ValkeyNodeStatus};

use super::create_failure;
use super::status::{ObservedNode, compute_status};
use super::status_writes;
use super::workload_plan::{ObservedWorkload, WorkloadAction, pvc_request, workload_action};
use crate::context::Shared;
use crate::metrics::{FailureReason, Metrics};
use crate::render::containers::MergeError;
use crate::render::names;
use crate::render::workload::{Workload, pvc, workload};
use crate::scope::Scope;
use crate::status::EventSpec;

/// Finalizer that deletes the node's claim when `persistence.reclaimPolicy` is Delete.
pub const FINALIZER: &str = "valkey.io/pvc-cleanup";

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The pod template could not be rendered.
    #[error(transparent)]
    Render(#[from] MergeError),
    /// The ValkeyNode has no namespace.
    #[error("ValkeyNode has no namespace")]
    NoNamespace,
    /// Serialization of a patch failed.
    #[error("serializing a patch: {0}")]
    Serialize(#[from] serde_json::Error),
}

type Ctx = Shared;

/// Name of this controller in metrics.
pub const NODE_CONTROLLER: &str = "valkeynode";

async fn publish(ctx: &Ctx, node: &ValkeyNode, reason: &'static str, note: String) {
    ctx.publish(
        &node.object_ref(&()),
        &[EventSpec::normal(reason, "Reconcile", note)],
    )
    .await;
}

fn managed_selector() -> String {
    format!(
        "{}={},{}={}",
        labels::APP_MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::APP_COMPONENT,
        labels::COMPONENT_NODE
    )
}

/// Maps a pod or claim to its ValkeyNode through the position labels.
fn node_ref_from_labels<K: Resource>(obj: &K) -> Option<ObjectRef<ValkeyNode>> {
    let l = obj.meta().labels.as_ref()?;
    let cluster = l.get(labels::CLUSTER)?;
    let shard: i32 = l.get(labels::SHARD_INDEX)?.parse().ok()?;
    let node: i32 = l.get(labels::NODE_INDEX)?.parse().ok()?;
    let ns = obj.meta().namespace.as_deref()?;
    Some(ObjectRef::new(&names::valkey_node_name(cluster, shard, node)).within(ns))
}

/// Runs the ValkeyNode controller over `scope` until `shutdown` resolves (then finishes
/// the reconciles in flight). Owns StatefulSets and Deployments (owner references); watches
/// pods and claims by their position labels.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    scope: Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> anyhow::Result<()> {
    metrics.declare_failures_of::<NodeError>(NODE_CONTROLLER);
    let nodes: Api<ValkeyNode> = scope.api(&client);
    let owned = watcher::Config::default().labels(&managed_selector());
    Controller::new(nodes, watcher::Config::default())
        .owns(scope.api::<StatefulSet>(&client), owned.clone())
        .owns(scope.api::<Deployment>(&client), owned.clone())
        .watches(scope.api::<Pod>(&client), owned.clone(), |p| {
            node_ref_from_labels(&p)
        })
        .watches(scope.api::<PersistentVolumeClaim>(&client), owned, |p| {
            node_ref_from_labels(&p)
        })
        .graceful_shutdown_on(shutdown)
        .run(
            reconcile_node,
            node_error_policy,
            Arc::new(Shared::new(client, metrics)),
        )
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(node = %obj.name, "reconciled ValkeyNode"),
                Err(e) => debug!(error = %e, "ValkeyNode reconcile failed"),
            }
        })
        .await;
    info!("ValkeyNode controller stopped");
    Ok(())
}

impl FailureReason for NodeError {
    const REASONS: &'static [&'static str] = &["api", "render", "no_namespace", "serialize"];

    fn reason(&self) -> &'static str {
        match self {
            NodeError::Kube(_) => "api",
            NodeError::Render(_) => "render",
            NodeError::NoNamespace => "no_namespace",
            NodeError::Serialize(_) => "serialize",
        }
    }
}

fn node_error_policy(node: Arc<ValkeyNode>, err: &NodeError, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.failed_with(NODE_CONTROLLER, err);
    let cluster = format!(
        "{}/{}",
        node.namespace().unwrap_or_default(),
        node.spec.cluster_name
    );
    let _span = tracing::info_span!("retry", cluster = %cluster).entered();
    warn!(node = %node.name_any(), error = %err, "ValkeyNode reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

fn deletes_pvc(node: &ValkeyNode) -> bool {
    node.spec
        .persistence
        .as_ref()
        .is_some_and(|p| p.reclaim_policy == ReclaimPolicy::Delete)
}

async fn set_finalizers(
    api: &Api<ValkeyNode>,
    node: &ValkeyNode,
    add: bool,
) -> Result<(), NodeError> {
    let mut list: Vec<String> = node.finalizers().to_vec();
    list.retain(|f| f != FINALIZER);
    if add {
        list.push(FINALIZER.to_owned());
    }
    // The resourceVersion makes this a compare-and-swap with other finalizer writers.
    let patch = serde_json::json!({"metadata": {
        "finalizers": list, "resourceVersion": node.resource_version()}});
    api.patch(
        &node.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Outcome of a finalizer patch. A 404 means the node is already gone (its last finalizer was
/// removed by an earlier pass working from a stale cache): nothing is left to do. A 409 means
/// another writer (the garbage collector adding `foregroundDeletion`, the API server setting
/// the deletion timestamp) changed the node first: the watch event of that write brings the
/// current version, and a short requeue covers a missed one. Neither is a failure.
fn finalizer_patched(node: &str, res: Result<(), NodeError>) -> Result<Action, NodeError> {
    match res {
        Ok(()) => Ok(Action::await_change()),
        Err(NodeError::Kube(kube::Error::Api(e))) if e.code == 404 => {
            debug!(node, "ValkeyNode already gone");
            Ok(Action::await_change())
        }
        Err(NodeError::Kube(kube::Error::Api(e))) if e.code == 409 => {
            debug!(
                node,
                "ValkeyNode changed while patching finalizers; retrying"
            );
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Err(e) => Err(e),
    }
}

async fn reconcile_node(node: Arc<ValkeyNode>, ctx: Arc<Ctx>) -> Result<Action, NodeError> {
    let metrics = ctx.metrics.clone();
    metrics
        .reconcile(NODE_CONTROLLER, node_pass(node, ctx))
        .await
}

/// A workload kind the node controller writes (StatefulSet or Deployment, one replica).
trait WorkloadKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
{
    /// `spec.replicas`.
    fn replicas(&self) -> Option<i32>;
}

impl WorkloadKind for StatefulSet {
    fn replicas(&self) -> Option<i32> {
        self.spec.replicas
    }
}

impl WorkloadKind for Deployment {
    fn replicas(&self) -> Option<i32> {
        self.spec.replicas
    }
}

/// The observed workload of kind `K` after this pass: read, then written when
/// [`workload_action`] says so. Also whether its pod template changed and whether the change
/// is deferred.
async fn reconcile_workload<K: WorkloadKind>(
    client: &Client,
    ns: &str,
    name: &str,
    desired: &K,
    desired_hash: &str,
    desired_rev: Option<&str>,
) -> Result<(Option<K>, bool, bool), NodeError> {
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let cur = api.get_opt(name).await?;
    let o = cur
        .as_ref()
        .map(|c| ObservedWorkload::from_meta(c.meta(), c.replicas()));
    let template_changed = o
        .as_ref()
        .is_some_and(|o| o.template_hash.as_deref() != Some(desired_hash));
    match workload_action(o.as_ref(), desired_hash, desired_rev) {
        WorkloadAction::Apply => {
            info!(workload = %name, kind = K::kind(&()).as_ref(), "applying workload");
            let apply = PatchParams::apply(NODE_FIELD_MANAGER).force();
            let written = api.patch(name, &apply, &Patch::Apply(desired)).await?;
            Ok((Some(written), template_changed, false))
        }
        WorkloadAction::Defer => Ok((cur, template_changed, true)),
        WorkloadAction::Keep => Ok((cur, template_changed, false)),
    }
}

/// finalizers → claim → workload → pod → report.
#[instrument(skip_all, fields(cluster = %format!("{}/{}", node.namespace().unwrap_or_default(), node.spec.cluster_name), node = %node.name_any()))]
async fn node_pass(node: Arc<ValkeyNode>, ctx: Arc<Ctx>) -> Result<Action, NodeError> {
    let ns = node.namespace().ok_or(NodeError::NoNamespace)?;
    let client = &ctx.client;
    let nodes: Api<ValkeyNode> = Api::namespaced(client.clone(), &ns);
    if let Some(done) = finalizers(client, &nodes, &node).await? {
        return Ok(done);
    }
    let claim = apply_claim(client, &node).await?;
    let workload = apply_workload(client, &node).await?;
    let (pod, create_failure) = observe_pod(client, &node, &workload).await?;
    let observed = ObservedNode {
        create_failure,
        statefulset: workload.statefulset.as_ref(),
        deployment: workload.deployment.as_ref(),
        pod: pod.as_ref(),
        pvc: claim.pvc.as_ref(),
        resize_refused: claim.resize_refused.clone(),
        roll_pending: workload.roll_pending,
        // The revision the workload now carries is the applied one.
        applied_workload_revision: workload.revision(),
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let status = compute_status(&node, &observed, &now);
    report(
        &ctx,
        &nodes,
        &node,
        &workload,
        claim.resize_refused.as_deref(),
    )
    .await?;
    if status_writes::node_fields_changed(node.status.as_ref(), &status) {
        status_writes::apply_node_fields(&nodes, &node.name_any(), &status).await?;
        debug!(node = %node.name_any(), ready = status.ready, "patched ValkeyNode status");
    }
    Ok(if status.ready {
        Action::requeue(Duration::from_secs(300))
    } else if pod.is_none() {
        // The workload controller's refusal shows only in events, which are not watched.
        Action::requeue(Duration::from_secs(5))
    } else {
        Action::requeue(Duration::from_secs(15))
    })
}

/// The finalizer stage: a node being deleted deletes its claim when `reclaimPolicy` is
/// Delete, then drops its finalizer; a node whose policy changed gets or loses the finalizer.
/// `Some` ends the pass.
async fn finalizers(
    client: &Client,
    nodes: &Api<ValkeyNode>,
    node: &ValkeyNode,
) -> Result<Option<Action>, NodeError> {
    let name = node.name_any();
    let has_finalizer = node.finalizers().iter().any(|f| f == FINALIZER);
    if node.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Some(Action::await_change()));
        }
        if deletes_pvc(node) {
            let ns = node.namespace().unwrap_or_default();
            let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
            let pvc_name = names::pvc_name(&name);
            match pvcs.delete(&pvc_name, &DeleteParams::background()).await {
                Ok(_) => {
                    info!(node = %name, pvc = %pvc_name, "deleted PersistentVolumeClaim (reclaimPolicy Delete)")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        let patched = set_finalizers(nodes, node, false).await;
        return finalizer_patched(&name, patched).map(Some);
    }
    if deletes_pvc(node) != has_finalizer {
        // The patch triggers another reconcile with the new metadata.
        let patched = set_finalizers(nodes, node, deletes_pvc(node)).await;
        return finalizer_patched(&name, patched).map(Some);
    }
    Ok(None)
}

/// The claim after the claim stage, and why the API server refused to grow it.
struct Claim {
    pvc: Option<PersistentVolumeClaim>,
    resize_refused: Option<String>,
}

/// The claim stage: the node's claim is created, or grown to the requested size.
async fn apply_claim(client: &Client, node: &ValkeyNode) -> Result<Claim, NodeError> {
    let mut claim = Claim {
        pvc: None,
        resize_refused: None,
    };
    let Some(p) = &node.spec.persistence else {
        return Ok(claim);
    };
    let ns = node.namespace().unwrap_or_default();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pvc_name = names::pvc_name(&node.name_any());
    let current = pvcs.get_opt(&pvc_name).await?;
    let current_request = current
        .as_ref()
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    claim.pvc = current;
    if let Some(size) = pvc_request(current_request.as_deref(), &p.size)
        && let Some(desired) = pvc(node, Some(&size))
    {
        let apply = PatchParams::apply(NODE_FIELD_MANAGER).force();
        match pvcs.patch(&pvc_name, &apply, &Patch::Apply(&desired)).await {
            Ok(written) => {
                info!(node = %node.name_any(), pvc = %pvc_name, size = %size, "applied PersistentVolumeClaim");
                claim.pvc = Some(written);
            }
            // The API server refuses the growth (a StorageClass without
            // allowVolumeExpansion, a static volume): reported, and the rest of the node is
            // still reconciled.
            Err(kube::Error::Api(e))
                if current_request.is_some() && (e.code == 403 || e.code == 422) =>
            {
                claim.resize_refused = Some(e.message);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(claim)
}

/// The workload after the workload stage.
struct AppliedWorkload {
    statefulset: Option<StatefulSet>,
    deployment: Option<Deployment>,
    /// Its name.
    name: String,
    /// The pod template differs from the desired one.
    template_changed: bool,
    /// The change waits for the cluster controller's authorization.
    roll_pending: bool,
}

impl AppliedWorkload {
    /// The workload revision the workload carries.
    fn revision(&self) -> Option<String> {
        self.statefulset
            .as_ref()
            .map(|w| &w.metadata)
            .or(self.deployment.as_ref().map(|w| &w.metadata))
            .and_then(|m| ObservedWorkload::from_meta(m, None).workload_revision)
    }
}

/// The workload stage: the node's StatefulSet or Deployment is applied when
/// [`workload_action`] says so.
async fn apply_workload(client: &Client, node: &ValkeyNode) -> Result<AppliedWorkload, NodeError> {
    let ns = node.namespace().unwrap_or_default();
    let owner = crate::render::owner_reference(node);
    let desired = workload(node, owner)?;
    let hash = desired.template_hash().unwrap_or_default().to_owned();
    let name = names::workload_name(&node.name_any());
    let rev = node.spec.workload_revision.as_deref();
    let mut out = AppliedWorkload {
        statefulset: None,
        deployment: None,
        name,
        template_changed: false,
        roll_pending: false,
    };
    let wl = &out.name;
    (out.template_changed, out.roll_pending) = match desired {
        Workload::StatefulSet(obj) => {
            let (w, changed, pending) =
                reconcile_workload(client, &ns, wl, &*obj, &hash, rev).await?;
            out.statefulset = w;
            (changed, pending)
        }
        Workload::Deployment(obj) => {
            let (w, changed, pending) =
                reconcile_workload(client, &ns, wl, &*obj, &hash, rev).await?;
            out.deployment = w;
            (changed, pending)
        }
    };
    Ok(out)
}

/// The pod stage: the newest non-terminating pod with the node's position labels, and, when
/// there is none, why the workload controller cannot create it.
async fn observe_pod(
    client: &Client,
    node: &ValkeyNode,
    workload: &AppliedWorkload,
) -> Result<(Option<Pod>, Option<String>), NodeError> {
    let ns = node.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let s = &node.spec;
    let selector = names::node_selector_labels(&s.cluster_name, s.shard_index, s.node_index)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    // Served from the API server's watch cache (`resourceVersion=0`): at least as new as the
    // event that started this pass, and no quorum read per node when many nodes start.
    let pod = pods
        .list(&ListParams::default().labels(&selector).match_any())
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    let now = k8s_openapi::jiff::Timestamp::now();
    let create_failure = match (&pod, &workload.statefulset, &workload.deployment) {
        (None, Some(sts), _)
            if create_failure::worth_asking(
                sts.metadata.creation_timestamp.as_ref().map(|t| t.0),
                now,
            ) =>
        {
            let events: Api<Event> = Api::namespaced(client.clone(), &ns);
            let lp = ListParams::default().fields(&create_failure::event_selector(&sts.name_any()));
            match events.list(&lp).await {
                Ok(list) => create_failure::from_events(&list.items, now),
                Err(e) => {
                    debug!(node = %node.name_any(), error = %e, "cannot list the StatefulSet's events");
                    None
                }
            }
        }
        (None, None, Some(d)) => create_failure::from_deployment(d),
        _ => None,
    };
    Ok((pod, create_failure))
}

/// The report stage's events: a deferred or applied pod-template change, and a claim that
/// cannot grow (once: the cached node may not show the status the previous pass wrote yet,
/// so the refusal is compared with the stored status too).
async fn report(
    ctx: &Ctx,
    nodes: &Api<ValkeyNode>,
    node: &ValkeyNode,
    workload: &AppliedWorkload,
    resize_refused: Option<&str>,
) -> Result<(), NodeError> {
    let name = node.name_any();
    let wl_name = &workload.name;
    let was_pending = node.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == WORKLOAD_ROLL_PENDING && c.status == "True")
    });
    if workload.roll_pending && !was_pending {
        publish(
            ctx,
            node,
            WORKLOAD_ROLL_DEFERRED,
            format!("pod template of {wl_name} changed; waiting for a new spec.workloadRevision"),
        )
        .await;
    } else if workload.template_changed && !workload.roll_pending {
        publish(
            ctx,
            node,
            WORKLOAD_ROLL_APPLIED,
            format!("applied the new pod template to {wl_name}"),
        )
        .await;
    }
    if let Some(why) = resize_refused
        && !size_infeasible(node.status.as_ref())
        && !size_infeasible(nodes.get_status(&name).await?.status.as_ref())
    {
        warn!(node = %name, error = %why, "the claim cannot grow");
        ctx.publish(
            &node.object_ref(&()),
            &[EventSpec::warning(
                RESIZE_INFEASIBLE,
                "Resize",
                format!("{} cannot grow: {why}", names::pvc_name(&name)),
            )],
        )
        .await;
    }
    Ok(())
}

/// Whether `status` already reports the claim's growth as infeasible.
fn size_infeasible(status: Option<&ValkeyNodeStatus>) -> bool {
    status.is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == valkey_api::status::node_condition::PVC_SIZE_READY
                && c.reason == valkey_api::status::node_reason::PVC_RESIZE_INFEASIBLE
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_map_to_their_node() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "valkey-c-1-2-0", "namespace": "ns",
                "labels": {"valkey.io/cluster": "c", "valkey.io/shard-index": "1", "valkey.io/node-index": "2"}}
        }))
        .unwrap();
        let r = node_ref_from_labels(&pod).unwrap();
        assert_eq!(r.name, "c-1-2");
        assert_eq!(r.namespace.as_deref(), Some("ns"));
        let stray: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "namespace": "ns", "labels": {"valkey.io/cluster": "c"}}
        }))
        .unwrap();
        assert!(node_ref_from_labels(&stray).is_none());
    }

    fn api_error(code: u16) -> Result<(), NodeError> {
        Err(NodeError::Kube(kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )))
    }

    #[test]
    fn finalizer_patch_gone_or_conflict_is_not_a_failure() {
        assert_eq!(
            finalizer_patched("n", Ok(())).unwrap(),
            Action::await_change()
        );
        assert_eq!(
            finalizer_patched("n", api_error(404)).unwrap(),
            Action::await_change()
        );
        assert_eq!(
            finalizer_patched("n", api_error(409)).unwrap(),
            Action::requeue(Duration::from_secs(1))
        );
        assert!(finalizer_patched("n", api_error(500)).is_err());
    }

    #[test]
    fn selector_names_managed_objects() {
        assert_eq!(
            managed_selector(),
            "app.kubernetes.io/managed-by=valkey-operator,app.kubernetes.io/component=valkey-node"
        );
    }
}
