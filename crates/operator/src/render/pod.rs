//! The pod template of a ValkeyNode: the `server` container, the `metrics-exporter` sidecar,
//! volumes, probes and scheduling, then `spec.containers` merged in.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    ExecAction, KeyToPath, Lifecycle, LifecycleHandler, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, Probe, SecretKeySelector,
    SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use valkey_api::defaults::{
    CLUSTER_BUS_PORT, EXPORTER_CONTAINER, EXPORTER_PORT, SERVER_CONTAINER, VALKEY_PORT,
};
use valkey_api::labels::CONFIG_HASH_ANNOTATION;
use valkey_api::{ValkeyNodeSpec, WorkloadType};
use valkey_ops::commands::acl::EXPORTER_USER;

use super::containers::{MergeError, merge_containers};
use super::paths::{ACL_DIR, ACL_KEY, CONFIG_DIR, DATA_DIR, SYSTEM_DIR, TLS_DIR};
use super::secrets::{EXPORTER_PASSWORD_KEY, REPLICATION_CONF_KEY};
use super::{handover, names, probes, start};

/// Volume names.
pub mod volumes {
    /// ConfigMap with `valkey.conf` and probe scripts.
    pub const CONFIG: &str = "config";
    /// ACL Secret.
    pub const ACL: &str = "acl";
    /// System Secret (only `replication.conf` and the exporter password are projected).
    pub const SYSTEM: &str = "system";
    /// TLS Secret.
    pub const TLS: &str = "tls";
    /// Data directory.
    pub const DATA: &str = "data";
    /// `/tmp` (an emptyDir: the root filesystem is read-only).
    pub const TMP: &str = "tmp";
}

/// Where the `tmp` volume is mounted.
pub const TMP_DIR: &str = "/tmp";

/// Environment variable carrying the pod IP (expanded in the server's args).
pub const POD_IP_ENV: &str = "POD_IP";

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn secret_volume(name: &str, secret: String, items: Option<Vec<KeyToPath>>) -> Volume {
    Volume {
        name: name.to_owned(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            items,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn key(k: &str) -> KeyToPath {
    KeyToPath {
        key: k.to_owned(),
        path: k.to_owned(),
        ..Default::default()
    }
}

fn pod_volumes(node_name: &str, spec: &ValkeyNodeSpec) -> Vec<Volume> {
    let cluster = &spec.cluster_name;
    let mut v = vec![
        Volume {
            name: volumes::CONFIG.to_owned(),
            config_map: Some(ConfigMapVolumeSource {
                name: spec
                    .config
                    .config_map_name
                    .clone()
                    .unwrap_or_else(|| names::config_map_name(cluster)),
                ..Default::default()
            }),
            ..Default::default()
        },
        secret_volume(
            volumes::ACL,
            spec.acl_secret_name
                .clone()
                .unwrap_or_else(|| names::acl_secret_name(cluster)),
            Some(vec![key(ACL_KEY)]),
        ),
        secret_volume(
            volumes::SYSTEM,
            names::system_secret_name(cluster),
            Some(vec![key(REPLICATION_CONF_KEY), key(EXPORTER_PASSWORD_KEY)]),
        ),
    ];
    if let Some(tls) = &spec.tls_secret_name {
        v.push(secret_volume(volumes::TLS, tls.clone(), None));
    }
    let data = if persistent(spec) {
        Volume {
            name: volumes::DATA.to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: names::pvc_name(node_name),
                ..Default::default()
            }),
            ..Default::default()
        }
    } else {
        Volume {
            name: volumes::DATA.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }
    };
    v.push(data);
    v.push(Volume {
        name: volumes::TMP.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    v
}

/// Period of the server's readiness probe. Its first run usually comes before the server
/// listens, so a new pod becomes ready one period after it starts; every step of a rolling
/// update and the cluster's `Ready` wait for that. 2 s rather than 5 s brought a 3×1 roll's
/// steps from 10 s to 7 s apart and its Ready from 52–53 s to 32–37 s (`bench_failover`).
pub const READINESS_PERIOD_SECONDS: i32 = 2;

fn exec_probe(command: Vec<String>, period: i32, failure_threshold: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(command),
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(5),
        failure_threshold: Some(failure_threshold),
        ..Default::default()
    }
}

fn port(name: &str, p: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: p,
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// Whether `/data` is a PersistentVolumeClaim.
fn persistent(spec: &ValkeyNodeSpec) -> bool {
    spec.persistence.is_some() && spec.workload_type == WorkloadType::StatefulSet
}

fn server_container(spec: &ValkeyNodeSpec) -> Container {
    let mut mounts = vec![
        mount(volumes::CONFIG, CONFIG_DIR, true),
        mount(volumes::ACL, ACL_DIR, true),
        mount(volumes::SYSTEM, SYSTEM_DIR, true),
    ];
    if spec.tls_secret_name.is_some() {
        mounts.push(mount(volumes::TLS, TLS_DIR, true));
    }
    mounts.push(mount(volumes::DATA, DATA_DIR, false));
    mounts.push(mount(volumes::TMP, TMP_DIR, false));
    Container {
        name: SERVER_CONTAINER.to_owned(),
        image: Some(spec.image.clone()),
        // The start script execs the image's entrypoint with `valkey-server`
        // (see render/start.rs for what it does on a restart).
        command: Some(start::start_command()),
        env: Some(vec![EnvVar {
            name: POD_IP_ENV.to_owned(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(vec![
            port("valkey", VALKEY_PORT),
            port("cluster-bus", CLUSTER_BUS_PORT),
        ]),
        resources: spec.resources.clone(),
        security_context: spec.security_context.clone(),
        volume_mounts: Some(mounts),
        readiness_probe: Some(exec_probe(
            probes::readiness_command(),
            READINESS_PERIOD_SECONDS,
            3,
        )),
        liveness_probe: Some(exec_probe(probes::liveness_command(), 10, 6)),
        // A primary's SIGTERM waits for the operator's coordinated hand-over.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                exec: Some(ExecAction {
                    command: Some(handover::handover_command()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.to_owned()),
        ..Default::default()
    }
}

fn exporter_container(spec: &ValkeyNodeSpec) -> Option<Container> {
    let exporter = spec.exporter.as_ref()?;
    let tls = spec.tls_secret_name.is_some();
    let scheme = if tls { "rediss" } else { "redis" };
    let mut envs = vec![
        env("REDIS_ADDR", &format!("{scheme}://localhost:{VALKEY_PORT}")),
        env("REDIS_USER", EXPORTER_USER),
        EnvVar {
            name: "REDIS_PASSWORD".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: names::system_secret_name(&spec.cluster_name),
                    key: EXPORTER_PASSWORD_KEY.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    if tls {
        // Loopback inside the pod: the certificate does not name localhost.
        envs.push(env("REDIS_EXPORTER_SKIP_TLS_VERIFICATION", "true"));
    }
    Some(Container {
        name: EXPORTER_CONTAINER.to_owned(),
        image: Some(exporter.image.clone()),
        // Flags win over the environment above, so user args can override it.
        args: exporter.args.clone(),
        env: Some(envs),
        ports: Some(vec![port("metrics", EXPORTER_PORT)]),
        resources: exporter.resources.clone(),
        security_context: exporter.security_context.clone(),
        ..Default::default()
    })
}

/// The pod template of the ValkeyNode `node_name`.
pub fn pod_template(node_name: &str, spec: &ValkeyNodeSpec) -> Result<PodTemplateSpec, MergeError> {
    let mut containers = vec![server_container(spec)];
    containers.extend(exporter_container(spec));
    let containers = merge_containers(containers, spec.containers.as_deref().unwrap_or_default())?;
    let s = &spec.scheduling;
    let annotations: BTreeMap<String, String> = spec
        .config
        .hash
        .iter()
        .map(|h| (CONFIG_HASH_ANNOTATION.to_owned(), h.clone()))
        .collect();
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(names::node_labels(
                &spec.cluster_name,
                spec.shard_index,
                spec.node_index,
            )),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers,
            volumes: Some(pod_volumes(node_name, spec)),
            image_pull_secrets: spec.image_pull_secrets.clone(),
            tolerations: s.tolerations.clone(),
            node_selector: s.node_selector.clone(),
            affinity: s.affinity.clone(),
            priority_class_name: s.priority_class_name.clone(),
            topology_spread_constraints: s.topology_spread_constraints.clone(),
            termination_grace_period_seconds: Some(spec.termination_grace_period_seconds),
            security_context: spec.pod_security_context.clone(),
            enable_service_links: Some(false),
            ..Default::default()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::valkeynode::tests::cluster;
    use crate::render::valkeynode::{NodeInputs, valkey_node};

    fn template(json: serde_json::Value) -> PodTemplateSpec {
        let n = valkey_node(&cluster(json), 0, 1, &NodeInputs::default(), None);
        pod_template("c-0-1", &n.spec).unwrap()
    }

    #[test]
    fn default_pod_snapshot() {
        insta::assert_yaml_snapshot!(template(serde_json::json!({"shards": 3, "replicas": 1})));
    }

    #[test]
    fn tls_persistence_sidecar_snapshot() {
        insta::assert_yaml_snapshot!(template(serde_json::json!({
            "shards": 1, "replicas": 1,
            "imagePullSecrets": [{"name": "regcred"}],
            "persistence": {"size": "1Gi"},
            "networking": {"tls": {"certificate": {"secretName": "tls"}}},
            "exporter": {"args": ["-ping-on-connect"], "resources": {"requests": {"cpu": "50m"}}},
            "containers": [{"name": "server", "env": [{"name": "MY_VAR", "value": "example"}]},
                           {"name": "my-sidecar", "image": "busybox:latest", "command": ["sh", "-c", "sleep infinity"]}],
            "scheduling": {"priorityClassName": "high", "nodeSelector": {"kubernetes.io/arch": "amd64"}}
        })));
    }

    #[test]
    fn exporter_disabled_removes_sidecar_and_no_plain_secrets() {
        let t = template(serde_json::json!({"shards": 1, "exporter": {"enabled": false}}));
        let spec = t.spec.unwrap();
        assert_eq!(spec.containers.len(), 1);
        let data = spec
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "data")
            .unwrap();
        assert!(data.empty_dir.is_some());
        let yaml = serde_json::to_string(&spec.containers).unwrap();
        assert!(!yaml.contains("primaryauth"));
    }

    #[test]
    fn template_is_stable_when_nothing_opted_in() {
        // No scheduling set: no affinity and no spread constraints at all.
        let t = template(serde_json::json!({"shards": 2}));
        let spec = t.spec.clone().unwrap();
        assert!(spec.affinity.is_none());
        assert!(spec.topology_spread_constraints.is_none());
        assert_eq!(t, template(serde_json::json!({"shards": 2})));
    }
}
