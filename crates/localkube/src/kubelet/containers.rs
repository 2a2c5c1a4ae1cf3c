//! Container supervisors: create a container from its spec and image, run
//! hooks and probes, record its states and restart it per restartPolicy
//! with the kubelet's back-off; stop it gracefully on pod deletion.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, LifecycleHandler, Pod, Probe,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::sync::{mpsc, watch};

use super::Shared;
use super::backoff::Backoff;
use super::envvars::{container_env, expand_command};
use super::fieldpath::PodRuntimeInfo;
use super::pod_shared::{PodShared, terminated_state};
use super::probes::{ProbeResult, ProbeTiming, Thresholds, probe_once};
use super::status::{ContainerRuntimeState, waiting};
use super::volumes::{PreparedVolume, container_mounts};
use crate::runtime::{ContainerSpec, ExitStatus, RunningContainer, Signal, spawn};

/// Everything a container supervisor needs.
#[derive(Clone)]
pub(crate) struct Supervisor {
    pub shared: Arc<Shared>,
    pub pod: Arc<PodShared>,
    pub rx: watch::Receiver<Pod>,
    pub init: bool,
    pub index: usize,
    pub volumes: Arc<BTreeMap<String, PreparedVolume>>,
    pub pod_dir: PathBuf,
    pub netns_path: Option<PathBuf>,
    pub info: PodRuntimeInfo,
}

enum Outcome {
    /// The process ended.
    Exited(ExitStatus),
    /// Stopped because the pod is being deleted.
    Stopped,
    /// Could not be started (waiting reason already recorded).
    NotStarted { image_pull: bool },
}

impl Supervisor {
    fn pod(&self) -> Pod {
        self.rx.borrow().clone()
    }

    fn container(&self) -> Option<Container> {
        let spec = self.rx.borrow().spec.clone()?;
        if self.init {
            spec.init_containers?.get(self.index).cloned()
        } else {
            spec.containers.get(self.index).cloned()
        }
    }

    fn update(&self, f: impl FnOnce(&mut ContainerRuntimeState)) {
        let (init, index) = (self.init, self.index);
        self.pod.with_state(|st| {
            let list = if init {
                &mut st.init
            } else {
                &mut st.containers
            };
            if let Some(c) = list.get_mut(index) {
                f(c);
            }
        });
    }

    fn current(&self) -> Option<ContainerRuntimeState> {
        let st = self.pod.snapshot();
        let list = if self.init { st.init } else { st.containers };
        list.into_iter().nth(self.index)
    }

    fn event(&self, warning: bool, reason: &str, note: String) {
        let name = self.container().map(|c| c.name);
        self.shared.events.emit(
            &self.pod.node,
            &self.pod(),
            name.as_deref(),
            warning,
            reason,
            note,
        );
    }

    fn is_sidecar(&self) -> bool {
        self.init
            && self
                .container()
                .is_some_and(|c| c.restart_policy.as_deref() == Some("Always"))
    }

    fn restart_policy(&self) -> String {
        if self.is_sidecar() {
            return "Always".into();
        }
        self.pod()
            .spec
            .and_then(|s| s.restart_policy)
            .unwrap_or_else(|| "Always".into())
    }
}

fn termination_grace(pod: &Pod, probe: Option<&Probe>) -> Duration {
    let secs = probe
        .and_then(|p| p.termination_grace_period_seconds)
        .or(pod.metadata.deletion_grace_period_seconds)
        .or(pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}

fn hostname(pod: &Pod) -> Option<String> {
    if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
        // Host-network pods share the host's UTS namespace.
        return None;
    }
    let name = pod
        .spec
        .as_ref()
        .and_then(|s| s.hostname.clone())
        .unwrap_or_else(|| pod.name_any());
    let h: String = name.chars().take(63).collect();
    let h = h.trim_end_matches(['-', '.']).to_string();
    (!h.is_empty()
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'))
    .then_some(h)
}

async fn run_hook(
    hook: &LifecycleHandler,
    container: &Container,
    running: &RunningContainer,
    env: &[(String, String)],
    pod_ip: &str,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(exec) = &hook.exec {
        let argv = exec.command.clone().unwrap_or_default();
        return match running.exec_in(&argv, env, timeout).await {
            Ok(r) if r.exit_code == 0 => Ok(()),
            Ok(r) => Err(format!(
                "command {argv:?} exited with {}: {}",
                r.exit_code,
                r.output.trim()
            )),
            Err(e) => Err(e.to_string()),
        };
    }
    if let Some(sleep) = &hook.sleep {
        tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64).min(timeout)).await;
        return Ok(());
    }
    if let Some(http) = &hook.http_get {
        let probe = Probe {
            http_get: Some(http.clone()),
            timeout_seconds: Some(timeout.as_secs().max(1) as i32),
            ..Default::default()
        };
        return match probe_once(&probe, container, running, env, pod_ip).await {
            ProbeResult::Success => Ok(()),
            ProbeResult::Failure(e) => Err(e),
        };
    }
    Ok(())
}

/// preStop hook, SIGTERM, grace period, SIGKILL; returns the exit status.
async fn terminate(
    running: &RunningContainer,
    container: &Container,
    env: &[(String, String)],
    pod_ip: &str,
    grace: Duration,
) -> ExitStatus {
    let deadline = Instant::now() + grace;
    if let Some(pre_stop) = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        && running.try_status().is_none()
        && let Err(e) = run_hook(pre_stop, container, running, env, pod_ip, grace).await
    {
        tracing::info!(container = container.name, error = %e, "FailedPreStopHook");
    }
    let _ = running.signal(Signal::SIGTERM);
    // A stopped (paused) process must run to handle SIGTERM.
    let _ = running.signal(Signal::SIGCONT);
    let remaining = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(remaining, running.wait()).await {
        Ok(status) => status,
        Err(_) => {
            let _ = running.signal(Signal::SIGKILL);
            running.wait().await
        }
    }
}

/// The full environment of the process: the image's, then the container's.
fn process_env(
    image_env: &[(String, String)],
    env: &[(String, String)],
    hostname: Option<&str>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let defined: std::collections::HashSet<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    for (k, v) in image_env {
        if !defined.contains(k.as_str()) {
            out.push((k.clone(), v.clone()));
        }
    }
    if let Some(h) = hostname
        && !defined.contains("HOSTNAME")
    {
        out.push(("HOSTNAME".into(), h.to_string()));
    }
    out.extend(env.iter().cloned());
    out
}

async fn run_once(
    sup: &Supervisor,
    stop: &mut watch::Receiver<bool>,
    spawned_before: bool,
) -> Outcome {
    let Some(c) = sup.container() else {
        return Outcome::Stopped;
    };
    let pod = sup.pod();
    let image_name = c.image.clone().unwrap_or_default();
    let image = match sup.shared.images.resolve(&image_name) {
        Ok(i) => i,
        Err(e) => {
            let reason = if sup.current().is_some_and(|s| {
                s.state.waiting.as_ref().and_then(|w| w.reason.as_deref()) == Some("ErrImagePull")
            }) {
                "ImagePullBackOff"
            } else {
                "ErrImagePull"
            };
            let msg = if reason == "ErrImagePull" {
                format!("failed to pull image {image_name:?}: {e}")
            } else {
                format!("Back-off pulling image {image_name:?}: {e}")
            };
            if reason == "ErrImagePull" {
                sup.event(
                    true,
                    "Failed",
                    format!("Failed to pull image {image_name:?}: {e}"),
                );
                sup.event(true, "Failed", "Error: ErrImagePull".into());
            } else {
                sup.event(
                    false,
                    "BackOff",
                    format!("Back-off pulling image {image_name:?}"),
                );
                sup.event(true, "Failed", "Error: ImagePullBackOff".into());
            }
            sup.update(|s| s.state = waiting(reason, Some(msg)));
            return Outcome::NotStarted { image_pull: true };
        }
    };
    let ns = pod.namespace().unwrap_or_default();
    let allocatable = sup
        .shared
        .allocatable
        .get(&sup.pod.node)
        .cloned()
        .unwrap_or_default();
    let env = match container_env(
        &pod,
        &c,
        &sup.info,
        &sup.shared.objects.in_namespace(&ns),
        &sup.shared.service_env,
        &allocatable,
    ) {
        Ok(e) => e,
        Err(e) => {
            sup.event(true, "Failed", format!("Error: {e}"));
            sup.update(|s| s.state = waiting("CreateContainerConfigError", Some(e.to_string())));
            return Outcome::NotStarted { image_pull: false };
        }
    };
    sup.event(
        false,
        "Pulled",
        format!("Container image {image_name:?} already present on machine"),
    );
    let (command, args) = expand_command(&c, &env);
    let argv = image.argv(&command, &args);
    if argv.is_empty() {
        sup.update(|s| {
            s.state = waiting("CreateContainerError", Some("no command specified".into()))
        });
        return Outcome::NotStarted { image_pull: false };
    }
    let host = hostname(&pod);
    let full_env = process_env(&image.env, &env, host.as_deref());
    let mounts = match container_mounts(&c, &sup.volumes, &full_env) {
        Ok(m) => m,
        Err(e) => {
            sup.update(|s| s.state = waiting("CreateContainerConfigError", Some(e.to_string())));
            return Outcome::NotStarted { image_pull: false };
        }
    };
    let user = match super::security::process_user(&pod, &c, image.user) {
        Ok(u) => u,
        Err(e) => {
            sup.event(true, "Failed", format!("Error: {e}"));
            sup.update(|s| s.state = waiting("CreateContainerConfigError", Some(e)));
            return Outcome::NotStarted { image_pull: false };
        }
    };
    let restart = sup.current().map(|s| s.restart_count).unwrap_or(0) + i32::from(spawned_before);
    let short_uid: String = sup.pod.uid.chars().filter(|c| *c != '-').take(12).collect();
    let id = format!("{short_uid}-{}-{restart}", c.name);
    let state_dir = sup
        .pod_dir
        .join("containers")
        .join(format!("{}-{restart}", c.name));
    let spec = ContainerSpec {
        id: id.clone(),
        argv,
        env: full_env.clone(),
        working_dir: c
            .working_dir
            .clone()
            .filter(|w| !w.is_empty())
            .map(PathBuf::from)
            .or(image.working_dir.clone()),
        mounts,
        netns_path: sup.netns_path.clone(),
        hostname: host,
        state_dir: state_dir.clone(),
        log_path: sup
            .pod_dir
            .join("logs")
            .join(&c.name)
            .join(format!("{restart}.log")),
        user,
        read_only_root: c
            .security_context
            .as_ref()
            .and_then(|s| s.read_only_root_filesystem)
            == Some(true),
    };
    if let Some(parent) = spec.log_path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let log_path = spec.log_path.clone();
    let running = match spawn(&spec) {
        Ok(r) => r,
        Err(e) => {
            sup.event(true, "Failed", format!("Error: {e}"));
            sup.update(|s| s.state = waiting("RunContainerError", Some(e.to_string())));
            return Outcome::NotStarted { image_pull: false };
        }
    };
    sup.event(false, "Created", format!("Created container: {}", c.name));
    sup.event(false, "Started", format!("Started container {}", c.name));
    let container_id = format!("localkube://{id}");
    let started_at = Time(Timestamp::now());
    let has_startup = c.startup_probe.is_some();
    let probes_apply = !sup.init || sup.is_sidecar();
    let has_readiness = c.readiness_probe.is_some() && probes_apply;
    sup.update(|s| {
        if spawned_before {
            s.restart_count += 1;
        }
        if s.state.terminated.is_some() {
            s.last_state = Some(std::mem::take(&mut s.state));
        }
        s.state = ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(started_at.clone()),
            }),
            ..Default::default()
        };
        s.container_id = Some(container_id.clone());
        s.image_id = format!("localkube://{}", image.entry);
        s.running = Some(running.clone());
        s.env = full_env.clone();
        s.started = !(has_startup && probes_apply);
        s.ready = s.started && !has_readiness && !sup.init;
        if sup.is_sidecar() {
            s.ready = s.started && !has_readiness;
        }
    });
    let pod_ip = sup.info.pod_ips.first().cloned().unwrap_or_default();

    // postStart hook: the container counts as started only once it returns.
    if let Some(post_start) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())
        && let Err(e) = run_hook(
            post_start,
            &c,
            &running,
            &full_env,
            &pod_ip,
            termination_grace(&pod, None),
        )
        .await
    {
        tracing::info!(container = c.name, error = %e, "FailedPostStartHook");
        sup.event(true, "FailedPostStartHook", e.clone());
        let status = terminate(
            &running,
            &c,
            &full_env,
            &pod_ip,
            termination_grace(&pod, None),
        )
        .await;
        let message = fallback_message(&c, &status, &log_path);
        record_exit(sup, status, &started_at, &container_id, &state_dir, message);
        return Outcome::Exited(status);
    }

    let (kill_tx, mut kill_rx) = mpsc::channel::<(String, Option<Probe>)>(1);
    let probe_task = probes_apply.then(|| {
        super::pods::Task(tokio::spawn(probe_loop(
            sup.clone(),
            c.clone(),
            running.clone(),
            full_env.clone(),
            kill_tx,
        )))
    });
    let mut stopped = false;
    let status = tokio::select! {
        s = running.wait() => s,
        Some((reason, probe)) = kill_rx.recv() => {
            tracing::info!(container = c.name, reason, "killing container");
            let what = if reason.starts_with("Startup") { "startup" } else { "liveness" };
            sup.event(true, "Unhealthy", reason.clone());
            sup.event(
                false,
                "Killing",
                format!("Container {} failed {what} probe, will be restarted", c.name),
            );
            let grace = termination_grace(&sup.pod(), probe.as_ref());
            terminate(&running, &c, &full_env, &pod_ip, grace).await
        }
        _ = wait_stop(stop) => {
            stopped = true;
            sup.event(false, "Killing", format!("Stopping container {}", c.name));
            let grace = termination_grace(&sup.pod(), None);
            terminate(&running, &c, &full_env, &pod_ip, grace).await
        }
    };
    drop(probe_task);
    let message = fallback_message(&c, &status, &log_path);
    record_exit(sup, status, &started_at, &container_id, &state_dir, message);
    if stopped {
        Outcome::Stopped
    } else {
        Outcome::Exited(status)
    }
}

fn record_exit(
    sup: &Supervisor,
    status: ExitStatus,
    started_at: &Time,
    container_id: &str,
    state_dir: &std::path::Path,
    message: Option<String>,
) {
    sup.update(|s| {
        s.state = terminated_state(
            status.exit_code(),
            status.signal,
            Some(started_at.clone()),
            Some(container_id.to_string()),
            None,
        );
        if let Some(t) = s.state.terminated.as_mut() {
            t.message = message;
        }
        s.running = None;
        s.ready = false;
        s.started = false;
    });
    let dir = state_dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let _ = std::fs::remove_dir_all(dir);
    });
}

/// Most a termination message taken from the log holds, as on a kubelet: 80 lines, 2048 bytes.
const LOG_MESSAGE_LINES: usize = 80;
const LOG_MESSAGE_BYTES: usize = 2048;

/// The termination message of a container that exited with an error under
/// `terminationMessagePolicy: FallbackToLogsOnError`: the end of its log. (localkube has no
/// `terminationMessagePath` file, so the file is always empty and the log is used.)
fn fallback_message(c: &Container, status: &ExitStatus, log: &std::path::Path) -> Option<String> {
    if c.termination_message_policy.as_deref() != Some("FallbackToLogsOnError")
        || status.exit_code() == 0
    {
        return None;
    }
    let bytes = std::fs::read(log).ok()?;
    Some(log_tail(&bytes)).filter(|m| !m.is_empty())
}

/// The last [`LOG_MESSAGE_LINES`] lines of `log`, cut to its last [`LOG_MESSAGE_BYTES`] bytes.
fn log_tail(log: &[u8]) -> String {
    let text = String::from_utf8_lossy(log);
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_MESSAGE_LINES)..].join("\n");
    let mut start = tail.len().saturating_sub(LOG_MESSAGE_BYTES);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_owned()
}

/// Records the `CrashLoopBackOff` waiting state (and event) before a delayed restart.
fn crash_loop_back_off(sup: &Supervisor, delay: Duration) {
    let pod = sup.pod();
    let name = sup.container().map(|c| c.name).unwrap_or_default();
    let target = format!(
        "{}_{}({})",
        pod.name_any(),
        pod.namespace().unwrap_or_default(),
        sup.pod.uid
    );
    sup.event(
        true,
        "BackOff",
        format!("Back-off restarting failed container {name} in pod {target}"),
    );
    let msg = format!(
        "back-off {}s restarting failed container={name} pod={target}",
        delay.as_secs()
    );
    sup.update(|s| {
        if s.state.terminated.is_some() {
            s.last_state = Some(std::mem::take(&mut s.state));
        }
        s.state = waiting("CrashLoopBackOff", Some(msg));
    });
}

async fn wait_stop(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = wait_stop(stop) => true,
    }
}

/// Runs a regular (or sidecar) container for the pod's lifetime.
pub(crate) async fn supervise(sup: Supervisor, stop: watch::Receiver<bool>) {
    run_restarting(&sup, stop, |policy, status| {
        policy == "Always" || (policy == "OnFailure" && !status.success())
    })
    .await;
}

/// Runs an init container to successful completion. Returns `false` if it
/// failed for good (restartPolicy Never) or the pod is being deleted.
pub(crate) async fn supervise_init(sup: Supervisor, stop: watch::Receiver<bool>) -> bool {
    run_restarting(&sup, stop, |policy, status| {
        !status.success() && policy != "Never"
    })
    .await
}

/// Runs the container again (with back-off) while `restart(restart policy, exit status)`
/// says so. Returns whether its last run succeeded (`false` once the pod is being deleted).
async fn run_restarting(
    sup: &Supervisor,
    mut stop: watch::Receiver<bool>,
    restart: impl Fn(&str, &ExitStatus) -> bool,
) -> bool {
    let mut backoff = Backoff::default();
    let mut pull_backoff = Backoff::default();
    let mut spawned = false;
    loop {
        if *stop.borrow() {
            return false;
        }
        match run_once(sup, &mut stop, spawned).await {
            Outcome::Stopped => return false,
            Outcome::NotStarted { image_pull } => {
                let d = if image_pull {
                    pull_backoff
                        .next(Instant::now())
                        .max(Duration::from_secs(1))
                } else {
                    Duration::from_secs(2)
                };
                if sleep_or_stop(d, &mut stop).await {
                    return false;
                }
            }
            Outcome::Exited(status) => {
                spawned = true;
                if !restart(&sup.restart_policy(), &status) {
                    return status.success();
                }
                let delay = backoff.next(Instant::now());
                if !delay.is_zero() {
                    crash_loop_back_off(sup, delay);
                    if sleep_or_stop(delay, &mut stop).await {
                        return false;
                    }
                }
            }
        }
    }
}

/// What the probes of one container instance run against.
struct ProbeTarget<'a> {
    container: &'a Container,
    running: &'a RunningContainer,
    env: &'a [(String, String)],
    pod_ip: &'a str,
}

impl ProbeTarget<'_> {
    /// Runs probe `p` after its initial delay and then once a period, handing each result
    /// and the thresholds' verdict (`Some(healthy)` once one is crossed) to `on_result`
    /// until that breaks.
    async fn run<B>(
        &self,
        p: &Probe,
        mut on_result: impl FnMut(ProbeResult, Option<bool>) -> ControlFlow<B>,
    ) -> B {
        let t = ProbeTiming::of(p);
        tokio::time::sleep(t.initial_delay).await;
        let mut th = Thresholds::default();
        loop {
            let r = probe_once(p, self.container, self.running, self.env, self.pod_ip).await;
            let verdict = th.record(r == ProbeResult::Success, &t);
            if let ControlFlow::Break(b) = on_result(r, verdict) {
                return b;
            }
            tokio::time::sleep(t.period).await;
        }
    }
}

/// Asks for the container to be killed because its `what` ("Startup", "Liveness") probe
/// `p` failed with `r`.
async fn kill_failed(
    kill: &mpsc::Sender<(String, Option<Probe>)>,
    what: &str,
    p: &Probe,
    r: ProbeResult,
) {
    let msg = match r {
        ProbeResult::Failure(m) => m,
        ProbeResult::Success => String::new(),
    };
    let _ = kill
        .send((format!("{what} probe failed: {msg}"), Some(p.clone())))
        .await;
}

/// Startup, then readiness and liveness probes of one container instance.
async fn probe_loop(
    sup: Supervisor,
    c: Container,
    running: RunningContainer,
    env: Vec<(String, String)>,
    kill: mpsc::Sender<(String, Option<Probe>)>,
) {
    let pod_ip = sup.info.pod_ips.first().cloned().unwrap_or_default();
    let target = ProbeTarget {
        container: &c,
        running: &running,
        env: &env,
        pod_ip: &pod_ip,
    };
    if let Some(p) = &c.startup_probe {
        let failed = target
            .run(p, |r, verdict| match verdict {
                Some(true) => ControlFlow::Break(None),
                Some(false) => ControlFlow::Break(Some(r)),
                None => ControlFlow::Continue(()),
            })
            .await;
        if let Some(r) = failed {
            kill_failed(&kill, "Startup", p, r).await;
            return;
        }
        let has_readiness = c.readiness_probe.is_some();
        sup.update(|s| {
            s.started = true;
            s.ready = !has_readiness;
        });
    }
    let readiness = async {
        let Some(p) = &c.readiness_probe else {
            return;
        };
        target
            .run(p, |r, verdict| -> ControlFlow<Infallible> {
                if let ProbeResult::Failure(m) = &r {
                    sup.event(true, "Unhealthy", format!("Readiness probe failed: {m}"));
                }
                if let Some(ready) = verdict
                    && sup.current().is_some_and(|s| s.ready != ready)
                {
                    sup.update(|s| s.ready = ready);
                }
                ControlFlow::Continue(())
            })
            .await;
    };
    let liveness = async {
        let Some(p) = &c.liveness_probe else {
            return;
        };
        let r = target
            .run(p, |r, verdict| match verdict {
                Some(false) => ControlFlow::Break(r),
                _ => ControlFlow::Continue(()),
            })
            .await;
        kill_failed(&kill, "Liveness", p, r).await;
    };
    tokio::join!(readiness, liveness);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_80_lines_and_2048_bytes() {
        let log: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let tail = log_tail(log.as_bytes());
        assert!(tail.starts_with("line 20\n"));
        assert!(tail.ends_with("line 99"));
        let long = format!("{}\nend", "x".repeat(5000));
        let tail = log_tail(long.as_bytes());
        assert_eq!(tail.len(), 2048);
        assert!(tail.ends_with("x\nend"));
        // Never cut inside a character.
        let wide = "é".repeat(2000);
        assert!(log_tail(wide.as_bytes()).len() <= 2048);
    }
}
