//! The ValkeyCluster reconcile pass, as a list of stages, and the controller loop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use rustls::pki_types::UnixTime;
use tracing::{debug, info, instrument, warn};
use valkey_api::{ValkeyCluster, ValkeyNode, labels};
use valkey_ops::client::{ClientConfig, NodePool};

use super::apply;
use super::build;
use super::config_gate;
use super::live;
use super::node_zones;
use super::observe::{self, ObserveError};
use super::plan;
use super::report::{self, ReportError};
use super::rule_check;
use super::steps::{self, Actor};
use super::tls_secret::TlsCheck;
use crate::context::Shared;
use crate::metrics::{FailureReason, Metrics};
use crate::render::names;
use crate::scope::Scope;

/// Name of this controller in metrics and events.
pub const CLUSTER_CONTROLLER: &str = "valkeycluster";

/// Errors of a reconcile pass (the pass is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Observation failed.
    #[error(transparent)]
    Observe(#[from] ObserveError),
    /// Reporting failed.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// The object lacks a namespace (the CRD is namespaced, so this is a bug elsewhere).
    #[error("ValkeyCluster has no namespace")]
    NoNamespace,
}

/// Shared state of the controller.
pub struct Context {
    /// Client, recorder and metrics.
    pub shared: Shared,
    /// Connection pools per cluster (`namespace/name`), with the credentials they use.
    pools: Mutex<HashMap<String, (String, NodePool)>>,
    /// Servers' verdicts on users' ACL rules (the [`rule_check`] stage's cache).
    rule_verdicts: rule_check::Verdicts,
    /// The zones of the Kubernetes nodes the pods run on.
    pub node_zones: node_zones::NodeZones,
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        Self {
            shared: Shared::new(client, metrics),
            pools: Mutex::default(),
            rule_verdicts: rule_check::Verdicts::default(),
            node_zones: node_zones::NodeZones::default(),
        }
    }

    /// The pool of the cluster `key` (`namespace/name`), recreated when the password or the
    /// TLS CA changes. With TLS the server certificate must be valid for a name under the
    /// headless Service (see [`names::tls_server_names`]) or for the pod IP.
    pub fn pool(&self, key: &str, password: &str, tls_ca: Option<&[u8]>) -> NodePool {
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
            let (ns, cluster) = key.split_once('/').unwrap_or(("", key));
            config = config.with_tls_names(ca.to_vec(), names::tls_server_names(cluster, ns));
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

/// One reconcile pass.
pub async fn reconcile(vc: Arc<ValkeyCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let metrics = ctx.shared.metrics.clone();
    metrics
        .reconcile(CLUSTER_CONTROLLER, cluster_pass(&vc, &ctx))
        .await
}

/// observe → check users' rules → build → apply → plan → act (step, live settings) → report.
#[instrument(skip_all, fields(cluster = %format!("{}/{}", requested.namespace().unwrap_or_default(), requested.name_any())))]
async fn cluster_pass(requested: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = requested.namespace().ok_or(Error::NoNamespace)?;
    let key = format!("{ns}/{}", requested.name_any());
    if requested.meta().deletion_timestamp.is_some() {
        return Ok(forget(ctx, &key, requested));
    }
    let client = &ctx.shared.client;
    let nodes_api: Api<ValkeyNode> = Api::namespaced(client.clone(), &ns);

    let mut clock = crate::stage_clock::StageClock::start("pass");
    let observed = observe::observe(ctx, requested, &key).await?;
    clock.lap("observe");
    let (spec, topology) = (&requested.spec, &observed.topology);
    let user_rules = rule_check::check(&ctx.rule_verdicts, &observed.pool, spec, topology).await;
    clock.lap("rule_check");
    let gate = config_gate::gate(requested, &observed.check_pods, !observed.nodes.is_empty());
    // From here on the cluster is seen with the image and settings the gate let through.
    let effective = gate.effective_cluster(requested);
    let desired = build::build(&effective, &observed, &user_rules, &gate);
    clock.lap("build");
    let applied = apply::apply_all(client, &ns, &desired, &observed).await;
    clock.lap("apply");
    let plan = plan::plan(&plan_input(requested, &effective, &observed, &desired));
    let outcome = act(ctx, &observed.pool, &nodes_api, plan.step.as_ref()).await;
    clock.lap("act");
    let tls = TlsCheck::of(&effective, observed.tls_secret.as_ref(), UnixTime::now());
    let now = Timestamp::now();
    let live_input = live::Input {
        desired: &desired.nodes,
        observed: &observed.nodes,
        topology: &observed.topology,
        tls: tls.files(&effective),
        acl_content: Some(desired.acl.0.content.as_str()),
        acl_revision: Some(desired.acl.0.revision.as_str()),
        zones: live::zones_to_set(&effective.spec, &observed.pod_zones),
    };
    let (pool, shared) = (&observed.pool, &ctx.shared);
    let live = live::apply_live(pool, &nodes_api, shared, live_input, &Time(now)).await;
    clock.lap("live");
    // After the live pass, from the nodes as it left them (both write the same fields).
    report::record_roles(&nodes_api, &live.nodes, &observed.topology).await;
    clock.lap("roles");
    let stages = report::facts::Stages {
        requested,
        effective: &effective,
        observed: &observed,
        gate: &gate,
        desired: &desired,
        applied: &applied,
        plan: &plan,
        outcome: &outcome,
        live: &live,
        tls: &tls,
        now,
    };
    let report = report::facts::assemble(&stages);
    let action = report::report(ctx, requested, report).await;
    clock.lap("report");
    clock.log();
    action.map_err(Error::from)
}

/// A cluster being deleted: its pool and metrics are dropped; its children go with it
/// (owner references).
fn forget(ctx: &Context, key: &str, vc: &ValkeyCluster) -> Action {
    ctx.drop_pool(key);
    let ns = vc.namespace().unwrap_or_default();
    ctx.shared.metrics.forget_cluster(&ns, &vc.name_any());
    Action::await_change()
}

/// What planning reads from the stages before it (and, for the failback wait, from the status
/// of the `requested` cluster).
pub(crate) fn plan_input<'a>(
    requested: &'a ValkeyCluster,
    effective: &ValkeyCluster,
    observed: &'a observe::Observed,
    desired: &'a build::Desired,
) -> plan::Input<'a> {
    plan::Input {
        layout: plan::layout(effective),
        topology: &observed.topology,
        pod_ips: &observed.pod_ips,
        terminating: &observed.terminating,
        nodes: &observed.nodes,
        desired_nodes: &desired.nodes,
        timing: plan::failover_timing(effective),
        now: Timestamp::now(),
        failback: effective.spec.failback.quiet_period(),
        previous_shards: requested
            .status
            .as_ref()
            .map_or(&[], |s| s.shard_statuses.as_slice()),
    }
}

/// Runs the step of the pass, if any, and counts it in the metrics.
async fn act(
    ctx: &Context,
    pool: &NodePool,
    nodes: &Api<ValkeyNode>,
    step: Option<&steps::Step>,
) -> steps::Outcome {
    let Some(step) = step else {
        return steps::Outcome::default();
    };
    debug!(step = ?step, "executing");
    let started = std::time::Instant::now();
    let actor = Actor {
        pool,
        nodes: Some(nodes),
    };
    let out = steps::execute(&actor, step).await;
    if out.acted {
        ctx.shared.metrics.step(step.kind());
        info!(kind = step.kind(), "step executed");
    }
    if let Some(m) = out.moved.filter(|m| m.slots > 0) {
        let took = started.elapsed();
        ctx.shared.metrics.migrated(m.slots, m.keys, took);
        info!(slots = m.slots, keys = ?m.keys, seconds = took.as_secs_f64(), "slots moved");
    }
    out
}

impl FailureReason for Error {
    const REASONS: &'static [&'static str] = &["observe", "report", "no_namespace"];

    fn reason(&self) -> &'static str {
        match self {
            Error::Observe(_) => "observe",
            Error::Report(_) => "report",
            Error::NoNamespace => "no_namespace",
        }
    }
}

fn cluster_error_policy(vc: Arc<ValkeyCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.shared.metrics.failed_with(CLUSTER_CONTROLLER, err);
    let cluster = format!("{}/{}", vc.namespace().unwrap_or_default(), vc.name_any());
    let _span = tracing::info_span!("retry", cluster = %cluster).entered();
    warn!(error = %err, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the ValkeyCluster controller over `scope` until `shutdown` completes.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    scope: Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    metrics.declare_failures_of::<Error>(CLUSTER_CONTROLLER);
    let ctx = Arc::new(Context::new(client.clone(), metrics));
    let managed = watcher::Config::default().labels(labels::CLUSTER);
    let clusters: Api<ValkeyCluster> = scope.api(&client);
    let controller = Controller::new(clusters, watcher::Config::default());
    let store = controller.store();
    controller
        .owns(scope.api::<ValkeyNode>(&client), managed.clone())
        .owns(scope.api::<Service>(&client), managed.clone())
        .owns(scope.api::<ConfigMap>(&client), managed.clone())
        .owns(scope.api::<Secret>(&client), managed.clone())
        .owns(scope.api::<PodDisruptionBudget>(&client), managed.clone())
        .owns(scope.api::<NetworkPolicy>(&client), managed.clone())
        // A config-check pod finished: act on its verdict now.
        .owns(
            scope.api::<Pod>(&client),
            watcher::Config::default().labels(&format!(
                "{}={}",
                labels::APP_COMPONENT,
                labels::COMPONENT_CONFIG_CHECK
            )),
        )
        // A user's password Secret or the TLS Secret changed: reconcile the clusters that
        // read it now, not at the next requeue.
        .watches(
            scope.api::<Secret>(&client),
            watcher::Config::default(),
            move |secret: Secret| {
                let (ns, name) = (secret.namespace(), secret.name_any());
                store
                    .state()
                    .into_iter()
                    .filter(|vc| vc.namespace() == ns && observe::reads_secret(&vc.spec, &name))
                    .map(|vc| ObjectRef::from_obj(vc.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .watches(scope.api::<Pod>(&client), managed, |pod: Pod| {
            let cluster = pod.labels().get(labels::CLUSTER)?.clone();
            let ns = pod.namespace()?;
            Some(ObjectRef::<ValkeyCluster>::new(&cluster).within(&ns))
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, cluster_error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                debug!(error = %e, "controller event");
            }
        })
        .await;
}
