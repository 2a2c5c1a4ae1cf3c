//! Plumbing both controllers share: the client, event recorder and metrics of a controller, and
//! publishing the events a pass decided on.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tracing::warn;

use crate::metrics::Metrics;
use crate::status::EventSpec;
use crate::text;

/// What every controller needs: the API client, an event recorder and the metrics.
#[derive(Clone)]
pub struct Shared {
    /// Kubernetes client.
    pub client: Client,
    /// Event recorder (reporting controller `valkey-operator`, instance `$POD_NAME`).
    pub recorder: Recorder,
    /// Operator metrics.
    pub metrics: Arc<Metrics>,
}

impl Shared {
    /// The shared parts for `client`.
    pub fn new(client: Client, metrics: Arc<Metrics>) -> Self {
        let reporter = Reporter {
            controller: "valkey-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
        }
    }

    /// Publishes `events` on the object `reference` (failures are logged, never fatal).
    pub async fn publish(&self, reference: &ObjectReference, events: &[EventSpec]) {
        for e in events {
            let ev = Event {
                type_: if e.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: e.reason.to_owned(),
                note: Some(text::clamp(&e.note, text::EVENT_NOTE_MAX)),
                action: e.action.to_owned(),
                secondary: None,
            };
            if let Err(err) = self.recorder.publish(&ev, reference).await {
                warn!(reason = e.reason, error = %err, "publishing event failed");
            }
        }
    }
}
