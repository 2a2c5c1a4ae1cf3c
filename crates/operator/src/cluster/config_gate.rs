//! The config gate (pure): a new `spec.image` or `spec.config` reaches the pods only after the
//! server of that image accepted the settings in a dry run (see
//! [`crate::render::config_check`]). Until then, or when it refuses them, the pods are rendered
//! from the last accepted image and settings (`status.acceptedConfig`), so nothing rolls to a
//! configuration a restarted server would refuse.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use valkey_api::labels;
use valkey_api::status::{AcceptedConfig, RejectedConfig};
use valkey_api::{ValkeyCluster, ValkeyClusterSpec};

use crate::render::config_check::{self, Verdict};

/// Where the check of the current spec stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// The current image and settings are accepted.
    Accepted,
    /// A dry run is on its way (the check pod's name).
    Checking(String),
    /// The server refused them, or the check could not judge: why.
    Refused(String),
}

/// The gate's decision for one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    /// Where the check stands.
    pub state: State,
    /// The image and settings to render the pods from; `None` while nothing was ever accepted
    /// (no ValkeyNode is created yet).
    pub effective: Option<(String, Option<BTreeMap<String, String>>)>,
    /// `status.acceptedConfig` after this pass.
    pub accepted: Option<AcceptedConfig>,
    /// `status.rejectedConfig` after this pass.
    pub rejected: Option<RejectedConfig>,
    /// The check pod of the current spec, when it must be created.
    pub create: Option<Pod>,
    /// Check pods to delete (finished, or for a spec that changed since).
    pub delete: Vec<String>,
}

fn accepted_from(spec: &ValkeyClusterSpec, fp: &str) -> AcceptedConfig {
    AcceptedConfig {
        fingerprint: fp.to_owned(),
        image: spec.image.clone(),
        config: spec.config.clone(),
    }
}

/// Decides the gate for `vc` from its check pods. `has_nodes`: the cluster already has
/// ValkeyNodes (its pods run what the spec said before this operator version recorded an
/// accepted configuration).
pub fn gate(vc: &ValkeyCluster, check_pods: &[Pod], has_nodes: bool) -> Gate {
    let spec = &vc.spec;
    let fp = config_check::fingerprint(spec);
    let status = vc.status.as_ref();
    let prev_accepted = status.and_then(|s| s.accepted_config.clone());
    let prev_rejected = status
        .and_then(|s| s.rejected_config.clone())
        .filter(|r| r.fingerprint == fp);
    let fingerprint_of = |p: &Pod| p.labels().get(labels::CONFIG_FINGERPRINT).cloned();
    let mine = check_pods
        .iter()
        .find(|p| fingerprint_of(p).as_deref() == Some(fp.as_str()));
    // Check pods of another spec are never needed again.
    let mut delete: Vec<String> = check_pods
        .iter()
        .filter(|p| fingerprint_of(p).as_deref() != Some(fp.as_str()))
        .map(ResourceExt::name_any)
        .collect();

    let verdict = if config_check::checked_lines(spec).is_empty()
        || prev_accepted.as_ref().is_some_and(|a| a.fingerprint == fp)
        || (prev_accepted.is_none() && prev_rejected.is_none() && has_nodes)
    {
        // Nothing to check, checked before, or running since before the gate existed.
        Some(Verdict::Accepted)
    } else if let Some(pod) = mine {
        let v = config_check::verdict(pod);
        if v.is_some() {
            delete.push(pod.name_any());
        }
        v
    } else {
        prev_rejected
            .as_ref()
            .map(|r| Verdict::Refused(r.message.clone()))
    };

    let keep = |a: &Option<AcceptedConfig>| a.as_ref().map(|a| (a.image.clone(), a.config.clone()));
    let (state, accepted, rejected, create) = match verdict {
        Some(Verdict::Accepted) => (State::Accepted, Some(accepted_from(spec, &fp)), None, false),
        Some(Verdict::Refused(m)) => refused(&fp, m, prev_accepted),
        Some(Verdict::Inconclusive(m)) => refused(
            &fp,
            format!(
                "the check could not judge ({m}); it runs again when spec.image or spec.config changes"
            ),
            prev_accepted,
        ),
        None => (
            State::Checking(config_check::pod_name(&vc.name_any(), &fp)),
            prev_accepted,
            None,
            mine.is_none(),
        ),
    };
    let create = create.then(|| {
        config_check::check_pod(
            &vc.name_any(),
            &vc.namespace().unwrap_or_default(),
            spec,
            crate::render::owner_reference(vc),
        )
    });
    let effective = match state {
        State::Accepted => Some((spec.image.clone(), spec.config.clone())),
        _ => keep(&accepted),
    };
    Gate {
        state,
        effective,
        accepted,
        rejected,
        create,
        delete,
    }
}

fn refused(
    fp: &str,
    message: String,
    prev_accepted: Option<AcceptedConfig>,
) -> (State, Option<AcceptedConfig>, Option<RejectedConfig>, bool) {
    (
        State::Refused(message.clone()),
        prev_accepted,
        Some(RejectedConfig {
            fingerprint: fp.to_owned(),
            message,
        }),
        false,
    )
}

impl Gate {
    /// `vc` with the image and settings the pods are rendered from.
    pub fn effective_cluster<'a>(&self, vc: &'a ValkeyCluster) -> Cow<'a, ValkeyCluster> {
        match &self.effective {
            Some((image, config)) if *image != vc.spec.image || *config != vc.spec.config => {
                let mut c = vc.clone();
                c.spec.image.clone_from(image);
                c.spec.config.clone_from(config);
                Cow::Owned(c)
            }
            _ => Cow::Borrowed(vc),
        }
    }

    /// The ConfigurationWarning / Degraded message when the spec was refused.
    pub fn warning(&self, spec: &ValkeyClusterSpec) -> Option<String> {
        let State::Refused(why) = &self.state else {
            return None;
        };
        let kept = match &self.accepted {
            Some(a) => format!("the pods keep {} and the settings last accepted", a.image),
            None => "no pod is created".to_owned(),
        };
        Some(format!(
            "spec.config is refused by {}: {why}. Nothing was rolled: {kept}; fix or remove the setting",
            spec.image
        ))
    }

    /// Progress while a check runs.
    pub fn checking(&self, spec: &ValkeyClusterSpec) -> Option<String> {
        let State::Checking(pod) = &self.state else {
            return None;
        };
        Some(format!(
            "checking spec.config with {} before any pod uses it (pod {pod})",
            spec.image
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(image: &str, config: serde_json::Value) -> ValkeyCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"shards": 3, "image": image, "config": config},
        }))
        .expect("cluster")
    }

    fn check(vc: &ValkeyCluster, phase: Option<(&str, i32, &str)>) -> Pod {
        let mut pod = config_check::check_pod("c", "ns", &vc.spec, None);
        if let Some((phase, code, msg)) = phase {
            pod.status = serde_json::from_value(serde_json::json!({
                "phase": phase, "containerStatuses": [{
                    "name": "check", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0, "state": {"terminated": {"exitCode": code, "message": msg}}}]
            }))
            .expect("status");
        }
        pod
    }

    fn with_status(mut vc: ValkeyCluster, accepted: Option<&ValkeyCluster>) -> ValkeyCluster {
        vc.status = Some(valkey_api::ValkeyClusterStatus {
            accepted_config: accepted
                .map(|a| accepted_from(&a.spec, &config_check::fingerprint(&a.spec))),
            ..Default::default()
        });
        vc
    }

    #[test]
    fn no_settings_need_no_check() {
        let vc = cluster("valkey/valkey:9.0.0", serde_json::json!({}));
        let g = gate(&vc, &[], false);
        assert_eq!(g.state, State::Accepted);
        assert!(g.create.is_none());
        assert!(g.effective.is_some());
    }

    #[test]
    fn a_new_cluster_waits_for_its_check() {
        let vc = cluster("valkey/valkey:8.0.1", serde_json::json!({"no-such": "1"}));
        let g = gate(&vc, &[], false);
        assert!(matches!(g.state, State::Checking(_)));
        assert!(g.create.is_some());
        assert_eq!(g.effective, None, "no ValkeyNode before the verdict");
        // The pod exists and runs: nothing more to create.
        let g = gate(&vc, &[check(&vc, None)], false);
        assert!(g.create.is_none());
        // It refused the line: the reason is kept, the pod deleted, still nothing created.
        let g = gate(
            &vc,
            &[check(&vc, Some(("Failed", 1, ">>> 'no-such 1'")))],
            false,
        );
        assert_eq!(g.state, State::Refused(">>> 'no-such 1'".into()));
        assert_eq!(g.delete.len(), 1);
        assert_eq!(g.effective, None);
        assert!(g.warning(&vc.spec).unwrap().contains("'no-such 1'"));
        // Later passes keep the verdict without a new pod.
        let mut later = vc.clone();
        later.status = Some(valkey_api::ValkeyClusterStatus {
            rejected_config: g.rejected.clone(),
            ..Default::default()
        });
        let g2 = gate(&later, &[], false);
        assert_eq!(g2.state, g.state);
        assert!(g2.create.is_none());
    }

    #[test]
    fn a_refused_change_keeps_the_accepted_settings() {
        let good = cluster(
            "valkey/valkey:8.0.1",
            serde_json::json!({"maxmemory": "1gb"}),
        );
        let bad = with_status(
            cluster(
                "valkey/valkey:8.0.1",
                serde_json::json!({"maxmemory": "lots"}),
            ),
            Some(&good),
        );
        let g = gate(&bad, &[], true);
        assert!(g.create.is_some());
        assert_eq!(
            g.effective_cluster(&bad).spec.config,
            good.spec.config,
            "while checking, the pods keep the accepted settings"
        );
        let g = gate(
            &bad,
            &[check(
                &bad,
                Some(("Failed", 1, "argument must be a memory value")),
            )],
            true,
        );
        assert!(matches!(g.state, State::Refused(_)));
        assert_eq!(g.effective_cluster(&bad).spec.config, good.spec.config);
        assert_eq!(
            g.accepted.as_ref().map(|a| a.image.as_str()),
            Some("valkey/valkey:8.0.1")
        );
        // An image change is held back the same way.
        let upgraded = with_status(
            cluster(
                "valkey/valkey:9.0.0",
                serde_json::json!({"maxmemory": "1gb"}),
            ),
            Some(&good),
        );
        let g = gate(&upgraded, &[], true);
        assert_eq!(
            g.effective_cluster(&upgraded).spec.image,
            "valkey/valkey:8.0.1"
        );
        // Accepted: the new spec is used and recorded; stale pods are deleted.
        let g = gate(
            &upgraded,
            &[
                check(&upgraded, Some(("Succeeded", 0, ""))),
                check(&bad, None),
            ],
            true,
        );
        assert_eq!(g.state, State::Accepted);
        assert_eq!(
            g.effective_cluster(&upgraded).spec.image,
            "valkey/valkey:9.0.0"
        );
        assert_eq!(g.delete.len(), 2);
        assert_eq!(g.rejected, None);
    }

    #[test]
    fn a_running_cluster_from_before_the_gate_is_trusted() {
        let vc = cluster(
            "valkey/valkey:8.0.1",
            serde_json::json!({"maxmemory": "1gb"}),
        );
        let g = gate(&vc, &[], true);
        assert_eq!(g.state, State::Accepted);
        assert!(g.accepted.is_some());
    }

    #[test]
    fn an_inconclusive_check_is_reported_not_retried_in_a_loop() {
        let vc = cluster(
            "valkey/valkey:8.0.1",
            serde_json::json!({"maxmemory": "1gb"}),
        );
        let g = gate(&vc, &[check(&vc, Some(("Failed", 137, "")))], false);
        let State::Refused(m) = &g.state else {
            panic!("{:?}", g.state)
        };
        assert!(m.contains("could not judge"), "{m}");
        assert!(g.create.is_none());
    }
}
