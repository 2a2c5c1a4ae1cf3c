//! Pure decisions of the ValkeyNode controller: whether to write the workload and the claim.

use valkey_api::labels::WORKLOAD_REVISION_ANNOTATION;

use crate::render::workload::{TEMPLATE_HASH_ANNOTATION, quantity_bytes};

/// What the observed workload looks like (the fields the decision needs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedWorkload {
    /// Its `valkey.io/template-hash` annotation.
    pub template_hash: Option<String>,
    /// Its `valkey.io/workload-revision` annotation.
    pub workload_revision: Option<String>,
    /// `spec.replicas`.
    pub replicas: Option<i32>,
}

impl ObservedWorkload {
    /// Reads the fields from a workload's metadata and replica count.
    pub fn from_meta(
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        replicas: Option<i32>,
    ) -> Self {
        let ann = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).cloned();
        Self {
            template_hash: ann(TEMPLATE_HASH_ANNOTATION),
            workload_revision: ann(WORKLOAD_REVISION_ANNOTATION),
            replicas,
        }
    }
}

/// Decision about the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadAction {
    /// Server-side apply the rendered workload.
    Apply,
    /// Up to date: no write.
    Keep,
    /// The pod template changed but the roll is not authorized yet (`WorkloadRollPending`).
    Defer,
}

/// Decides whether to write the workload. A pod template change is applied at once when the
/// ValkeyNode has no `workloadRevision`; with one, only when it differs from the revision the
/// workload carries (its `valkey.io/workload-revision` annotation is the applied revision; the
/// ValkeyCluster controller bumps `workloadRevision` to authorize the roll). Reading the
/// applied revision from the workload rather than from the node's status keeps the decision
/// right even when the controller's cache of the ValkeyNode is stale. Non-template drift
/// (revision annotation, replicas) is always corrected.
pub fn workload_action(
    observed: Option<&ObservedWorkload>,
    desired_hash: &str,
    desired_revision: Option<&str>,
) -> WorkloadAction {
    let Some(o) = observed else {
        return WorkloadAction::Apply;
    };
    let template_changed = o.template_hash.as_deref() != Some(desired_hash);
    if template_changed {
        return match desired_revision {
            Some(rev) if o.workload_revision.as_deref() == Some(rev) => WorkloadAction::Defer,
            _ => WorkloadAction::Apply,
        };
    }
    if o.workload_revision.as_deref() != desired_revision || o.replicas != Some(1) {
        return WorkloadAction::Apply;
    }
    WorkloadAction::Keep
}

/// The size to request on the claim: the desired size, unless the claim already requests more
/// (claims never shrink). `None` when the claim already requests at least the desired size
/// (no write needed). Unparsable sizes fall back to writing the desired size when it differs.
pub fn pvc_request(current: Option<&str>, desired: &str) -> Option<String> {
    let Some(current) = current else {
        return Some(desired.to_owned());
    };
    match (quantity_bytes(current), quantity_bytes(desired)) {
        (Some(c), Some(d)) if c >= d => None,
        (Some(_), Some(_)) => Some(desired.to_owned()),
        _ => (current != desired).then(|| desired.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(hash: &str, rev: Option<&str>) -> ObservedWorkload {
        ObservedWorkload {
            template_hash: Some(hash.into()),
            workload_revision: rev.map(Into::into),
            replicas: Some(1),
        }
    }

    #[test]
    fn missing_workload_is_applied() {
        assert_eq!(workload_action(None, "h", Some("1")), WorkloadAction::Apply);
    }

    #[test]
    fn template_change_waits_for_revision_bump() {
        let o = obs("old", Some("1"));
        assert_eq!(
            workload_action(Some(&o), "new", Some("1")),
            WorkloadAction::Defer
        );
        assert_eq!(
            workload_action(Some(&o), "new", Some("2")),
            WorkloadAction::Apply
        );
        // Without revisions there is no gate.
        let o = obs("old", None);
        assert_eq!(
            workload_action(Some(&o), "new", None),
            WorkloadAction::Apply
        );
    }

    #[test]
    fn unchanged_is_kept_and_drift_corrected() {
        let o = obs("h", Some("1"));
        assert_eq!(
            workload_action(Some(&o), "h", Some("1")),
            WorkloadAction::Keep
        );
        // A bumped revision without a template change only updates the annotation.
        assert_eq!(
            workload_action(Some(&o), "h", Some("2")),
            WorkloadAction::Apply
        );
        let mut scaled = o.clone();
        scaled.replicas = Some(0);
        assert_eq!(
            workload_action(Some(&scaled), "h", Some("1")),
            WorkloadAction::Apply
        );
    }

    #[test]
    fn pvc_only_grows() {
        assert_eq!(pvc_request(None, "1Gi").as_deref(), Some("1Gi"));
        assert_eq!(pvc_request(Some("1Gi"), "1Gi"), None);
        assert_eq!(pvc_request(Some("1024Mi"), "1Gi"), None);
        assert_eq!(pvc_request(Some("2Gi"), "1Gi"), None);
        assert_eq!(pvc_request(Some("1Gi"), "2Gi").as_deref(), Some("2Gi"));
    }
}
