//! Observation: the ValkeyCluster's children from the API server and the live view of every
//! pod (fetched concurrently through the operator's authenticated connection pool), as one
//! [`Observed`] value. Nothing here writes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use valkey_api::defaults::VALKEY_PORT;
use valkey_api::{ValkeyCluster, ValkeyNode, labels};
use valkey_ops::client::NodePool;
use valkey_ops::commands::{Position, observe_topology};
use valkey_ops::{Layout, Topology};

use super::Context;
use crate::render::{self, names, secrets::SystemPasswords};

/// Errors of observation: an API read failed (the pass is retried).
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// A Kubernetes API read failed.
    #[error("reading {what}: {source}")]
    Kube {
        /// What was read.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

fn read(what: &'static str) -> impl FnOnce(kube::Error) -> ObserveError {
    move |source| ObserveError::Kube { what, source }
}

/// Whether a cluster with `spec` reads the user-owned Secret `name` (a user's password Secret
/// or the TLS Secret): a change to it must be acted on at once.
pub fn reads_secret(spec: &valkey_api::ValkeyClusterSpec, name: &str) -> bool {
    spec.tls_secret_name() == Some(name) || render::acl::referenced_secrets(spec).contains(name)
}

/// Everything a pass knows about a ValkeyCluster's world.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The system users Secret.
    pub system_secret: Option<Secret>,
    /// Its backup (the passwords a deleted system Secret is restored with).
    pub system_backup_secret: Option<Secret>,
    /// The ACL Secret.
    pub acl_secret: Option<Secret>,
    /// The headless Service.
    pub service: Option<Service>,
    /// The `valkey.conf` ConfigMap.
    pub config_map: Option<ConfigMap>,
    /// The cluster's PodDisruptionBudgets (by its label).
    pub pdbs: Vec<PodDisruptionBudget>,
    /// The NetworkPolicy.
    pub network_policy: Option<NetworkPolicy>,
    /// The cluster's ValkeyNodes.
    pub nodes: Vec<ValkeyNode>,
    /// The cluster's pods.
    pub pods: Vec<Pod>,
    /// The cluster's config-check pods (see [`crate::render::config_check`]).
    pub check_pods: Vec<Pod>,
    /// Secrets referenced by `spec.users[].passwordSecret` that exist, by name.
    pub user_secrets: BTreeMap<String, Secret>,
    /// The system passwords in effect (those of the system Secret, or new ones).
    pub passwords: SystemPasswords,
    /// The TLS Secret when TLS is enabled and it exists.
    pub tls_secret: Option<Secret>,
    /// The TLS CA (`ca.crt` of the TLS Secret) when TLS is enabled.
    pub tls_ca: Option<Vec<u8>>,
    /// Every position with a running pod and its node's live view.
    pub topology: Topology,
    /// The operator's connection pool to the cluster's pods (with the credentials and CA
    /// observed).
    pub pool: NodePool,
    /// IPs held by the cluster's pods that still exist (see [`pod_ips`]).
    pub pod_ips: BTreeSet<IpAddr>,
    /// IP → name of the cluster's pods being deleted that still run (see [`terminating`]).
    pub terminating: BTreeMap<IpAddr, String>,
    /// Pod name → the `topology.kubernetes.io/zone` of its Kubernetes node (see
    /// [`super::node_zones`]); empty when the operator may not read nodes.
    pub pod_zones: BTreeMap<String, String>,
}

impl Observed {
    /// The observed ValkeyNode named `name`.
    pub fn node(&self, name: &str) -> Option<&ValkeyNode> {
        self.nodes.iter().find(|n| n.name_any() == name)
    }
}

/// Reads the children of `vc` and observes its pods.
pub async fn observe(
    ctx: &Context,
    vc: &ValkeyCluster,
    key: &str,
) -> Result<Observed, ObserveError> {
    let ns = vc.namespace().unwrap_or_default();
    let name = vc.name_any();
    let client = &ctx.shared.client;
    let lp = ListParams::default().labels(&format!("{}={}", labels::CLUSTER, name));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);

    let mut clock = crate::stage_clock::StageClock::start("observe");
    let get_secret = |n: String| {
        let secrets = secrets.clone();
        async move { secrets.get_opt(&n).await.map_err(read("a Secret")) }
    };
    // The reads are independent: made at once, a pass waits for the slowest, not their sum
    // (on a busy API server, while a large cluster's pods start, each takes a second or more).
    let read_service = async {
        Api::<Service>::namespaced(client.clone(), &ns)
            .get_opt(&names::service_name(&name))
            .await
            .map_err(read("the Service"))
    };
    let read_config_map = async {
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt(&names::config_map_name(&name))
            .await
            .map_err(read("the ConfigMap"))
    };
    let read_pdbs = async {
        Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await
            .map(|l| l.items)
            .map_err(read("PodDisruptionBudgets"))
    };
    let read_network_policy = async {
        let got = Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
            .get_opt(&names::network_policy_name(&name))
            .await;
        // An operator whose role predates NetworkPolicies may not read them: that only
        // matters to a cluster that enables one (its apply then fails with the API server's
        // words).
        if vc.spec.network_policy().is_some() {
            got.map_err(read("the NetworkPolicy"))
        } else {
            Ok(got.unwrap_or_default())
        }
    };
    let read_nodes = async {
        Api::<ValkeyNode>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await
            .map(|l| l.items)
            .map_err(read("ValkeyNodes"))
    };
    let read_pods = async {
        Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await
            .map(|l| l.items)
            .map_err(read("pods"))
    };
    let read_check_pods = async {
        Api::<Pod>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&render::config_check::selector(&name)))
            .await
            .map(|l| l.items)
            .map_err(read("config-check pods"))
    };
    let read_user_secrets = async {
        let names = render::acl::referenced_secrets(&vc.spec);
        let got =
            futures::future::try_join_all(names.iter().map(|s| get_secret(s.clone()))).await?;
        Ok::<_, ObserveError>(
            names
                .into_iter()
                .zip(got)
                .filter_map(|(n, sec)| Some((n, sec?)))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let read_tls_secret = async {
        match vc.spec.tls_secret_name() {
            Some(n) => get_secret(n.to_owned()).await,
            None => Ok(None),
        }
    };
    let (
        system_secret,
        system_backup_secret,
        acl_secret,
        service,
        config_map,
        pdbs,
        network_policy,
        nodes,
        pods,
        check_pods,
        user_secrets,
        tls_secret,
    ) = tokio::try_join!(
        get_secret(names::system_secret_name(&name)),
        get_secret(names::system_backup_secret_name(&name)),
        get_secret(names::acl_secret_name(&name)),
        read_service,
        read_config_map,
        read_pdbs,
        read_network_policy,
        read_nodes,
        read_pods,
        read_check_pods,
        read_user_secrets,
        read_tls_secret,
    )?;
    let tls_ca = tls_secret
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get("ca.crt").map(|b| b.0.clone()));

    clock.lap("api reads");
    let passwords =
        render::secrets::system_passwords(&[system_secret.as_ref(), system_backup_secret.as_ref()]);
    let pod_zones = ctx.node_zones.of_pods(client, &pods).await;
    let pool = ctx.pool(key, &passwords.operator, tls_ca.as_deref());
    clock.lap("zones");
    let topology = observe_topology(&pool, positions(&pods)).await;
    clock.lap("servers");
    clock.log();
    Ok(Observed {
        pod_ips: pod_ips(&pods),
        terminating: terminating(&pods),
        pod_zones,
        system_secret,
        system_backup_secret,
        acl_secret,
        service,
        config_map,
        pdbs,
        network_policy,
        nodes,
        pods,
        check_pods,
        user_secrets,
        passwords,
        tls_secret,
        tls_ca,
        topology,
        pool,
    })
}

/// Shard and node index of a pod, from its labels.
pub fn position(pod: &Pod) -> Option<(i32, i32)> {
    let l = pod.labels();
    Some((
        l.get(labels::SHARD_INDEX)?.parse().ok()?,
        l.get(labels::NODE_INDEX)?.parse().ok()?,
    ))
}

/// The address of a running, non-terminating pod.
pub fn pod_addr(pod: &Pod) -> Option<SocketAddr> {
    if pod.meta().deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    Some(SocketAddr::new(ip, u16::try_from(VALKEY_PORT).ok()?))
}

/// The positions to observe: every running pod with position labels.
pub fn positions(pods: &[Pod]) -> Vec<Position> {
    pods.iter()
        .filter_map(|p| {
            let (shard, index) = position(p)?;
            Some(Position {
                shard,
                index,
                pod: p.name_any(),
                addr: pod_addr(p)?,
            })
        })
        .collect()
}

/// IPs held by the cluster's pods that still exist and have not finished (terminating pods
/// included: their server may still be handing over).
pub fn pod_ips(pods: &[Pod]) -> BTreeSet<IpAddr> {
    pods.iter()
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
                return None;
            }
            status.pod_ip.as_deref()?.parse().ok()
        })
        .collect()
}

/// IP → name of the cluster's pods that are being deleted and still run (their `preStop` hook
/// may be waiting for a primary's hand-over, see `plan/handover.rs`).
pub fn terminating(pods: &[Pod]) -> BTreeMap<IpAddr, String> {
    pods.iter()
        .filter(|p| p.meta().deletion_timestamp.is_some())
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            if status.phase.as_deref() != Some("Running") {
                return None;
            }
            Some((status.pod_ip.as_deref()?.parse().ok()?, p.name_any()))
        })
        .collect()
}

/// Names of the pods at a position of `layout` whose `Ready` condition is not True (their
/// readiness probe has not passed yet, or they are being deleted), in name order.
pub fn unready(pods: &[Pod], layout: Layout) -> Vec<String> {
    let mut names: Vec<String> = pods
        .iter()
        .filter(|p| position(p).is_some_and(|(s, i)| layout.contains(s, i)))
        .filter(|p| !crate::node::status::pod_ready(p))
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    names
}

/// Pods Kubernetes reports Ready (and not being deleted) whose server the operator could not
/// observe, as `pod (error)`, sorted: the pod network between them is broken (a pod whose
/// server is down fails its readiness probe instead). Refused credentials are reported apart.
pub fn unreachable(topology: &Topology, pods: &[Pod]) -> Vec<String> {
    let mut out: Vec<String> = topology
        .members()
        .iter()
        .filter(|m| m.view.is_none() && m.auth_refused.is_none())
        .filter(|m| {
            pods.iter().any(|p| {
                p.name_any() == m.pod
                    && p.metadata.deletion_timestamp.is_none()
                    && crate::node::status::pod_ready(p)
            })
        })
        .map(|m| {
            let error = m.error.as_deref().unwrap_or("no answer");
            format!("{} ({})", m.pod, crate::text::clamp(error, 160))
        })
        .collect();
    out.sort();
    out
}

/// The first pod whose server refuses the operator's credentials, as the Ready message with
/// the remedy: its system users were changed on the server (by a user allowed to change ACLs).
pub fn system_users_refused(topology: &Topology) -> Option<String> {
    let m = topology
        .members()
        .iter()
        .find(|m| m.auth_refused.is_some())?;
    Some(format!(
        "pod {} refuses the operator's credentials ({}): its system users were changed on the \
         server, so the operator cannot manage it; restart the pod (kubectl delete pod {}: the \
         server reloads the ACL file when it starts) or run ACL LOAD on it as a user allowed \
         to, and keep user rules from changing ACLs (-@admin)",
        m.pod,
        m.auth_refused.as_deref().unwrap_or_default(),
        m.pod
    ))
}

/// Why a ValkeyNode's pod cannot be created (its Ready condition, reason `PodCreationFailed`),
/// as the Degraded message.
pub fn pod_creation_failure(node: &ValkeyNode) -> Option<String> {
    let c = node.status.as_ref()?.conditions.iter().find(|c| {
        c.type_ == valkey_api::status::node_condition::READY
            && c.reason == valkey_api::status::node_reason::POD_CREATION_FAILED
    })?;
    Some(format!(
        "{}ValkeyNode {}: {}",
        crate::status::POD_CREATION_FAILED_PREFIX,
        node.name_any(),
        c.message
            .strip_prefix("the pod cannot be created: ")
            .unwrap_or(&c.message)
    ))
}

/// The scheduler's message for a pod it cannot place (`PodScheduled=False`, `Unschedulable`).
pub fn unschedulable_message(pod: &Pod) -> Option<String> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    (c.reason.as_deref() == Some("Unschedulable")).then(|| {
        format!(
            "pod {}: {}",
            pod.name_any(),
            c.message.as_deref().unwrap_or("cannot be scheduled")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_reads_its_password_and_tls_secrets_only() {
        let spec: valkey_api::ValkeyClusterSpec = serde_json::from_value(serde_json::json!({
            "shards": 1,
            "users": [{"name": "app", "passwordSecret": {"name": "app-pw", "keys": ["password"]},
                       "permissions": "+@all ~*"}],
            "networking": {"tls": {"certificate": {"secretName": "certs"}}},
        }))
        .expect("spec");
        assert!(reads_secret(&spec, "app-pw"));
        assert!(reads_secret(&spec, "certs"));
        assert!(!reads_secret(&spec, "someone-else"));
    }

    #[test]
    fn unready_lists_layout_pods_whose_probe_has_not_passed() {
        let pod = |name: &str, shard: i32, index: i32, ready: &str, deleting: bool| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": name,
                    "labels": {labels::SHARD_INDEX: shard.to_string(),
                               labels::NODE_INDEX: index.to_string()},
                    "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
                },
                "status": {"phase": "Running",
                           "conditions": [{"type": "Ready", "status": ready}]},
            }))
            .expect("pod")
        };
        let pods = [
            pod("c-0-1", 0, 1, "False", false),
            pod("c-0-0", 0, 0, "True", false),
            pod("c-1-0", 1, 0, "True", true),
            // Outside the layout (being removed): not the cluster's readiness.
            pod("c-2-0", 2, 0, "False", false),
        ];
        let layout = Layout {
            shards: 2,
            replicas: 1,
        };
        assert_eq!(unready(&pods, layout), ["c-0-1", "c-1-0"]);
    }
}
