//! The state of one pod that its worker, its container supervisors, the status reporter and
//! fault injection share.

use std::sync::Mutex;

use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::Notify;

use super::status::PodRuntimeState;
use crate::runtime::Sandbox;

/// State of one pod shared between its worker, its container supervisors,
/// the status reporter and fault injection.
pub(crate) struct PodShared {
    pub state: Mutex<PodRuntimeState>,
    pub changed: Notify,
    pub sandbox: Mutex<Option<Sandbox>>,
    pub uid: String,
    pub node: String,
}

impl PodShared {
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut PodRuntimeState) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.changed.notify_one();
        r
    }

    pub(crate) fn snapshot(&self) -> PodRuntimeState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn sandbox(&self) -> Option<Sandbox> {
        self.sandbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A terminated state for a container process that ended.
pub(crate) fn terminated_state(
    exit_code: i32,
    signal: Option<i32>,
    started_at: Option<Time>,
    container_id: Option<String>,
    reason: Option<&str>,
) -> ContainerState {
    let reason = reason
        .map(str::to_string)
        .unwrap_or_else(|| if exit_code == 0 { "Completed" } else { "Error" }.to_string());
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            signal,
            reason: Some(reason),
            started_at,
            finished_at: Some(Time(Timestamp::now())),
            container_id,
            message: None,
        }),
        ..Default::default()
    }
}
