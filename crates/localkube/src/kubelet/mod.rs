//! The kubelet ("podlet") of localkube: for every pod bound to one of
//! localkube's fake nodes it does what a kubelet and a container runtime
//! would, with real processes ([`crate::runtime`]).
//!
//! Entry point: [`Kubelets::start`]`(`[`KubeletConfig`]`)` — called by
//! [`crate::Env`] once the control plane is ready. It
//!
//! - registers one Node per [`NodeSpec`] (labels, taints, capacity,
//!   addresses, Ready/pressure conditions) and keeps it alive with status
//!   heartbeats and Lease renewals in `kube-node-lease` (every 10 s);
//! - watches the pods bound to each node and runs each in a sandbox
//!   (network namespace + IP): volumes, init containers, containers, probes,
//!   restarts with back-off, graceful deletion, status reporting;
//! - creates the default StorageClass ([`storage::STORAGE_PROVISIONER`]) and
//!   runs its directory-backed provisioner, reclaimer and resizer.
//!
//! [`Kubelets::faults`] returns [`Faults`], the fault-injection handle for
//! tests; [`Kubelets::shutdown`] kills every pod (SIGKILL) and removes all
//! sandboxes.
//!
//! Module map: `node` registration/heartbeats/leases, `pods` (pod
//! workers, status reporting), `containers` (supervisors: start, hooks,
//! restarts, termination), [`probes`], [`volumes`] (+ [`atomic_writer`]),
//! [`envvars`] (+ [`expand`], [`fieldpath`], [`quantity`]), [`status`]
//! (pure status computation), [`backoff`], [`objects`] (ConfigMap/Secret
//! caches), [`storage`], `events`, [`server`] (+ [`exec`], [`portforward`],
//! [`spdy`]).
//!
//! The kubelet API ([`server`]) serves `kubectl logs` (`-p`, `-f`, `--tail`,
//! `--limit-bytes`; output also in
//! `<state_dir>/pods/<uid>/logs/<container>/<restart>.log`), `kubectl exec`
//! ([`exec`]: stdout, stderr, stdin, exit code; no terminal for `-t`) and
//! `kubectl port-forward` ([`portforward`]), both over hand-written SPDY/3.1
//! framing ([`spdy`]).
//!
//! `securityContext` ([`security`]): `runAsUser`, `runAsGroup`,
//! `supplementalGroups` and `fsGroup` (group ownership of emptyDir,
//! projected and claim volumes) set the identity of the container's
//! processes, its exec probes, hooks and `kubectl exec`; `runAsNonRoot`
//! refuses a root user with the kubelet's `CreateContainerConfigError`.
//! `emptyDir.medium: Memory` is a tmpfs (`sizeLimit`, else the pod's memory
//! limit), unmounted at teardown.
//!
//! Not emulated (honest limits): `kubectl attach` and the kubelet's metrics
//! endpoints; no
//! kube-proxy (Service ClusterIPs do not route) and no cluster DNS, so
//! service links env vars are not injected; no cgroups (resource requests
//! and limits are reported to the downward API but not enforced, no
//! OOMKilled); no PID or user namespaces; of `securityContext`,
//! capabilities, `privileged`, `allowPrivilegeEscalation`, seccomp, AppArmor
//! and SELinux are ignored (a non-root user has no capabilities, root has
//! all; `readOnlyRootFilesystem` is enforced);
//! no `terminationMessagePath` file (`FallbackToLogsOnError` uses the log
//! tail); TLS gRPC probes are reported as failures; no image pulls (images
//! resolve through the image table);
//! ephemeral containers, in-place resize, static pods, eviction under
//! pressure and volume types other than emptyDir, hostPath, configMap,
//! secret, downwardAPI, projected and persistentVolumeClaim are not
//! supported (the pod waits with `FailedMount`).

pub mod atomic_writer;
pub mod backoff;
mod containers;
pub mod envvars;
mod events;
pub mod exec;
pub mod expand;
pub mod fieldpath;
mod node;
pub mod objects;
mod pod_shared;
mod pods;
pub mod portforward;
pub mod probes;
pub mod quantity;
pub mod security;
pub mod server;
pub mod spdy;
pub mod status;
pub mod storage;
pub mod volumes;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Taint;
use kube::Client;
use tokio::task::JoinHandle;

use crate::runtime::Signal;
use crate::runtime::images::ImageTable;
use crate::runtime::network::Network;

pub use pods::PodHandle;

/// One fake node.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Node name (also `kubernetes.io/hostname`).
    pub name: String,
    /// `topology.kubernetes.io/zone`.
    pub zone: String,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Capacity/allocatable CPU (a quantity, e.g. `"4"`).
    pub cpu: String,
    /// Capacity/allocatable memory (e.g. `"8Gi"`).
    pub memory: String,
    /// Maximum number of pods.
    pub pods: u32,
}

/// Configuration of the kubelets.
#[derive(Clone)]
pub struct KubeletConfig {
    /// Admin client.
    pub client: Client,
    /// The nodes to run.
    pub nodes: Vec<NodeSpec>,
    /// Where pod directories, logs and volumes live.
    pub state_dir: PathBuf,
    /// The pod network (bridge + IPAM).
    pub network: Arc<Network>,
    /// Image → executables table.
    pub images: ImageTable,
    /// Address of the API server as seen from pods (`KUBERNETES_SERVICE_HOST`).
    pub api_host: String,
    /// Port of the API server (`KUBERNETES_SERVICE_PORT`).
    pub api_port: u16,
    /// Name of the default StorageClass (usually `standard`).
    pub storage_class: String,
    /// Serve the kubelet API (`kubectl logs`) with these certificates; `None`: no server.
    pub tls: Option<server::KubeletTls>,
}

/// State shared by every task of the kubelets.
pub(crate) struct Shared {
    pub client: Client,
    pub state_dir: PathBuf,
    pub network: Arc<Network>,
    pub images: ImageTable,
    pub service_env: BTreeMap<String, String>,
    pub host_ip: String,
    pub objects: objects::Objects,
    pub events: events::Events,
    pub nodes: BTreeMap<String, NodeSpec>,
    /// Per node: the port of its kubelet API on `host_ip`.
    pub kubelet_ports: BTreeMap<String, u16>,
    /// Per node: allocatable resources as quantities.
    pub allocatable: BTreeMap<String, BTreeMap<String, String>>,
    /// Pod workers by pod uid.
    pub pods: Mutex<HashMap<String, PodHandle>>,
    /// Per node: heartbeat and pod-watch tasks while the node runs.
    pub node_tasks: Mutex<HashMap<String, Vec<JoinHandle<()>>>>,
}

impl Shared {
    pub(crate) fn lock_pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, PodHandle>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_node_tasks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<JoinHandle<()>>>> {
        self.node_tasks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The running kubelets of all nodes.
pub struct Kubelets {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Kubelets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelets")
            .field("nodes", &self.shared.nodes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Kubelets {
    /// Registers the nodes, starts their heartbeats and pod workers, and the
    /// storage provisioner. Returns once every node is registered and Ready.
    pub async fn start(cfg: KubeletConfig) -> anyhow::Result<Kubelets> {
        std::fs::create_dir_all(cfg.state_dir.join("pods"))
            .with_context(|| format!("create {}", cfg.state_dir.display()))?;
        let (objects, mut tasks) = objects::Objects::start(&cfg.client).await?;
        let host_ip = cfg.network.gateway().to_string();
        // One kubelet API listener per node, bound before the nodes publish their ports.
        let mut listeners = Vec::new();
        if cfg.tls.is_some() {
            for n in &cfg.nodes {
                let l = tokio::net::TcpListener::bind((cfg.network.gateway(), 0))
                    .await
                    .context("bind the kubelet API")?;
                listeners.push((n.name.clone(), l));
            }
        }
        let kubelet_ports = listeners
            .iter()
            .map(|(n, l)| Ok((n.clone(), l.local_addr()?.port())))
            .collect::<std::io::Result<BTreeMap<_, _>>>()?;
        let allocatable = cfg
            .nodes
            .iter()
            .map(|n| (n.name.clone(), node::allocatable(n)))
            .collect();
        let shared = Arc::new(Shared {
            client: cfg.client.clone(),
            state_dir: cfg.state_dir.clone(),
            network: cfg.network.clone(),
            images: cfg.images.clone(),
            service_env: envvars::service_env(&cfg.api_host, cfg.api_port),
            host_ip,
            objects,
            events: events::Events::new(&cfg.client, cfg.nodes.iter().map(|n| &n.name)),
            nodes: cfg
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.clone()))
                .collect(),
            kubelet_ports,
            allocatable,
            pods: Mutex::new(HashMap::new()),
            node_tasks: Mutex::new(HashMap::new()),
        });
        if let Some(tls) = &cfg.tls {
            let tls = server::tls_config(tls)?;
            for (node, listener) in listeners {
                tasks.push(tokio::spawn(server::serve(
                    shared.clone(),
                    node,
                    listener,
                    tls.clone(),
                )));
            }
        }
        for n in &cfg.nodes {
            node::register(&shared, n).await?;
        }
        for n in &cfg.nodes {
            start_node_tasks(&shared, &n.name);
        }
        tasks.extend(
            storage::start(
                cfg.client.clone(),
                cfg.state_dir.join("volumes"),
                cfg.storage_class.clone(),
            )
            .await?,
        );
        Ok(Kubelets { shared, tasks })
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> Faults {
        Faults {
            shared: self.shared.clone(),
        }
    }

    /// Stops everything: SIGKILLs every container, removes every sandbox,
    /// stops heartbeats, watchers and the provisioner. No status is reported.
    pub async fn shutdown(self) {
        let nodes: Vec<String> = self.shared.nodes.keys().cloned().collect();
        for n in nodes {
            stop_node_tasks(&self.shared, &n);
        }
        let handles: Vec<PodHandle> = self.shared.lock_pods().drain().map(|(_, h)| h).collect();
        for h in handles {
            h.hard_stop(&self.shared).await;
        }
        for t in self.tasks {
            t.abort();
        }
    }
}

fn start_node_tasks(shared: &Arc<Shared>, node: &str) {
    let tasks = vec![
        tokio::spawn(node::heartbeat_loop(shared.clone(), node.to_string())),
        tokio::spawn(pods::watch_node_pods(shared.clone(), node.to_string())),
    ];
    if let Some(old) = shared.lock_node_tasks().insert(node.to_string(), tasks) {
        old.into_iter().for_each(|t| t.abort());
    }
}

fn stop_node_tasks(shared: &Arc<Shared>, node: &str) {
    if let Some(old) = shared.lock_node_tasks().remove(node) {
        old.into_iter().for_each(|t| t.abort());
    }
}

/// Fault injection for tests. Cheap to clone.
#[derive(Clone)]
pub struct Faults {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faults")
    }
}

impl Faults {
    /// Runs `f` on the handle of pod `ns/pod` (with the pods locked).
    fn with_pod<T>(
        &self,
        ns: &str,
        pod: &str,
        f: impl FnOnce(&PodHandle) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let pods = self.shared.lock_pods();
        let handle = pods
            .values()
            .find(|h| h.namespace == ns && h.name == pod)
            .with_context(|| format!("pod {ns}/{pod} does not run on a localkube node"))?;
        f(handle)
    }

    fn signal(&self, ns: &str, pod: &str, container: &str, sig: Signal) -> anyhow::Result<()> {
        self.with_pod(ns, pod, |handle| {
            let running = handle
                .running_container(container)
                .with_context(|| format!("container {container} of {ns}/{pod} is not running"))?;
            running.signal(sig)?;
            Ok(())
        })
    }

    /// Runs `argv` inside a running container (its namespaces, root and
    /// environment), as `kubectl exec` does, without going through the API server.
    pub async fn exec(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
        argv: &[&str],
        timeout: std::time::Duration,
    ) -> anyhow::Result<crate::runtime::ExecResult> {
        let (running, env) = self.with_pod(ns, pod, |handle| {
            handle
                .exec_target(container)
                .with_context(|| format!("container {container} of {ns}/{pod} is not running"))
        })?;
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        Ok(running.exec_in(&argv, &env, timeout).await?)
    }

    /// SIGKILLs a container's process, as a crash (the kubelet restarts it per restartPolicy).
    pub fn kill_container(&self, ns: &str, pod: &str, container: &str) -> anyhow::Result<()> {
        self.signal(ns, pod, container, Signal::SIGKILL)
    }

    /// SIGSTOPs a container's process.
    pub fn pause(&self, ns: &str, pod: &str, container: &str) -> anyhow::Result<()> {
        self.signal(ns, pod, container, Signal::SIGSTOP)
    }

    /// SIGCONTs a paused container's process.
    pub fn resume(&self, ns: &str, pod: &str, container: &str) -> anyhow::Result<()> {
        self.signal(ns, pod, container, Signal::SIGCONT)
    }

    fn set_link(&self, ns: &str, pod: &str, up: bool) -> anyhow::Result<()> {
        let sandbox = self.with_pod(ns, pod, |handle| {
            handle
                .sandbox()
                .with_context(|| format!("pod {ns}/{pod} has no sandbox"))
        })?;
        self.shared.network.set_link(&sandbox, up)?;
        Ok(())
    }

    /// Takes the pod's network link down (nothing reaches it, it reaches nothing).
    pub fn cut_network(&self, ns: &str, pod: &str) -> anyhow::Result<()> {
        self.set_link(ns, pod, false)
    }

    /// Brings the pod's network link back up.
    pub fn restore_network(&self, ns: &str, pod: &str) -> anyhow::Result<()> {
        self.set_link(ns, pod, true)
    }

    /// Stops a node as if it crashed: its pods' processes are killed, its
    /// heartbeats and lease renewals stop (the node lifecycle controller
    /// marks it NotReady), nothing is reported for its pods any more.
    pub async fn stop_node(&self, name: &str) -> anyhow::Result<()> {
        anyhow::ensure!(self.shared.nodes.contains_key(name), "unknown node {name}");
        stop_node_tasks(&self.shared, name);
        let handles: Vec<PodHandle> = {
            let mut pods = self.shared.lock_pods();
            let uids: Vec<String> = pods
                .iter()
                .filter(|(_, h)| h.node == name)
                .map(|(u, _)| u.clone())
                .collect();
            uids.iter().filter_map(|u| pods.remove(u)).collect()
        };
        for h in handles {
            h.hard_stop(&self.shared).await;
        }
        Ok(())
    }

    /// Starts a stopped node again: heartbeats resume and its pods are
    /// started afresh (new sandboxes, restarted containers).
    pub async fn start_node(&self, name: &str) -> anyhow::Result<()> {
        let spec = self
            .shared
            .nodes
            .get(name)
            .with_context(|| format!("unknown node {name}"))?
            .clone();
        node::register(&self.shared, &spec).await?;
        start_node_tasks(&self.shared, name);
        Ok(())
    }
}
