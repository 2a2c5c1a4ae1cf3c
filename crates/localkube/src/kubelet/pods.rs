//! Pod workers: one task per pod bound to a node, from sandbox creation to
//! the final deletion of the pod object, plus the per-node pod watch.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

use super::Shared;
use super::containers::{self, Supervisor};
use super::fieldpath::PodRuntimeInfo;
use super::pod_shared::PodShared;
use super::status::{self, ContainerRuntimeState, PodRuntimeState};
use super::volumes::{self, PreparedVolume, TokenCache, VolumeContext};
use crate::runtime::{RunningContainer, Sandbox, Signal, kill_netns_processes};

/// The kubelets' handle on one pod worker.
pub struct PodHandle {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) node: String,
    updates: watch::Sender<Pod>,
    shared: Arc<PodShared>,
    task: JoinHandle<()>,
}

impl PodHandle {
    /// The pod's runtime state now.
    pub(crate) fn snapshot(&self) -> super::status::PodRuntimeState {
        self.shared.snapshot()
    }

    pub(crate) fn running_container(&self, name: &str) -> Option<RunningContainer> {
        let st = self.shared.snapshot();
        st.containers
            .iter()
            .chain(st.init.iter())
            .find(|c| c.name == name)
            .and_then(|c| c.running.clone())
    }

    pub(crate) fn sandbox(&self) -> Option<Sandbox> {
        self.shared.sandbox()
    }

    /// The running process of a container and its environment.
    pub(crate) fn exec_target(
        &self,
        name: &str,
    ) -> Option<(RunningContainer, Vec<(String, String)>)> {
        let st = self.shared.snapshot();
        st.containers
            .iter()
            .chain(st.init.iter())
            .find(|c| c.name == name)
            .and_then(|c| c.running.clone().map(|r| (r, c.env.clone())))
    }

    /// Kills everything of the pod at once (node crash / shutdown): no
    /// hooks, no grace, no status.
    pub(crate) async fn hard_stop(self, shared: &Arc<Shared>) {
        self.task.abort();
        let _ = self.task.await;
        let st = self.shared.snapshot();
        for c in st.containers.iter().chain(st.init.iter()) {
            if let Some(r) = &c.running {
                let _ = r.signal(Signal::SIGKILL);
            }
        }
        for c in st.containers.iter().chain(st.init.iter()) {
            if let Some(r) = &c.running {
                let _ = tokio::time::timeout(Duration::from_secs(5), r.wait()).await;
            }
        }
        teardown_sandbox(shared, &self.shared).await;
        // A crashed node loses its memory-backed volumes (tmpfs); disk volumes stay.
        let volumes_dir = shared
            .state_dir
            .join("pods")
            .join(&self.shared.uid)
            .join("volumes");
        let _ = tokio::task::spawn_blocking(move || volumes::unmount_all(&volumes_dir)).await;
    }
}

async fn teardown_sandbox(shared: &Arc<Shared>, ps: &Arc<PodShared>) {
    let sandbox = ps.sandbox.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(sb) = sandbox {
        let network = shared.network.clone();
        let _ = tokio::task::spawn_blocking(move || {
            kill_netns_processes(&sb.netns);
            if let Err(e) = network.destroy_sandbox(&sb) {
                tracing::warn!(netns = sb.netns, error = %e, "destroying sandbox failed");
            }
        })
        .await;
    }
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Watches the pods bound to `node` and feeds the pod workers.
pub(crate) async fn watch_node_pods(shared: Arc<Shared>, node: String) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut stream = std::pin::pin!(watcher(api, cfg));
    let mut seen: HashSet<String> = HashSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => seen.clear(),
            Ok(watcher::Event::InitApply(pod)) => {
                seen.insert(pod.uid().unwrap_or_default());
                on_pod(&shared, &node, pod);
            }
            Ok(watcher::Event::InitDone) => {
                let gone: Vec<String> = shared
                    .lock_pods()
                    .iter()
                    .filter(|(uid, h)| h.node == node && !seen.contains(*uid))
                    .map(|(uid, _)| uid.clone())
                    .collect();
                for uid in gone {
                    on_pod_gone(&shared, &uid);
                }
            }
            Ok(watcher::Event::Apply(pod)) => on_pod(&shared, &node, pod),
            Ok(watcher::Event::Delete(pod)) => on_pod_gone(&shared, &pod.uid().unwrap_or_default()),
            Err(e) => {
                tracing::debug!(node, error = %e, "pod watch error (retrying)");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

fn on_pod(shared: &Arc<Shared>, node: &str, pod: Pod) {
    let Some(uid) = pod.uid() else { return };
    let mut pods = shared.lock_pods();
    if let Some(h) = pods.get(&uid) {
        h.updates.send_replace(pod);
        return;
    }
    if is_terminal(&pod) && pod.metadata.deletion_timestamp.is_none() {
        return;
    }
    let (tx, rx) = watch::channel(pod.clone());
    let ps = Arc::new(PodShared {
        state: Mutex::new(PodRuntimeState::default()),
        changed: Notify::new(),
        sandbox: Mutex::new(None),
        uid: uid.clone(),
        node: node.to_string(),
    });
    let task = tokio::spawn(run_worker(shared.clone(), ps.clone(), rx));
    pods.insert(
        uid,
        PodHandle {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            node: node.to_string(),
            updates: tx,
            shared: ps,
            task,
        },
    );
}

/// The pod object disappeared from the API (force deletion): kill at once.
fn on_pod_gone(shared: &Arc<Shared>, uid: &str) {
    let pods = shared.lock_pods();
    if let Some(h) = pods.get(uid) {
        h.updates.send_modify(|p| {
            if p.metadata.deletion_timestamp.is_none() {
                p.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
            }
            p.metadata.deletion_grace_period_seconds = Some(0);
            p.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(GONE_ANNOTATION.into(), "true".into());
        });
    }
}

/// Internal marker (never written to the API) for pods that no longer exist.
const GONE_ANNOTATION: &str = "localkube.io/internal-pod-gone";

fn is_gone(pod: &Pod) -> bool {
    pod.annotations().contains_key(GONE_ANNOTATION)
}

async fn run_worker(shared: Arc<Shared>, ps: Arc<PodShared>, rx: watch::Receiver<Pod>) {
    let uid = ps.uid.clone();
    let pod = rx.borrow().clone();
    let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    let mut tasks = JoinSet::new();
    tasks.spawn(status_loop(shared.clone(), ps.clone(), rx.clone()));
    worker(&shared, &ps, rx, &mut tasks).await;
    tasks.shutdown().await;
    shared.lock_pods().remove(&uid);
    tracing::debug!(pod = name, "pod worker finished");
}

/// Initial runtime state, continuing restart counts from an existing status
/// (a restarted node restarts the containers of its pods).
fn initial_state(shared: &Shared, pod: &Pod) -> PodRuntimeState {
    let spec = pod.spec.clone().unwrap_or_default();
    let old = pod.status.clone().unwrap_or_default();
    let has_init = spec.init_containers.as_ref().is_some_and(|i| !i.is_empty());
    let carry = |name: &str,
                 image: &str,
                 reason: &str,
                 old: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        let mut c = ContainerRuntimeState::new(name, image, reason);
        if let Some(o) = old.iter().flatten().find(|s| s.name == name) {
            c.restart_count = o.restart_count + i32::from(o.container_id.is_some());
            c.last_state = o
                .state
                .clone()
                .filter(|s| s.terminated.is_some())
                .or(o.last_state.clone());
        }
        c
    };
    PodRuntimeState {
        host_ip: shared.host_ip.clone(),
        start_time: Some(old.start_time.unwrap_or(Time(Timestamp::now()))),
        init: spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                carry(
                    &c.name,
                    c.image.as_deref().unwrap_or_default(),
                    "PodInitializing",
                    &old.init_container_statuses,
                )
            })
            .collect(),
        containers: spec
            .containers
            .iter()
            .map(|c| {
                carry(
                    &c.name,
                    c.image.as_deref().unwrap_or_default(),
                    // As the kubelet's default waiting state: PodInitializing in a pod with
                    // init containers.
                    if has_init {
                        "PodInitializing"
                    } else {
                        "ContainerCreating"
                    },
                    &old.container_statuses,
                )
            })
            .collect(),
        initialized: spec.init_containers.as_ref().is_none_or(|i| i.is_empty()),
        ..Default::default()
    }
}

async fn wait_deleted(mut rx: watch::Receiver<Pod>) {
    let _ = rx
        .wait_for(|p| p.metadata.deletion_timestamp.is_some())
        .await;
}

async fn worker(
    shared: &Arc<Shared>,
    ps: &Arc<PodShared>,
    rx: watch::Receiver<Pod>,
    tasks: &mut JoinSet<()>,
) {
    let pod = rx.borrow().clone();
    {
        let init = initial_state(shared, &pod);
        ps.with_state(|st| *st = init);
    }
    let pod_dir = shared.state_dir.join("pods").join(&ps.uid);
    let mut supervisors: Vec<(watch::Sender<bool>, Task)> = Vec::new();

    let sandbox = if is_terminal(&pod) || pod.metadata.deletion_timestamp.is_some() {
        None
    } else {
        create_sandbox(shared, ps, &rx).await
    };
    if let Some(net) = sandbox {
        let started = tokio::select! {
            biased;
            _ = wait_deleted(rx.clone()) => false,
            r = start_pod(shared, ps, &rx, net, &pod_dir, tasks, &mut supervisors) => r,
        };
        if started {
            // Run until deleted or every container is done for good.
            let all_done = async {
                while supervisors.iter().any(|(_, h)| !h.is_finished()) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            };
            tokio::select! {
                _ = all_done => {
                    // Terminal pod: keep reporting until it is deleted.
                    wait_deleted(rx.clone()).await;
                }
                _ = wait_deleted(rx.clone()) => {}
            }
        } else if rx.borrow().metadata.deletion_timestamp.is_none() {
            // Init failed for good (restartPolicy Never): wait for deletion.
            wait_deleted(rx.clone()).await;
        }
    } else {
        wait_deleted(rx.clone()).await;
    }

    // Termination: stop every container gracefully.
    for (stop, _) in &supervisors {
        let _ = stop.send(true);
    }
    let deadline = Duration::from_secs(3600);
    for (_, mut h) in supervisors {
        if !h.is_finished() {
            let _ = tokio::time::timeout(deadline, &mut h.0).await;
        }
    }
    teardown_sandbox(shared, ps).await;
    ps.with_state(|st| {
        st.sandbox_ready = false;
    });
    // Memory-backed emptyDirs are tmpfs mounts: unmount them before removing the directory.
    let volumes_dir = pod_dir.join("volumes");
    let _ = tokio::task::spawn_blocking(move || {
        volumes::unmount_all(&volumes_dir);
        let _ = std::fs::remove_dir_all(&volumes_dir);
    })
    .await;
    let pod = rx.borrow().clone();
    if is_gone(&pod) {
        return;
    }
    // Final status, then remove the object as the kubelet does.
    flush_status(shared, ps, &pod).await;
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    for attempt in 0..10 {
        match api.delete(&pod.name_any(), &dp).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => break,
            Err(e) => {
                tracing::warn!(pod = pod.name_any(), attempt, error = %e, "deleting pod failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// A spawned task that is aborted when dropped (so aborting a pod worker
/// also stops its container supervisors).
pub(crate) struct Task(pub JoinHandle<()>);

impl Task {
    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where a pod's containers run.
enum PodNet {
    /// Their own network namespace.
    Sandbox(Sandbox),
    /// The host's network (`hostNetwork: true`); pod IP = node IP.
    Host,
}

/// Creates the pod's sandbox, retrying until it works or the pod is deleted.
/// Not raced against deletion, so a sandbox is never created and forgotten.
async fn create_sandbox(
    shared: &Arc<Shared>,
    ps: &Arc<PodShared>,
    rx: &watch::Receiver<Pod>,
) -> Option<PodNet> {
    loop {
        let pod = rx.borrow().clone();
        if pod.metadata.deletion_timestamp.is_some() {
            return None;
        }
        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            return Some(PodNet::Host);
        }
        let network = shared.network.clone();
        let id = ps
            .uid
            .chars()
            .filter(|c| *c != '-')
            .take(12)
            .collect::<String>();
        match tokio::task::spawn_blocking(move || network.create_sandbox(&id)).await {
            Ok(Ok(sb)) => {
                *ps.sandbox.lock().unwrap_or_else(|e| e.into_inner()) = Some(sb.clone());
                return Some(PodNet::Sandbox(sb));
            }
            Ok(Err(e)) => {
                set_waiting_all(
                    ps,
                    "ContainerCreating",
                    Some(format!("failed to create pod sandbox: {e}")),
                );
                tracing::warn!(pod = pod.name_any(), error = %e, "sandbox creation failed");
                shared.events.emit(
                    &ps.node,
                    &pod,
                    None,
                    true,
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {e}"),
                );
            }
            Err(e) => tracing::warn!(error = %e, "sandbox task failed"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Volumes, init containers, then the container supervisors.
/// Returns `false` if the pod cannot proceed (init failure with restartPolicy Never).
async fn start_pod(
    shared: &Arc<Shared>,
    ps: &Arc<PodShared>,
    rx: &watch::Receiver<Pod>,
    net: PodNet,
    pod_dir: &std::path::Path,
    tasks: &mut JoinSet<()>,
    supervisors: &mut Vec<(watch::Sender<bool>, Task)>,
) -> bool {
    let pod = rx.borrow().clone();
    let (pod_ip, netns_path) = match &net {
        PodNet::Sandbox(sb) => (sb.ip.to_string(), Some(sb.netns_path.clone())),
        PodNet::Host => (shared.host_ip.clone(), None),
    };
    ps.with_state(|st| {
        st.pod_ips = vec![pod_ip.clone()];
        st.sandbox_ready = true;
    });
    let info = PodRuntimeInfo {
        pod_ips: vec![pod_ip.clone()],
        host_ip: shared.host_ip.clone(),
    };
    let allocatable = shared
        .allocatable
        .get(&ps.node)
        .cloned()
        .unwrap_or_default();

    // 2. Volumes.
    let mut tokens = TokenCache::default();
    let prepared: BTreeMap<String, PreparedVolume> = loop {
        let pod = rx.borrow().clone();
        let ctx = VolumeContext {
            client: &shared.client,
            objects: &shared.objects,
            allocatable: &allocatable,
            info: &info,
            setup: true,
        };
        match volumes::prepare(&pod, pod_dir, &ctx, &mut tokens).await {
            Ok(v) => break v,
            Err(e) => {
                tracing::info!(pod = pod.name_any(), error = %e, "FailedMount");
                shared.events.emit(
                    &ps.node,
                    &pod,
                    None,
                    true,
                    "FailedMount",
                    format!("MountVolume.SetUp failed: {e}"),
                );
                set_waiting_all(
                    ps,
                    "ContainerCreating",
                    Some(format!("MountVolume.SetUp failed: {e}")),
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    tasks.spawn(refresh_volumes(
        shared.clone(),
        rx.clone(),
        pod_dir.to_path_buf(),
        info.clone(),
        allocatable.clone(),
        tokens,
    ));
    let prepared = Arc::new(prepared);
    let base = Supervisor {
        shared: shared.clone(),
        pod: ps.clone(),
        rx: rx.clone(),
        init: false,
        index: 0,
        volumes: prepared.clone(),
        pod_dir: pod_dir.to_path_buf(),
        netns_path,
        info: info.clone(),
    };

    // 3. Init containers, in order.
    let spec = pod.spec.clone().unwrap_or_default();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let (stop_tx, stop_rx) = watch::channel(false);
        let sup = Supervisor {
            init: true,
            index: i,
            ..base.clone()
        };
        if c.restart_policy.as_deref() == Some("Always") {
            // Sidecar: keeps running; the next init container starts once it has started.
            let handle = tokio::spawn(containers::supervise(sup, stop_rx));
            supervisors.push((stop_tx, Task(handle)));
            loop {
                let started = ps
                    .snapshot()
                    .init
                    .get(i)
                    .is_some_and(|s| s.started && s.is_running());
                if started {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } else {
            let outcome = containers::supervise_init(sup, stop_rx).await;
            if !outcome {
                ps.with_state(|st| st.init_failed = true);
                return false;
            }
        }
    }
    ps.with_state(|st| st.initialized = true);

    // 4. Containers.
    for i in 0..spec.containers.len() {
        let (stop_tx, stop_rx) = watch::channel(false);
        let sup = Supervisor {
            init: false,
            index: i,
            ..base.clone()
        };
        supervisors.push((
            stop_tx,
            Task(tokio::spawn(containers::supervise(sup, stop_rx))),
        ));
    }
    true
}

fn set_waiting_all(ps: &PodShared, reason: &str, message: Option<String>) {
    ps.with_state(|st| {
        for c in st.containers.iter_mut().chain(st.init.iter_mut()) {
            if c.state.running.is_none() && c.state.terminated.is_none() {
                c.state = status::waiting(reason, message.clone());
            }
        }
    });
}

/// Re-projects ConfigMap/Secret/downwardAPI/projected volumes when their
/// sources change (and every minute, for token rotation).
async fn refresh_volumes(
    shared: Arc<Shared>,
    mut rx: watch::Receiver<Pod>,
    pod_dir: PathBuf,
    info: PodRuntimeInfo,
    allocatable: BTreeMap<String, String>,
    mut tokens: TokenCache,
) {
    let mut changes = shared.objects.subscribe();
    // Pod updates matter only through the downward API (labels, annotations)
    // or deletion; status updates are ignored.
    let meta_of = |p: &Pod| {
        (
            p.metadata.labels.clone(),
            p.metadata.annotations.clone(),
            p.metadata.deletion_timestamp.is_some(),
        )
    };
    let mut last_meta = meta_of(&rx.borrow());
    loop {
        tokio::select! {
            r = changes.recv() => {
                let ns = rx.borrow().namespace().unwrap_or_default();
                match r {
                    Ok((cns, _)) if cns != ns => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    _ => {}
                }
            }
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
                let meta = meta_of(&rx.borrow());
                if meta == last_meta {
                    continue;
                }
                last_meta = meta;
            }
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        let pod = rx.borrow().clone();
        if pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        let ctx = VolumeContext {
            client: &shared.client,
            objects: &shared.objects,
            allocatable: &allocatable,
            info: &info,
            setup: false,
        };
        if let Err(e) = volumes::prepare(&pod, &pod_dir, &ctx, &mut tokens).await {
            tracing::debug!(pod = pod.name_any(), error = %e, "volume refresh failed");
        }
    }
}

/// Patches the pod status whenever the runtime state changes.
async fn status_loop(shared: Arc<Shared>, ps: Arc<PodShared>, mut rx: watch::Receiver<Pod>) {
    let mut last: Option<serde_json::Value> = None;
    loop {
        tokio::select! {
            _ = ps.changed.notified() => {}
            r = rx.changed() => { if r.is_err() { return; } }
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
        let pod = rx.borrow().clone();
        if is_gone(&pod) {
            return;
        }
        if let Some(v) = patch_if_changed(&shared, &ps, &pod, last.as_ref()).await {
            last = Some(v);
        }
    }
}

async fn flush_status(shared: &Arc<Shared>, ps: &Arc<PodShared>, pod: &Pod) {
    let _ = patch_if_changed(shared, ps, pod, None).await;
}

/// Computes the status; patches it if it differs from `last`. Returns what was sent.
async fn patch_if_changed(
    shared: &Arc<Shared>,
    ps: &Arc<PodShared>,
    pod: &Pod,
    last: Option<&serde_json::Value>,
) -> Option<serde_json::Value> {
    let st = ps.snapshot();
    // Transition times come from what we sent last (the watch may lag).
    let mut base = pod.clone();
    if let Some(prev) = last.and_then(|l| {
        serde_json::from_value::<k8s_openapi::api::core::v1::PodStatus>(l.clone()).ok()
    }) {
        let mut status = base.status.clone().unwrap_or_default();
        let theirs: Vec<_> = status
            .conditions
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !prev.conditions.iter().flatten().any(|p| p.type_ == c.type_))
            .collect();
        let mut conds = prev.conditions.clone().unwrap_or_default();
        conds.extend(theirs);
        status.conditions = Some(conds);
        if status.phase.is_none() || !is_terminal(&base) {
            status.phase = prev.phase.clone();
        }
        base.status = Some(status);
    }
    let computed = status::compute(&base, &st, &Time(Timestamp::now()));
    let value = serde_json::to_value(&computed).ok()?;
    if last == Some(&value) {
        return None;
    }
    let api: Api<Pod> =
        Api::namespaced(shared.client.clone(), &pod.namespace().unwrap_or_default());
    match api
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": value})),
        )
        .await
    {
        Ok(_) => Some(value),
        Err(e) => {
            tracing::debug!(pod = pod.name_any(), error = %e, "status patch failed");
            None
        }
    }
}
