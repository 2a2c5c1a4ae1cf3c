//! The config-check pod: a dry run of `spec.config` by the server of `spec.image`.
//!
//! Before the pods are rendered with a new image or new settings, a pod of that image starts
//! `valkey-server` with the user's `valkey.conf` lines and `port 0`: a server that accepts every
//! line finishes its start-up and exits with "Configured to not listen anywhere"; one that
//! refuses a line prints `FATAL CONFIG FILE ERROR`, the line and why. The script exits 0 or 1
//! accordingly and prints the server's explanation, which `FallbackToLogsOnError` makes the
//! container's termination message. Nothing in the check touches the running pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, ResourceRequirements, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};
use valkey_api::{ValkeyClusterSpec, labels};

use super::pod::{TMP_DIR, volumes};
use super::{names, security, valkey_conf};

/// Environment variable carrying the lines to check.
pub const CONFIG_ENV: &str = "VALKEY_CONFIG";
/// Exit code of the check when the server refuses the configuration.
pub const REFUSED_EXIT_CODE: i32 = 1;
/// Exit code of the check when the server did something unexpected (it could not judge).
pub const INCONCLUSIVE_EXIT_CODE: i32 = 2;
/// Longest a check pod may run once started.
pub const DEADLINE_SECONDS: i64 = 120;

/// The check script (POSIX sh, as in the Valkey images).
const SCRIPT: &str = r#"printf '%s' "$VALKEY_CONFIG" > /tmp/valkey-check.conf
out=$(valkey-server /tmp/valkey-check.conf --port 0 --dir /tmp --save '' --appendonly no \
  --cluster-enabled yes --cluster-config-file /tmp/valkey-check-nodes.conf 2>&1)
case "$out" in
  *"Configured to not listen anywhere"*) echo "accepted"; exit 0 ;;
  *"FATAL CONFIG FILE ERROR"*)
    printf '%s\n' "$out" | sed -n '/FATAL CONFIG FILE ERROR/,$p' | grep -v '^$'; exit 1 ;;
  *) printf '%s\n' "$out" | tail -n 5; exit 2 ;;
esac
"#;

/// The `valkey.conf` lines the check runs: every user setting, live ones included (a restarted
/// pod reads them from the file too).
pub fn checked_lines(spec: &ValkeyClusterSpec) -> String {
    valkey_conf::user_lines(spec, true)
}

/// Fingerprint of what a check judges: the image and the checked lines (12 hex digits).
pub fn fingerprint(spec: &ValkeyClusterSpec) -> String {
    let mut h = Sha256::new();
    h.update(spec.image.as_bytes());
    h.update(b"\n");
    h.update(checked_lines(spec).as_bytes());
    hex::encode(h.finalize())[..12].to_owned()
}

/// Name of the check pod of `cluster` for `fingerprint`.
pub fn pod_name(cluster: &str, fingerprint: &str) -> String {
    format!("valkey-{cluster}-config-check-{fingerprint}")
}

/// Labels of a check pod: not the cluster's selector label, so the Service and the
/// PodDisruptionBudget never select it.
pub fn pod_labels(cluster: &str, fingerprint: &str) -> BTreeMap<String, String> {
    let mut l = names::cluster_labels(cluster);
    l.remove(labels::CLUSTER);
    l.insert(
        labels::APP_COMPONENT.to_owned(),
        labels::COMPONENT_CONFIG_CHECK.to_owned(),
    );
    l.insert(
        labels::CONFIG_FINGERPRINT.to_owned(),
        fingerprint.to_owned(),
    );
    l
}

/// Label selector of every check pod of `cluster`.
pub fn selector(cluster: &str) -> String {
    format!(
        "{}={cluster},{}={}",
        labels::APP_INSTANCE,
        labels::APP_COMPONENT,
        labels::COMPONENT_CONFIG_CHECK
    )
}

/// The check pod of `spec` in `namespace`, owned by the cluster.
pub fn check_pod(
    cluster: &str,
    namespace: &str,
    spec: &ValkeyClusterSpec,
    owner: Option<OwnerReference>,
) -> Pod {
    let fp = fingerprint(spec);
    let quantity = |s: &str| Quantity(s.to_owned());
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(cluster, &fp)),
            namespace: Some(namespace.to_owned()),
            labels: Some(pod_labels(cluster, &fp)),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(DEADLINE_SECONDS),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(1),
            image_pull_secrets: spec.image_pull_secrets.clone(),
            node_selector: spec.scheduling.node_selector.clone(),
            tolerations: spec.scheduling.tolerations.clone(),
            priority_class_name: spec.scheduling.priority_class_name.clone(),
            security_context: Some(security::pod_security_context(
                spec.pod_security_context.as_ref(),
            )),
            // The check writes only here: the root filesystem is read-only.
            volumes: Some(vec![Volume {
                name: volumes::TMP.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: "check".into(),
                image: Some(spec.image.clone()),
                command: Some(vec!["sh".into(), "-c".into(), SCRIPT.into()]),
                env: Some(vec![EnvVar {
                    name: CONFIG_ENV.into(),
                    value: Some(checked_lines(spec)),
                    value_from: None,
                }]),
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                security_context: Some(security::container_security_context(
                    spec.security_context.as_ref(),
                )),
                volume_mounts: Some(vec![VolumeMount {
                    name: volumes::TMP.into(),
                    mount_path: TMP_DIR.into(),
                    ..Default::default()
                }]),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".into(), quantity("10m")),
                        ("memory".into(), quantity("16Mi")),
                    ])),
                    limits: Some(BTreeMap::from([("memory".into(), quantity("256Mi"))])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// What a finished check pod says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The server accepted every line.
    Accepted,
    /// The server refused a line: its explanation.
    Refused(String),
    /// The check could not judge (it was killed, evicted, timed out, or the image has no
    /// `sh`/`valkey-server`): what happened.
    Inconclusive(String),
}

/// The verdict of a check pod, `None` while it has not finished.
pub fn verdict(pod: &Pod) -> Option<Verdict> {
    let status = pod.status.as_ref()?;
    let phase = status.phase.as_deref()?;
    if phase != "Succeeded" && phase != "Failed" {
        return None;
    }
    let terminated = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref());
    let message = terminated
        .and_then(|t| t.message.clone())
        .map(|m| m.trim().replace('\n', " "))
        .filter(|m| !m.is_empty());
    Some(match terminated.map(|t| t.exit_code) {
        Some(0) if phase == "Succeeded" => Verdict::Accepted,
        Some(REFUSED_EXIT_CODE) => Verdict::Refused(
            message.unwrap_or_else(|| "the server refused the configuration".to_owned()),
        ),
        code => Verdict::Inconclusive(
            message
                .or_else(|| status.message.clone())
                .or_else(|| status.reason.clone())
                .unwrap_or_else(|| format!("the check ended with exit code {code:?}")),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> ValkeyClusterSpec {
        serde_json::from_value(json).expect("spec")
    }

    #[test]
    fn fingerprint_covers_image_and_settings_only() {
        let a = spec(
            serde_json::json!({"shards": 3, "image": "valkey/valkey:8.0.1", "config": {"maxmemory": "1gb"}}),
        );
        let b = spec(
            serde_json::json!({"shards": 3, "image": "valkey/valkey:9.0.0", "config": {"maxmemory": "1gb"}}),
        );
        let c = spec(
            serde_json::json!({"shards": 3, "image": "valkey/valkey:8.0.1", "config": {"maxmemory": "2gb"}}),
        );
        let d = spec(
            serde_json::json!({"shards": 3, "image": "valkey/valkey:8.0.1", "replicas": 2, "config": {"maxmemory": "1gb"}}),
        );
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
        assert_eq!(fingerprint(&a), fingerprint(&d));
        assert_eq!(checked_lines(&a), "maxmemory 1gb\n");
    }

    #[test]
    fn check_pod_is_outside_the_cluster_selector() {
        let s = spec(
            serde_json::json!({"shards": 3, "image": "valkey/valkey:8.0.1", "config": {"maxmemory": "1gb"}}),
        );
        let pod = check_pod("c", "ns", &s, None);
        let l = pod.metadata.labels.clone().unwrap_or_default();
        assert!(!l.contains_key(labels::CLUSTER));
        assert_eq!(l.get(labels::CONFIG_FINGERPRINT), Some(&fingerprint(&s)));
        let c = &pod.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            c.env.as_ref().unwrap()[0].value.as_deref(),
            Some("maxmemory 1gb\n")
        );
        assert_eq!(
            c.termination_message_policy.as_deref(),
            Some("FallbackToLogsOnError")
        );
    }

    fn finished(phase: &str, code: i32, message: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "check", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": code, "message": message}}}]}
        }))
        .expect("pod")
    }

    #[test]
    fn verdicts_from_exit_codes() {
        assert_eq!(
            verdict(&finished("Succeeded", 0, None)),
            Some(Verdict::Accepted)
        );
        assert_eq!(
            verdict(&finished(
                "Failed",
                1,
                Some("*** FATAL ***\n>>> 'foo 1'\nBad directive\n")
            )),
            Some(Verdict::Refused(
                "*** FATAL *** >>> 'foo 1' Bad directive".into()
            ))
        );
        assert!(matches!(
            verdict(&finished("Failed", 137, None)),
            Some(Verdict::Inconclusive(_))
        ));
        let running: Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}}),
        )
        .unwrap();
        assert_eq!(verdict(&running), None);
    }

    /// The script against the real servers: accepted, refused with the line named, and a
    /// 9-only key refused by 8.
    #[test]
    fn script_judges_with_real_servers() {
        let Some(bin) = std::env::var_os("LOCALKUBE_BIN_DIR").map(std::path::PathBuf::from) else {
            eprintln!("skipped: LOCALKUBE_BIN_DIR is not set (no Valkey binaries)");
            return;
        };
        let run = |server: &str, conf: &str| {
            let dir = tempfile::tempdir().expect("tempdir");
            std::os::unix::fs::symlink(bin.join(server), dir.path().join("valkey-server"))
                .expect("link");
            let path = format!(
                "{}:{}",
                dir.path().display(),
                std::env::var("PATH").unwrap_or_default()
            );
            let out = std::process::Command::new("sh")
                .args(["-c", SCRIPT])
                .env("PATH", path)
                .env(CONFIG_ENV, conf)
                .current_dir(dir.path())
                .output()
                .expect("sh");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        for server in ["valkey-server-8", "valkey-server-9"] {
            if !bin.join(server).exists() {
                eprintln!("skipped {server}: not installed");
                continue;
            }
            assert_eq!(run(server, "maxmemory 1gb\n").0, Some(0), "{server}");
            let (code, out) = run(server, "maxmemory 1gb\nno-such-key yes\n");
            assert_eq!(code, Some(REFUSED_EXIT_CODE));
            assert!(out.contains("'no-such-key yes'"), "{out}");
            let (code, out) = run(server, "maxmemory lots\n");
            assert_eq!(code, Some(REFUSED_EXIT_CODE));
            assert!(out.contains("maxmemory lots"), "{out}");
        }
        if bin.join("valkey-server-8").exists() && bin.join("valkey-server-9").exists() {
            assert_eq!(run("valkey-server-9", "cluster-databases 4\n").0, Some(0));
            let (code, out) = run("valkey-server-8", "cluster-databases 4\n");
            assert_eq!(code, Some(REFUSED_EXIT_CODE), "{out}");
        }
    }
}
