//! Kubelet-style events about pods and containers (`Pulled`, `Created`,
//! `Started`, `Killing`, `Unhealthy`, `BackOff`, `FailedMount`, ...),
//! reported as `kubelet` with the node name as instance.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, ResourceExt};

/// One recorder per node.
pub(crate) struct Events {
    recorders: BTreeMap<String, Recorder>,
}

impl Events {
    pub(crate) fn new<'a>(client: &Client, nodes: impl Iterator<Item = &'a String>) -> Self {
        let recorders = nodes
            .map(|n| {
                let reporter = Reporter {
                    controller: "kubelet".into(),
                    instance: Some(n.clone()),
                };
                (n.clone(), Recorder::new(client.clone(), reporter))
            })
            .collect();
        Events { recorders }
    }

    /// Publishes an event about `pod` (and one of its containers) in the
    /// background; failures are only logged.
    pub(crate) fn emit(
        &self,
        node: &str,
        pod: &Pod,
        container: Option<&str>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let Some(recorder) = self.recorders.get(node).cloned() else {
            return;
        };
        let field_path = container.map(|c| {
            let init = pod
                .spec
                .as_ref()
                .and_then(|s| s.init_containers.as_ref())
                .is_some_and(|i| i.iter().any(|x| x.name == c));
            if init {
                format!("spec.initContainers{{{c}}}")
            } else {
                format!("spec.containers{{{c}}}")
            }
        });
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.name_any()),
            namespace: pod.namespace(),
            uid: pod.uid(),
            field_path,
            ..Default::default()
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: reason.to_string(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, "publishing event failed");
            }
        });
    }
}
