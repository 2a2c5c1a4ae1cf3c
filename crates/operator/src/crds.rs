//! Waiting at start-up until the operator's CRDs are installed and Established.
//!
//! A Helm install (or `kubectl apply` of `deploy/`) creates the CRDs and starts the operator
//! at the same moment, so `valkey-operator run` may come up before the CRDs exist or while
//! the apiserver has not yet Established them. It then waits, polling with capped exponential
//! back-off (0.2 s doubling to 5 s), and logs once per CRD and state change, not per retry.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use tracing::{info, warn};

use crate::backoff::Backoff;

/// Where a CRD stands, as far as serving its resources goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrdState {
    /// No such CRD.
    Absent,
    /// Created, but the apiserver has not set `Established=True` (yet).
    NotEstablished,
    /// `Established=True`: its resources are served.
    Established,
}

/// The state of a CRD from the object read (`None` when it does not exist). Pure.
pub fn crd_state(crd: Option<&CustomResourceDefinition>) -> CrdState {
    let Some(crd) = crd else {
        return CrdState::Absent;
    };
    let established = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    if established {
        CrdState::Established
    } else {
        CrdState::NotEstablished
    }
}

/// What one look at a CRD found; a change of it is logged, a repetition is not.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    State(CrdState),
    ReadError(String),
}

/// Waits until the CRD `name` is Established. Read errors (the apiserver starting, RBAC not
/// bound yet) are retried the same way.
pub async fn wait_established(crds: &Api<CustomResourceDefinition>, name: &str) {
    let mut backoff = Backoff::startup();
    let mut last: Option<Seen> = None;
    loop {
        let seen = match crds.get_opt(name).await {
            Ok(crd) => Seen::State(crd_state(crd.as_ref())),
            Err(e) => Seen::ReadError(e.to_string()),
        };
        if last.as_ref() != Some(&seen) {
            match &seen {
                Seen::State(CrdState::Established) => info!(crd = %name, "CRD established"),
                Seen::State(CrdState::Absent) => info!(
                    crd = %name,
                    "CRD not installed yet, waiting (install: `valkey-operator crd | kubectl apply --server-side -f -`)"
                ),
                Seen::State(CrdState::NotEstablished) => {
                    info!(crd = %name, "CRD installed but not Established yet, waiting")
                }
                Seen::ReadError(e) => warn!(crd = %name, error = %e, "cannot read CRD, retrying"),
            }
            if last.is_some() {
                backoff.reset();
            }
        }
        if seen == Seen::State(CrdState::Established) {
            return;
        }
        last = Some(seen);
        backoff.sleep().await;
    }
}

/// Waits until every one of the operator's CRDs (`valkey_api::crds()`) are Established.
pub async fn wait_all_established(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in valkey_api::crds() {
        wait_established(&crds, crd.metadata.name.as_deref().unwrap_or_default()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(conditions: serde_json::Value) -> CustomResourceDefinition {
        let mut v = serde_json::to_value(valkey_api::crds().remove(0)).unwrap();
        v["status"] = serde_json::json!({ "conditions": conditions });
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn established_only_with_a_true_established_condition() {
        assert_eq!(crd_state(None), CrdState::Absent);
        let mut bare = valkey_api::crds().remove(0);
        bare.status = None;
        assert_eq!(crd_state(Some(&bare)), CrdState::NotEstablished);
        let cond = |t: &str, s: &str| serde_json::json!({"type": t, "status": s});
        let names_only = crd(serde_json::json!([cond("NamesAccepted", "True")]));
        assert_eq!(crd_state(Some(&names_only)), CrdState::NotEstablished);
        let pending = crd(serde_json::json!([
            cond("NamesAccepted", "True"),
            cond("Established", "False")
        ]));
        assert_eq!(crd_state(Some(&pending)), CrdState::NotEstablished);
        let ready = crd(serde_json::json!([
            cond("NamesAccepted", "True"),
            cond("Established", "True")
        ]));
        assert_eq!(crd_state(Some(&ready)), CrdState::Established);
    }
}
