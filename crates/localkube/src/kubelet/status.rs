//! The runtime state the kubelet keeps per pod and the pure computation of
//! the pod's API status from it (phase, conditions, container statuses),
//! following the kubelet's `generateAPIPodStatus` / `getPhase`.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP,
    PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::runtime::RunningContainer;

/// Runtime state of one container.
#[derive(Debug, Clone)]
pub struct ContainerRuntimeState {
    /// Container name.
    pub name: String,
    /// Image as given in the spec.
    pub image: String,
    /// Image id reported once "pulled".
    pub image_id: String,
    /// Id of the current (or last) container instance.
    pub container_id: Option<String>,
    /// Current state.
    pub state: ContainerState,
    /// Previous termination.
    pub last_state: Option<ContainerState>,
    /// Number of restarts.
    pub restart_count: i32,
    /// Readiness (from the readiness probe, or running without one).
    pub ready: bool,
    /// Startup probe passed (or none).
    pub started: bool,
    /// The running process, if any.
    pub running: Option<RunningContainer>,
    /// The environment the running process got (for exec).
    pub env: Vec<(String, String)>,
}

impl ContainerRuntimeState {
    /// A container that has not been created yet.
    pub fn new(name: &str, image: &str, reason: &str) -> Self {
        Self {
            name: name.to_string(),
            image: image.to_string(),
            image_id: String::new(),
            container_id: None,
            state: waiting(reason, None),
            last_state: None,
            restart_count: 0,
            ready: false,
            started: false,
            running: None,
            env: Vec::new(),
        }
    }

    /// Whether the container currently runs.
    pub fn is_running(&self) -> bool {
        self.state.running.is_some()
    }
}

/// A waiting state.
pub fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..Default::default()
    }
}

/// Runtime state of one pod.
#[derive(Debug, Clone, Default)]
pub struct PodRuntimeState {
    /// Pod IPs once the sandbox exists.
    pub pod_ips: Vec<String>,
    /// The node's IP.
    pub host_ip: String,
    /// When the kubelet first saw the pod.
    pub start_time: Option<Time>,
    /// The sandbox (network namespace) exists.
    pub sandbox_ready: bool,
    /// Init containers.
    pub init: Vec<ContainerRuntimeState>,
    /// Regular containers.
    pub containers: Vec<ContainerRuntimeState>,
    /// An init container failed for good (restartPolicy Never).
    pub init_failed: bool,
    /// All init containers completed.
    pub initialized: bool,
}

fn condition(
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    previous: &[PodCondition],
    now: &Time,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.map(str::to_string),
        message,
        last_transition_time: Some(last_transition_time),
        last_probe_time: None,
        observed_generation: None,
    }
}

/// The phase per the kubelet's `getPhase`.
pub fn phase(pod: &Pod, st: &PodRuntimeState) -> String {
    let restart_policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    if let Some(p) = pod.status.as_ref().and_then(|s| s.phase.as_deref())
        && (p == "Succeeded" || p == "Failed")
    {
        return p.to_string();
    }
    if st.init_failed {
        return "Failed".into();
    }
    if !st.initialized {
        return "Pending".into();
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for c in &st.containers {
        if c.state.running.is_some() {
            running += 1;
        } else if let Some(t) = &c.state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if c
            .last_state
            .as_ref()
            .is_some_and(|l| l.terminated.is_some())
        {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    // A pod being deleted whose containers all stopped is terminal (the
    // kubelet reports Succeeded/Failed before removing it).
    let deleting = pod.metadata.deletion_timestamp.is_some();
    if deleting && running == 0 && waiting == 0 && stopped > 0 {
        let all_ok = st.containers.iter().all(|c| {
            c.state
                .terminated
                .as_ref()
                .is_some_and(|t| t.exit_code == 0)
        });
        return if all_ok { "Succeeded" } else { "Failed" }.into();
    }
    if waiting > 0 {
        "Pending".into()
    } else if running > 0 {
        "Running".into()
    } else if stopped > 0 {
        if restart_policy == "Always" {
            "Running".into()
        } else if stopped == succeeded {
            "Succeeded".into()
        } else if restart_policy == "Never" {
            "Failed".into()
        } else {
            "Running".into()
        }
    } else {
        "Pending".into()
    }
}

fn container_status(c: &ContainerRuntimeState) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: c.image_id.clone(),
        container_id: c.container_id.clone(),
        state: Some(c.state.clone()),
        last_state: Some(c.last_state.clone().unwrap_or_default()),
        restart_count: c.restart_count,
        ready: c.ready && c.is_running(),
        started: Some(c.started && c.is_running()),
        ..Default::default()
    }
}

/// Computes the status the kubelet reports for `pod` from its runtime state.
/// Conditions the kubelet does not own (e.g. `PodScheduled`,
/// `DisruptionTarget`) are kept from the current status.
pub fn compute(pod: &Pod, st: &PodRuntimeState, now: &Time) -> PodStatus {
    let previous: Vec<PodCondition> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let phase = phase(pod, st);
    let terminal = phase == "Succeeded" || phase == "Failed";

    let mut conditions: Vec<PodCondition> = Vec::new();
    conditions.push(condition(
        "PodReadyToStartContainers",
        st.sandbox_ready,
        None,
        None,
        &previous,
        now,
    ));
    let incomplete: Vec<&str> = st
        .init
        .iter()
        .filter(|c| {
            c.state.terminated.as_ref().is_none_or(|t| t.exit_code != 0)
                && !(c.is_running() && c.started)
        })
        .map(|c| c.name.as_str())
        .collect();
    if st.initialized || st.init.is_empty() {
        conditions.push(condition("Initialized", true, None, None, &previous, now));
    } else {
        conditions.push(condition(
            "Initialized",
            false,
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            )),
            &previous,
            now,
        ));
    }
    let unready: Vec<&str> = st
        .containers
        .iter()
        .filter(|c| !(c.ready && c.is_running()))
        .map(|c| c.name.as_str())
        .collect();
    let gates_ok = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .into_iter()
        .flatten()
        .all(|g| {
            previous
                .iter()
                .any(|c| c.type_ == g.condition_type && c.status == "True")
        });
    let containers_ready = unready.is_empty() && st.initialized && !terminal;
    let (reason, message) = if terminal {
        (Some("PodCompleted"), None)
    } else if !unready.is_empty() {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    } else {
        (None, None)
    };
    conditions.push(condition(
        "ContainersReady",
        containers_ready,
        reason,
        message.clone(),
        &previous,
        now,
    ));
    let (ready_reason, ready_message) = if containers_ready && !gates_ok {
        (
            Some("ReadinessGatesNotReady"),
            Some("corresponding condition of pod readiness gate is not true".to_string()),
        )
    } else {
        (reason, message)
    };
    conditions.push(condition(
        "Ready",
        containers_ready && gates_ok,
        ready_reason,
        ready_message,
        &previous,
        now,
    ));
    let ours = [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
    ];
    for c in &previous {
        if !ours.contains(&c.type_.as_str()) {
            conditions.push(c.clone());
        }
    }
    // Keep the kubelet's (and kubectl's) conventional order.
    let rank = |t: &str| match t {
        "PodReadyToStartContainers" => 0,
        "Initialized" => 1,
        "Ready" => 2,
        "ContainersReady" => 3,
        "PodScheduled" => 4,
        _ => 5,
    };
    conditions.sort_by_key(|c| rank(&c.type_));

    let mut statuses: Vec<ContainerStatus> = st.containers.iter().map(container_status).collect();
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    let init_statuses: Vec<ContainerStatus> = st.init.iter().map(container_status).collect();

    PodStatus {
        phase: Some(phase),
        conditions: Some(conditions),
        host_ip: (!st.host_ip.is_empty()).then(|| st.host_ip.clone()),
        host_ips: (!st.host_ip.is_empty()).then(|| {
            vec![HostIP {
                ip: st.host_ip.clone(),
            }]
        }),
        pod_ip: st.pod_ips.first().cloned(),
        pod_ips: (!st.pod_ips.is_empty()).then(|| {
            st.pod_ips
                .iter()
                .map(|ip| PodIP { ip: ip.clone() })
                .collect()
        }),
        start_time: st.start_time.clone(),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        qos_class: pod.status.as_ref().and_then(|s| s.qos_class.clone()),
        observed_generation: pod.metadata.generation,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerStateRunning, ContainerStateTerminated, PodSpec};
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::now())
    }

    fn pod(policy: &str) -> Pod {
        Pod {
            spec: Some(PodSpec {
                restart_policy: Some(policy.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn running(name: &str, ready: bool) -> ContainerRuntimeState {
        let mut c = ContainerRuntimeState::new(name, "img", "ContainerCreating");
        c.state = ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(now()),
            }),
            ..Default::default()
        };
        c.ready = ready;
        c.started = true;
        c
    }

    fn terminated(name: &str, code: i32) -> ContainerRuntimeState {
        let mut c = ContainerRuntimeState::new(name, "img", "ContainerCreating");
        c.state = ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        };
        c
    }

    fn cond<'a>(s: &'a PodStatus, t: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    #[test]
    fn ready_running_pod() {
        let st = PodRuntimeState {
            pod_ips: vec!["10.0.0.2".into()],
            host_ip: "10.0.0.1".into(),
            sandbox_ready: true,
            initialized: true,
            containers: vec![running("b", true), running("a", true)],
            ..Default::default()
        };
        let s = compute(&pod("Always"), &st, &now());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "PodScheduled").status, "True");
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.2"));
        let names: Vec<_> = s
            .container_statuses
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(names, vec!["a", "b"]);
    }

    #[test]
    fn unready_and_waiting() {
        let mut st = PodRuntimeState {
            sandbox_ready: true,
            initialized: true,
            containers: vec![running("a", false)],
            ..Default::default()
        };
        let s = compute(&pod("Always"), &st, &now());
        assert_eq!(cond(&s, "Ready").status, "False");
        assert_eq!(
            cond(&s, "ContainersReady").message.as_deref(),
            Some("containers with unready status: [a]")
        );
        st.containers
            .push(ContainerRuntimeState::new("b", "x", "ErrImagePull"));
        assert_eq!(phase(&pod("Always"), &st), "Pending");
    }

    #[test]
    fn phases_by_restart_policy() {
        let st = |codes: &[i32]| PodRuntimeState {
            initialized: true,
            containers: codes
                .iter()
                .enumerate()
                .map(|(i, c)| terminated(&format!("c{i}"), *c))
                .collect(),
            ..Default::default()
        };
        assert_eq!(phase(&pod("Never"), &st(&[0, 0])), "Succeeded");
        assert_eq!(phase(&pod("Never"), &st(&[0, 1])), "Failed");
        assert_eq!(phase(&pod("OnFailure"), &st(&[0, 0])), "Succeeded");
        assert_eq!(phase(&pod("OnFailure"), &st(&[1])), "Running");
        assert_eq!(phase(&pod("Always"), &st(&[0])), "Running");
        let mut deleting = pod("Always");
        deleting.metadata.deletion_timestamp = Some(now());
        assert_eq!(phase(&deleting, &st(&[143])), "Failed");
        assert_eq!(phase(&deleting, &st(&[0])), "Succeeded");
        let mut restarting = st(&[]);
        let mut c = ContainerRuntimeState::new("c", "i", "CrashLoopBackOff");
        c.last_state = terminated("c", 1).state.into();
        restarting.containers.push(c);
        assert_eq!(phase(&pod("Always"), &restarting), "Running");
        let pending = PodRuntimeState {
            init: vec![ContainerRuntimeState::new("init", "i", "PodInitializing")],
            containers: vec![ContainerRuntimeState::new("c", "i", "PodInitializing")],
            ..Default::default()
        };
        assert_eq!(phase(&pod("Always"), &pending), "Pending");
        let s = compute(&pod("Always"), &pending, &now());
        assert_eq!(
            cond(&s, "Initialized").message.as_deref(),
            Some("containers with incomplete status: [init]")
        );
    }

    #[test]
    fn transition_time_is_kept() {
        let st = PodRuntimeState {
            sandbox_ready: true,
            initialized: true,
            containers: vec![running("a", true)],
            ..Default::default()
        };
        let mut p = pod("Always");
        let first = compute(&p, &st, &now());
        p.status = Some(first.clone());
        std::thread::sleep(std::time::Duration::from_millis(5));
        let second = compute(&p, &st, &now());
        assert_eq!(first, second);
    }
}
