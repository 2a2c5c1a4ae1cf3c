//! The ValkeyCluster reconcile pass and the controller loop.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info, warn};
use valkey_api::labels::{self, CLUSTER_FIELD_MANAGER};
use valkey_api::{ValkeyCluster, ValkeyNode};
use valkey_ops::client::{ClientConfig, NodePool};

use super::apply::{self, Applied};
use super::observe;
use super::roll::{self, RollStep};
use super::topology::{self, Desired};
use super::{act, desired, live, operation};
use crate::metrics::Metrics;
use crate::render;
use crate::status::{self, EventSpec, Facts, reason};

/// Name of this controller in metrics and events.
pub const CONTROLLER: &str = "valkeycluster";

/// Errors of a reconcile pass (the pass is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The object lacks a namespace (the CRD is namespaced, so this is a bug elsewhere).
    #[error("ValkeyCluster has no namespace")]
    NoNamespace,
}

/// Shared state of the controller.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Arc<Metrics>,
    /// Connection pools per cluster (`namespace/name`), with the password they use.
    pools: Mutex<HashMap<String, (String, NodePool)>>,
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "valkey-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            pools: Mutex::default(),
        }
    }

    /// The pool of a cluster, recreated when the password or the TLS CA changes. With TLS the
    /// server certificate is verified against the pod IP (it needs an IP SAN).
    fn pool(&self, key: &str, password: &str, tls_ca: Option<&[u8]>) -> NodePool {
        let ca_hash = tls_ca.map(|ca| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(ca)));
        let fingerprint = format!("{password}\n{}", ca_hash.unwrap_or_default());
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((fp, pool)) = pools.get(key)
            && *fp == fingerprint
        {
            return pool.clone();
        }
        let mut config = ClientConfig::new(valkey_ops::commands::acl::OPERATOR_USER, password)
            .with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
        if let Some(ca) = tls_ca {
            config = config.with_tls(ca.to_vec(), None);
        }
        let pool = NodePool::new(config);
        pools.insert(key.to_owned(), (fingerprint, pool.clone()));
        pool
    }

    fn drop_pool(&self, key: &str) {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

async fn publish(ctx: &Context, vc: &ValkeyCluster, events: &[EventSpec]) {
    let reference = vc.object_ref(&());
    for e in events {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_owned(),
            note: Some(e.note.chars().take(1000).collect()),
            action: e.action.to_owned(),
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&ev, &reference).await {
            warn!(reason = e.reason, error = %err, "publishing event failed");
        }
    }
}

fn applied_event(
    what: Applied,
    created: &'static str,
    updated: &'static str,
    name: &str,
) -> Option<EventSpec> {
    match what {
        Applied::Created => Some(EventSpec::normal(
            created,
            "Apply",
            format!("created {name}"),
        )),
        Applied::Updated => Some(EventSpec::normal(
            updated,
            "Apply",
            format!("updated {name}"),
        )),
        Applied::Unchanged => None,
    }
}

/// One reconcile pass.
pub async fn reconcile(vc: Arc<ValkeyCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let r = reconcile_inner(&vc, &ctx).await;
    ctx.metrics
        .reconciled(CONTROLLER, started.elapsed(), r.is_err());
    r
}

async fn reconcile_inner(vc: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = vc.namespace().ok_or(Error::NoNamespace)?;
    let name = vc.name_any();
    let key = format!("{ns}/{name}");
    if vc.meta().deletion_timestamp.is_some() {
        ctx.drop_pool(&key);
        ctx.metrics.forget_cluster(&ns, &name);
        return Ok(Action::await_change());
    }
    let client = &ctx.client;
    let owner = render::owner_reference(vc);
    let spec = &vc.spec;
    let selector = format!("{}={}", labels::CLUSTER, name);
    let lp = ListParams::default().labels(&selector);

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns);
    let vnodes: Api<ValkeyNode> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let mut events = Vec::new();
    let mut apply_error: Option<(&'static str, String)> = None;
    let mut progress: Option<(&'static str, String)> = None;

    // Observe children.
    let svc_name = render::names::service_name(&name);
    let cm_name = render::names::config_map_name(&name);
    let sys_name = render::names::system_secret_name(&name);
    let acl_name = render::names::acl_secret_name(&name);
    let pdb_name = render::names::pdb_name(&name);
    let observed_svc = services.get_opt(&svc_name).await?;
    let observed_cm = config_maps.get_opt(&cm_name).await?;
    let observed_sys = secrets.get_opt(&sys_name).await?;
    let observed_acl = secrets.get_opt(&acl_name).await?;
    let observed_pdb = pdbs.get_opt(&pdb_name).await?;
    let observed_nodes: Vec<ValkeyNode> = vnodes.list(&lp).await?.items;
    let observed_pods: Vec<Pod> = pods.list(&lp).await?.items;

    // System passwords (kept) and user passwords.
    let passwords = render::secrets::system_passwords(observed_sys.as_ref());
    let mut user_secrets = BTreeMap::new();
    for s in render::acl::referenced_secrets(spec) {
        if let Some(sec) = secrets.get_opt(&s).await? {
            user_secrets.insert(s, sec);
        }
    }

    // Build and apply.
    let sys = render::secrets::system_secret(&name, &ns, &passwords, owner.clone());
    match apply::apply(&secrets, &sys, observed_sys.as_ref(), &["data"]).await {
        Ok(a) => events.extend(applied_event(
            a,
            "InternalSecretsCreated",
            "InternalSecretsUpdated",
            &sys_name,
        )),
        Err(e) => apply_error = Some((reason::SYSTEM_USERS_ACL_ERROR, e.to_string())),
    }
    let acl_file = match render::acl::resolve_user_passwords(spec, &user_secrets) {
        Ok(users) => Some(render::acl::render_acl_file(spec, &passwords, &users)),
        Err(e) => {
            apply_error.get_or_insert((reason::USERS_ACL_ERROR, e.to_string()));
            None
        }
    };
    if let Some(acl) = &acl_file {
        let sec = render::secrets::acl_secret(&name, &ns, &acl.content, owner.clone());
        if let Err(e) = apply::apply(&secrets, &sec, observed_acl.as_ref(), &["data"]).await {
            apply_error.get_or_insert((reason::USERS_ACL_ERROR, e.to_string()));
        }
    }
    let svc = render::service::service(&name, &ns, owner.clone());
    match apply::apply(&services, &svc, observed_svc.as_ref(), &[]).await {
        Ok(a) => events.extend(applied_event(
            a,
            "ServiceCreated",
            "ServiceUpdated",
            &svc_name,
        )),
        Err(e) => {
            events.push(EventSpec::warning(
                "ServiceUpdateFailed",
                "Apply",
                e.to_string(),
            ));
            apply_error.get_or_insert((reason::SERVICE_ERROR, e.to_string()));
        }
    }
    let cm = render::config::config_map(&name, &ns, spec, owner.clone());
    match apply::apply(&config_maps, &cm, observed_cm.as_ref(), &["data"]).await {
        Ok(a) => events.extend(applied_event(
            a,
            "ConfigMapCreated",
            "ConfigMapUpdated",
            &cm_name,
        )),
        Err(e) => {
            events.push(EventSpec::warning(
                "ConfigMapUpdateFailed",
                "Apply",
                e.to_string(),
            ));
            apply_error.get_or_insert((reason::CONFIG_MAP_ERROR, e.to_string()));
        }
    }
    match render::pdb::pod_disruption_budget(&name, &ns, spec, owner.clone()) {
        Some(pdb) => match apply::apply(&pdbs, &pdb, observed_pdb.as_ref(), &[]).await {
            Ok(a) => events.extend(applied_event(
                a,
                "PodDisruptionBudgetCreated",
                "PodDisruptionBudgetUpdated",
                &pdb_name,
            )),
            Err(e) => {
                apply_error.get_or_insert((reason::PDB_ERROR, e.to_string()));
            }
        },
        None if observed_pdb.is_some() => match apply::delete(&pdbs, &pdb_name).await {
            Ok(_) => events.push(EventSpec::normal(
                "PodDisruptionBudgetDeleted",
                "Delete",
                format!("deleted {pdb_name} (mode Disabled)"),
            )),
            Err(e) => {
                apply_error.get_or_insert((reason::PDB_ERROR, e.to_string()));
            }
        },
        None => {}
    }

    // Live views (needed before deleting surplus nodes that may still own slots).
    let tls_ca = match spec.tls_secret_name() {
        Some(n) => secrets
            .get_opt(n)
            .await?
            .and_then(|s| s.data?.get("ca.crt").map(|b| b.0.clone())),
        None => None,
    };
    if spec.tls_secret_name().is_some() && tls_ca.is_none() {
        apply_error.get_or_insert((
            reason::SERVICE_ERROR,
            "the TLS Secret is missing or has no ca.crt".to_owned(),
        ));
    }
    let pool = ctx.pool(&key, &passwords.operator, tls_ca.as_deref());
    let members = observe::members(&pool, &observed_pods).await;
    // Roles come from the live view; patched only when they change.
    for (node, role) in observe::role_updates(&observed_nodes, &members) {
        let patch = serde_json::json!({ "status": { "role": role } });
        if let Err(e) = vnodes
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            debug!(node = %node, error = %e, "could not record the live role");
        }
    }

    let desired_layout = Desired {
        shards: spec.shards.max(0),
        replicas: spec.replicas.max(0),
    };
    // The topology step of this pass, and when there is none, the next rolling-update step.
    let in_layout: Vec<_> = members
        .iter()
        .filter(|m| m.shard < desired_layout.shards && m.index <= desired_layout.replicas)
        .cloned()
        .collect();
    let pod_ips = observe::pod_ips(&observed_pods);
    let step = topology::next_step(desired_layout, &in_layout, Some(&pod_ips));
    let layout_nodes: Vec<ValkeyNode> = observed_nodes
        .iter()
        .filter(|n| {
            n.spec.shard_index < desired_layout.shards
                && n.spec.node_index <= desired_layout.replicas
        })
        .cloned()
        .collect();
    let roll_step = if step.is_none() {
        let (t, _) = topology::analyze(desired_layout, &in_layout);
        let healthy = t.cluster_ok
            && t.missing_shards == 0
            && t.missing_replicas == 0
            && t.unjoined_nodes == 0;
        roll::next_roll(&layout_nodes, &in_layout, healthy)
    } else {
        None
    };
    if let Some(p) = roll::progress(&layout_nodes) {
        progress = Some((reason::UPDATING_NODES, p));
    }
    let authorize = match &roll_step {
        Some(RollStep::Authorize { node }) => {
            info!(cluster = %key, node = %node, "authorizing the roll of a node");
            Some(node.as_str())
        }
        _ => None,
    };
    let want = desired::valkey_nodes(
        vc,
        acl_file.as_ref(),
        owner.clone(),
        &observed_nodes,
        authorize,
    );
    let (mut created, mut updated) = (0, 0);
    for vn in &want {
        let observed = observed_nodes
            .iter()
            .find(|o| o.name_any() == vn.name_any());
        match apply::apply(&vnodes, vn, observed, &["spec"]).await {
            Ok(Applied::Created) => created += 1,
            Ok(Applied::Updated) => updated += 1,
            Ok(Applied::Unchanged) => {}
            Err(e) => {
                apply_error.get_or_insert((reason::VALKEY_NODE_ERROR, e.to_string()));
            }
        }
    }
    if created > 0 {
        events.push(EventSpec::normal(
            "ValkeyNodeCreated",
            "Apply",
            format!("created {created} ValkeyNodes"),
        ));
        progress = Some((
            reason::ADDING_NODES,
            format!("created {created} ValkeyNodes"),
        ));
    }
    if updated > 0 {
        events.push(EventSpec::normal(
            "ValkeyNodeUpdated",
            "Apply",
            format!("updated {updated} ValkeyNodes"),
        ));
        progress.get_or_insert((
            reason::UPDATING_NODES,
            format!("updated {updated} ValkeyNodes"),
        ));
    }
    // Surplus ValkeyNodes: delete those whose pod holds no slots.
    for o in &observed_nodes {
        let (s, i) = (o.spec.shard_index, o.spec.node_index);
        if s < desired_layout.shards && i <= desired_layout.replicas {
            continue;
        }
        let owns_slots = members.iter().any(|m| {
            m.shard == s
                && m.index == i
                && m.view
                    .as_ref()
                    .and_then(|v| v.nodes.myself())
                    .is_some_and(|me| me.is_primary() && me.slot_count() > 0)
        });
        if owns_slots {
            warn!(node = %o.name_any(), "surplus node still owns slots; scale-in of shards is not supported yet");
            continue;
        }
        match apply::delete(&vnodes, &o.name_any()).await {
            Ok(true) => events.push(EventSpec::normal(
                "ValkeyNodeDeleted",
                "Delete",
                format!("deleted surplus ValkeyNode {}", o.name_any()),
            )),
            Ok(false) => {}
            Err(e) => {
                apply_error.get_or_insert((reason::VALKEY_NODE_ERROR, e.to_string()));
            }
        }
    }

    // One topology step, or the failover that hands a primary's slots over before its roll.
    let mut step_failure = None;
    let mut acted = authorize.is_some();
    if let Some(RollStep::Failover {
        replica,
        shard,
        primary,
    }) = &roll_step
    {
        let out = act::roll_failover(&pool, replica, *shard, primary).await;
        acted |= out.acted;
        events.extend(out.events);
        step_failure = out.failure;
    }
    if let Some(step) = &step {
        debug!(cluster = %key, step = ?step, "topology step");
        let out = act::execute(&pool, step).await;
        if out.acted {
            ctx.metrics.step(step.kind());
            info!(cluster = %key, kind = step.kind(), "topology step executed");
        }
        acted = out.acted;
        events.extend(out.events);
        step_failure = out.failure;
        if progress.is_none() {
            progress = out.progress;
        }
    }
    // Live changes: CONFIG SET and ACL LOAD where needed, conditions on the ValkeyNodes.
    let now = Time(Timestamp::now());
    let live = live::reconcile(
        &pool,
        &vnodes,
        &ctx.recorder,
        &want,
        &observed_nodes,
        &members,
        &now,
    )
    .await;
    if live.acl_pending > 0 {
        progress.get_or_insert((
            reason::UPDATING_NODES,
            format!(
                "waiting for {} pods to see the new ACL file",
                live.acl_pending
            ),
        ));
    }
    let (topo, shard_statuses) = topology::analyze(desired_layout, &in_layout);
    let unschedulable = observed_pods
        .iter()
        .find_map(observe::unschedulable_message);
    let grace_period_warning = spec.grace_period_too_short().then(|| {
        format!(
            "terminationGracePeriodSeconds {} is below the recommended {} s (cluster-manual-failover-timeout + 10 s): a primary may be killed before its replica takes over",
            spec.termination_grace_period_seconds(),
            spec.recommended_termination_grace_period_seconds()
        )
    });
    // A shard without a writer is watched closely: its takeover (or Valkey's own election)
    // should be acted on or observed within a second.
    let writer_missing = topo.missing_shards > 0;
    let facts = Facts {
        desired_shards: desired_layout.shards,
        apply_error,
        unschedulable,
        grace_period_warning,
        topology: topo,
        progress,
        step_failure,
    };
    let mut new_status = status::build(
        vc.status.as_ref(),
        &facts,
        shard_statuses,
        vc.meta().generation,
        &now,
    );
    new_status.operation = operation::operation(
        step.as_ref(),
        vc.status.as_ref().and_then(|s| s.operation.as_ref()),
        &now,
    );
    ctx.metrics.set_cluster_state(&ns, &name, new_status.state);
    events.extend(status::transition_events(vc.status.as_ref(), &new_status));
    if status::changed(vc.status.as_ref(), &new_status) {
        let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), &ns);
        let patch = serde_json::json!({ "status": new_status });
        match api
            .patch_status(
                &name,
                &PatchParams::apply(CLUSTER_FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
        {
            // Deleted during the pass: nothing left to report.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::await_change()),
            r => r?,
        };
        info!(cluster = %key, state = ?new_status.state, reason = ?new_status.reason, "status updated");
    }
    publish(ctx, vc, &events).await;

    let ready = new_status.state == valkey_api::status::ClusterState::Ready;
    Ok(Action::requeue(if acted || writer_missing {
        Duration::from_secs(1)
    } else if ready {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(3)
    }))
}

fn error_policy(_vc: Arc<ValkeyCluster>, err: &Error, _ctx: Arc<Context>) -> Action {
    warn!(error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the ValkeyCluster controller until `shutdown` completes.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(Context::new(client.clone(), metrics));
    let managed = watcher::Config::default().labels(labels::CLUSTER);
    let clusters: Api<ValkeyCluster> = Api::all(client.clone());
    Controller::new(clusters, watcher::Config::default())
        .owns(Api::<ValkeyNode>::all(client.clone()), managed.clone())
        .owns(Api::<Service>::all(client.clone()), managed.clone())
        .owns(Api::<ConfigMap>::all(client.clone()), managed.clone())
        .owns(Api::<Secret>::all(client.clone()), managed.clone())
        .owns(
            Api::<PodDisruptionBudget>::all(client.clone()),
            managed.clone(),
        )
        .watches(Api::<Pod>::all(client), managed, |pod: Pod| {
            let cluster = pod.labels().get(labels::CLUSTER)?.clone();
            let ns = pod.namespace()?;
            Some(ObjectRef::<ValkeyCluster>::new(&cluster).within(&ns))
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                debug!(error = %e, "controller event");
            }
        })
        .await;
}
