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
use tracing::{debug, info, instrument, warn};
use valkey_api::{ValkeyCluster, ValkeyNode, labels};
use valkey_ops::Layout;
use valkey_ops::client::{ClientConfig, NodePool};

use super::act::{self, Actor};
use super::apply::{self, ApplyReport};
use super::build;
use super::config_gate;
use super::live;
use super::observe::{self, ObserveError, Observed};
use super::plan::{self, Balance, FailoverTiming, Plan};
use super::report::{self, Report, ReportError};
use crate::context::Shared;
use crate::metrics::Metrics;
use crate::render::names;
use crate::scope::Scope;
use crate::status::{Activity, Facts, Progress, TopologyFacts};

/// Name of this controller in metrics and events.
pub const CONTROLLER: &str = "valkeycluster";

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
    /// Verdicts of servers on users' ACL rules, by image and rules (see
    /// [`super::observe::judge_user_rules`]): `None` accepted, `Some(reason)` refused.
    rule_verdicts: Mutex<HashMap<String, Option<String>>>,
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        Self {
            shared: Shared::new(client, metrics),
            pools: Mutex::default(),
            rule_verdicts: Mutex::default(),
        }
    }

    /// A server's verdict on ACL rules judged before (`key`: image and rules).
    pub fn rule_verdict(&self, key: &str) -> Option<Option<String>> {
        let v = self.rule_verdicts.lock().unwrap_or_else(|p| p.into_inner());
        v.get(key).cloned()
    }

    /// Records a server's verdict on ACL rules.
    pub fn record_rule_verdict(&self, key: String, verdict: Option<String>) {
        let mut v = self.rule_verdicts.lock().unwrap_or_else(|p| p.into_inner());
        v.insert(key, verdict);
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
    metrics.reconcile(CONTROLLER, pass(&vc, &ctx)).await
}

/// observe → build → apply → plan → act → report.
#[instrument(skip_all, fields(cluster = %format!("{}/{}", requested.namespace().unwrap_or_default(), requested.name_any())))]
async fn pass(requested: &ValkeyCluster, ctx: &Context) -> Result<Action, Error> {
    let vc = requested;
    let ns = vc.namespace().ok_or(Error::NoNamespace)?;
    let key = format!("{ns}/{}", vc.name_any());
    if vc.meta().deletion_timestamp.is_some() {
        ctx.drop_pool(&key);
        ctx.shared.metrics.forget_cluster(&ns, &vc.name_any());
        return Ok(Action::await_change());
    }
    let client = &ctx.shared.client;
    let nodes_api: Api<ValkeyNode> = Api::namespaced(client.clone(), &ns);

    let observed = observe::observe(ctx, vc, &key).await?;
    let gate = config_gate::gate(vc, &observed.check_pods, !observed.nodes.is_empty());
    // From here on the cluster is seen with the image and settings the gate let through.
    let effective = gate.effective_cluster(vc);
    let vc = effective.as_ref();
    let desired = build::build(vc, &observed, &gate);
    let applied = apply::apply_all(client, &ns, &desired, &observed).await;
    let plan = plan::plan(&plan::Input {
        layout: layout(vc),
        topology: &observed.topology,
        pod_ips: &observed.pod_ips,
        terminating: &observed.terminating,
        nodes: &observed.nodes,
        desired_nodes: &desired.nodes,
        timing: failover_timing(vc),
        now: Timestamp::now(),
    });

    // Act: the one step, then the live changes (CONFIG SET, ACL LOAD) that need no planning.
    let pool = ctx.pool(
        &key,
        &observed.passwords.operator,
        observed.tls_ca.as_deref(),
    );
    let actor = Actor {
        pool: &pool,
        nodes: Some(&nodes_api),
    };
    let outcome = match &plan.step {
        Some(step) => {
            debug!(step = ?step, "executing");
            let started = std::time::Instant::now();
            let out = act::execute(&actor, step).await;
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
        None => act::Outcome::default(),
    };
    let now = Time(Timestamp::now());
    let invalid_tls = invalid_tls(vc, &observed);
    let tls_wanted = observed
        .tls_secret
        .as_ref()
        .filter(|_| invalid_tls.is_none())
        .and_then(super::tls_secret::wanted);
    let tls_files = match (vc.spec.tls_secret_name(), &tls_wanted) {
        (None, _) => live::TlsFiles::Off,
        (Some(_), None) => live::TlsFiles::Unusable,
        (Some(_), Some(w)) => live::TlsFiles::Wanted(w),
    };
    let mut live = live::reconcile(
        &pool,
        &nodes_api,
        &ctx.shared,
        live::Input {
            desired: &desired.nodes,
            observed: &observed.nodes,
            topology: &observed.topology,
            tls: tls_files,
            acl_content: Some(desired.acl.0.content.as_str()),
        },
        &now,
    )
    .await;

    report::record_roles(&nodes_api, &observed.nodes, &observed.topology).await;
    let progress = progress(&plan, &applied, outcome.progress.clone(), &live)
        .or_else(|| {
            gate.checking(&requested.spec)
                .map(|m| Progress::new(Activity::Reconciling, m))
        })
        .or_else(|| {
            (desired.users_unchecked > 0).then(|| {
                Progress::new(
                    Activity::UpdatingNodes,
                    format!(
                        "waiting for a server to check the rules of {} users",
                        desired.users_unchecked
                    ),
                )
            })
        });
    let mut events = applied.events;
    events.extend(outcome.events);
    events.extend(std::mem::take(&mut live.events));
    report::report(
        ctx,
        requested,
        Report {
            facts: Facts {
                invalid_config: gate.warning(&requested.spec),
                invalid_tls,
                ..facts(
                    vc,
                    &observed,
                    &plan,
                    applied.failure,
                    progress,
                    outcome.failure,
                )
            },
            tls: tls_wanted.map(|w| valkey_api::status::TlsStatus {
                certificate_sha256: w.fingerprint,
                serving_pods: i32::try_from(live.tls_serving).unwrap_or(i32::MAX),
                pods: i32::try_from(observed.nodes.len()).unwrap_or(i32::MAX),
            }),
            accepted_config: gate.accepted.clone(),
            rejected_config: gate.rejected.clone(),
            shards: plan.shards,
            step: plan.step.as_ref(),
            balance: &plan.balance,
            moved: outcome.moved,
            acted: outcome.acted,
            retry_in: plan.retry_in,
            events,
            now,
        },
    )
    .await
    .map_err(Error::from)
}

fn layout(vc: &ValkeyCluster) -> Layout {
    Layout {
        shards: vc.spec.shards.max(0),
        replicas: vc.spec.replicas.max(0),
    }
}

/// The failure-detection timing of `vc` (its `cluster-node-timeout` and `repl-timeout`, else
/// the operator's and Valkey's defaults).
fn failover_timing(vc: &ValkeyCluster) -> FailoverTiming {
    let default = FailoverTiming::default();
    let ms = |key: &str, scale: u64, fallback: u64| {
        vc.spec
            .config_value(key)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(fallback, |v| v.saturating_mul(scale))
    };
    FailoverTiming {
        node_timeout_ms: ms("cluster-node-timeout", 1, default.node_timeout_ms),
        repl_timeout_ms: ms("repl-timeout", 1000, default.repl_timeout_ms),
    }
}

/// What the cluster is busy with, most specific first: nodes just created, a rolling update,
/// nodes updated, the step's own progress, pods waiting for the new ACL file.
fn progress(
    plan: &Plan,
    applied: &ApplyReport,
    step: Option<Progress>,
    live: &live::Summary,
) -> Option<Progress> {
    if applied.created_nodes > 0 {
        return Some(Progress::new(
            Activity::AddingNodes,
            format!("created {} ValkeyNodes", applied.created_nodes),
        ));
    }
    if let Some(p) = &plan.roll_progress {
        return Some(Progress::new(Activity::UpdatingNodes, p.clone()));
    }
    if applied.updated_nodes > 0 {
        return Some(Progress::new(
            Activity::UpdatingNodes,
            format!("updated {} ValkeyNodes", applied.updated_nodes),
        ));
    }
    // Until the ValkeyNode controller has seen a new spec, a roll it is about to hold back
    // does not show: the cluster is not Ready yet.
    if plan.unobserved_nodes > 0 {
        return Some(Progress::new(
            Activity::UpdatingNodes,
            format!(
                "waiting for {} ValkeyNodes to report on their new spec",
                plan.unobserved_nodes
            ),
        ));
    }
    step.or_else(|| match &plan.balance {
        Balance::Moving {
            remaining,
            draining,
        } => Some(Progress::new(
            Activity::RebalancingSlots,
            if draining.is_empty() {
                format!("{remaining} slots still move to balance the shards")
            } else {
                let d: Vec<String> = draining.iter().map(ToString::to_string).collect();
                format!(
                    "draining shard(s) {}: {remaining} slots still move",
                    d.join(", ")
                )
            },
        )),
        _ => None,
    })
    .or_else(|| {
        (plan.surplus_nodes > 0).then(|| {
            Progress::new(
                Activity::Reconciling,
                format!(
                    "removing {} ValkeyNodes outside the layout",
                    plan.surplus_nodes
                ),
            )
        })
    })
    .or_else(|| {
        (live.tls_pending > 0).then(|| {
            Progress::new(
                Activity::UpdatingNodes,
                format!(
                    "waiting for {} pods to serve the TLS Secret's new certificate",
                    live.tls_pending
                ),
            )
        })
    })
    .or_else(|| {
        (live.acl_pending > 0).then(|| {
            Progress::new(
                Activity::UpdatingNodes,
                format!(
                    "waiting for {} pods to see the new ACL file",
                    live.acl_pending
                ),
            )
        })
    })
}

fn facts(
    vc: &ValkeyCluster,
    observed: &Observed,
    plan: &Plan,
    apply_error: Option<crate::status::ChildFailure>,
    progress: Option<Progress>,
    step_failure: Option<crate::status::StepFailure>,
) -> Facts {
    let spec = &vc.spec;
    Facts {
        invalid_tls: None,
        resize_infeasible: resize_infeasible(&observed.nodes),
        invalid_config: None,
        desired_shards: layout(vc).shards,
        apply_error,
        unschedulable: observed
            .pods
            .iter()
            .find_map(observe::unschedulable_message),
        pod_creation_failed: observed.nodes.iter().find_map(observe::pod_creation_failure),
        acl_admin_warning: crate::render::acl::acl_admin_warning(spec),
        system_users_refused: observe::system_users_refused(&observed.topology),
        unready_pods: observe::unready(&observed.pods, layout(vc)),
        shard_restart: crate::status::shard_restart::shard_restart(
            observed
                .pods
                .iter()
                .filter_map(|p| Some((observe::position(p)?.0, p))),
            &crate::status::shard_restart::served_shards(vc.status.as_ref()),
            spec,
            Timestamp::now(),
        ),
        grace_period_warning: spec.grace_period_too_short().then(|| {
            format!(
                "terminationGracePeriodSeconds {} is below the recommended {} s (cluster-manual-failover-timeout + 10 s): a primary may be killed before its replica takes over",
                spec.termination_grace_period_seconds(),
                spec.recommended_termination_grace_period_seconds()
            )
        }),
        topology: TopologyFacts {
            slots_to_move: match &plan.balance {
                Balance::Moving { remaining, .. } | Balance::NoRoom { remaining, .. } => {
                    u32::try_from(*remaining).unwrap_or(u32::MAX)
                }
                _ => 0,
            },
            surplus_nodes: i32::try_from(plan.surplus_nodes).unwrap_or(i32::MAX),
            balance_blocked: match &plan.balance {
                Balance::Blocked(why) => Some(why.clone()),
                _ => None,
            },
            drain_no_room: match &plan.balance {
                Balance::NoRoom { reason, .. } => Some(reason.clone()),
                _ => None,
            },
            ..plan.facts.clone()
        },
        progress,
        step_failure,
    }
}

/// What is wrong with the cluster's TLS Secret, when TLS is on and something is.
fn invalid_tls(vc: &ValkeyCluster, observed: &Observed) -> Option<String> {
    super::tls_secret::problem(
        vc.spec.tls_secret_name()?,
        observed.tls_secret.as_ref(),
        &names::tls_server_names(&vc.name_any(), &vc.namespace().unwrap_or_default()),
        rustls::pki_types::UnixTime::now(),
    )
}

/// The ValkeyNodes whose claim cannot grow (their `PersistentVolumeClaimSizeReady` condition,
/// reason `PersistentVolumeClaimResizeInfeasible`): the cluster's warning message.
fn resize_infeasible(nodes: &[ValkeyNode]) -> Option<String> {
    use valkey_api::status::{node_condition, node_reason};
    let stuck: Vec<(String, String)> = nodes
        .iter()
        .filter_map(|n| {
            let c = n.status.as_ref()?.conditions.iter().find(|c| {
                c.type_ == node_condition::PVC_SIZE_READY
                    && c.reason == node_reason::PVC_RESIZE_INFEASIBLE
            })?;
            Some((n.name_any(), c.message.clone()))
        })
        .collect();
    let (first, why) = stuck.first()?;
    Some(format!(
        "{} ValkeyNode claims cannot grow (first, {first}: {why}); use a StorageClass with allowVolumeExpansion or set spec.persistence.size back",
        stuck.len()
    ))
}

/// The `reason` label of `valkey_operator_reconcile_failures_total` for each error.
const FAILURE_REASONS: [&str; 3] = ["observe", "report", "no_namespace"];

fn failure_reason(err: &Error) -> &'static str {
    match err {
        Error::Observe(_) => FAILURE_REASONS[0],
        Error::Report(_) => FAILURE_REASONS[1],
        Error::NoNamespace => FAILURE_REASONS[2],
    }
}

fn error_policy(vc: Arc<ValkeyCluster>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.shared.metrics.failed(CONTROLLER, failure_reason(err));
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
    metrics.declare_failures(CONTROLLER, &FAILURE_REASONS);
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
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                debug!(error = %e, "controller event");
            }
        })
        .await;
}
