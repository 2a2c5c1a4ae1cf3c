//! A container's environment as the kubelet builds it
//! (`makeEnvironmentVariables`): `envFrom` sources first, then `env` entries
//! in order (values `$(VAR)`-expanded against the variables defined so far
//! and the service variables), then the service variables not already set.
//! Also the container's argv with `$(VAR)` expanded in `command` and `args`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use thiserror::Error;

use super::expand::{expand, lookup_in};
use super::fieldpath::{FieldPathError, PodRuntimeInfo, field_value, resource_value};

/// Why a container's environment could not be built (the kubelet reports
/// these as `CreateContainerConfigError`).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum EnvError {
    /// A referenced ConfigMap does not exist.
    #[error("configmap {0:?} not found")]
    ConfigMapNotFound(String),
    /// A referenced key is missing from a ConfigMap.
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKey {
        /// Namespace.
        namespace: String,
        /// ConfigMap name.
        name: String,
        /// Missing key.
        key: String,
    },
    /// A referenced Secret does not exist.
    #[error("secret {0:?} not found")]
    SecretNotFound(String),
    /// A referenced key is missing from a Secret.
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKey {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// Missing key.
        key: String,
    },
    /// A downward API selector failed.
    #[error(transparent)]
    FieldPath(#[from] FieldPathError),
}

/// Read access to the ConfigMaps and Secrets of the pod's namespace:
/// `None` when the object does not exist.
pub trait ObjectLookup {
    /// Data of a ConfigMap (`data` and `binaryData` as text).
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, String>>;
    /// Data of a Secret, decoded.
    fn secret(&self, name: &str) -> Option<BTreeMap<String, String>>;
}

/// The variables pointing containers at the API server (the `kubernetes`
/// service), in the Docker-links style the kubelet uses.
pub fn service_env(api_host: &str, api_port: u16) -> BTreeMap<String, String> {
    let url = format!("tcp://{api_host}:{api_port}");
    let p = api_port;
    [
        ("KUBERNETES_SERVICE_HOST".to_string(), api_host.to_string()),
        ("KUBERNETES_SERVICE_PORT".to_string(), p.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_string(), p.to_string()),
        ("KUBERNETES_PORT".to_string(), url.clone()),
        (format!("KUBERNETES_PORT_{p}_TCP"), url),
        (format!("KUBERNETES_PORT_{p}_TCP_PROTO"), "tcp".to_string()),
        (format!("KUBERNETES_PORT_{p}_TCP_PORT"), p.to_string()),
        (
            format!("KUBERNETES_PORT_{p}_TCP_ADDR"),
            api_host.to_string(),
        ),
    ]
    .into_iter()
    .collect()
}

/// Builds the environment of `container` in `pod`, in the kubelet's order.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    info: &PodRuntimeInfo,
    objects: &dyn ObjectLookup,
    service: &BTreeMap<String, String>,
    node_allocatable: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, EnvError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut order: Vec<String> = Vec::new();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let set =
        |order: &mut Vec<String>, vars: &mut BTreeMap<String, String>, k: String, v: String| {
            if vars.insert(k.clone(), v).is_none() {
                order.push(k);
            }
        };

    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        let data = if let Some(cm) = &source.config_map_ref {
            match objects.config_map(&cm.name) {
                Some(d) => d,
                None if cm.optional == Some(true) => continue,
                None => return Err(EnvError::ConfigMapNotFound(cm.name.clone())),
            }
        } else if let Some(s) = &source.secret_ref {
            match objects.secret(&s.name) {
                Some(d) => d,
                None if s.optional == Some(true) => continue,
                None => return Err(EnvError::SecretNotFound(s.name.clone())),
            }
        } else {
            continue;
        };
        for (k, v) in data {
            let key = format!("{prefix}{k}");
            // The kubelet skips keys that are not valid variable names.
            if is_env_var_name(&key) {
                set(&mut order, &mut vars, key, v);
            }
        }
    }

    for env in container.env.iter().flatten() {
        let value = if let Some(v) = env.value.as_deref().filter(|v| !v.is_empty()) {
            let maps = [&vars, service];
            expand(v, lookup_in(&maps))
        } else if let Some(from) = &env.value_from {
            if let Some(f) = &from.field_ref {
                field_value(pod, info, &f.field_path, false)?
            } else if let Some(r) = &from.resource_field_ref {
                let target = match r.container_name.as_deref().filter(|n| !n.is_empty()) {
                    None => container,
                    Some(name) => find_container(pod, name)
                        .ok_or_else(|| FieldPathError::NoContainer(name.to_string()))?,
                };
                resource_value(
                    target,
                    &r.resource,
                    r.divisor.as_ref().map(|d| d.0.as_str()),
                    node_allocatable,
                )?
            } else if let Some(k) = &from.config_map_key_ref {
                let value = key_ref(objects, false, &namespace, &k.name, &k.key, k.optional)?;
                let Some(v) = value else { continue };
                v
            } else if let Some(k) = &from.secret_key_ref {
                let value = key_ref(objects, true, &namespace, &k.name, &k.key, k.optional)?;
                let Some(v) = value else { continue };
                v
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        set(&mut order, &mut vars, env.name.clone(), value);
    }

    for (k, v) in service {
        if !vars.contains_key(k) {
            set(&mut order, &mut vars, k.clone(), v.clone());
        }
    }
    Ok(order
        .into_iter()
        .map(|k| {
            let v = vars.get(&k).cloned().unwrap_or_default();
            (k, v)
        })
        .collect())
}

/// The value of a `configMapKeyRef` (or, with `secret`, a `secretKeyRef`); `None` when the
/// object or the key is missing but the reference is optional.
fn key_ref(
    objects: &dyn ObjectLookup,
    secret: bool,
    namespace: &str,
    name: &str,
    key: &str,
    optional: Option<bool>,
) -> Result<Option<String>, EnvError> {
    let optional = optional == Some(true);
    let data = if secret {
        objects.secret(name)
    } else {
        objects.config_map(name)
    };
    let Some(data) = data else {
        return match (optional, secret) {
            (true, _) => Ok(None),
            (false, true) => Err(EnvError::SecretNotFound(name.to_string())),
            (false, false) => Err(EnvError::ConfigMapNotFound(name.to_string())),
        };
    };
    match data.get(key) {
        Some(v) => Ok(Some(v.clone())),
        None if optional => Ok(None),
        None => {
            let (namespace, name, key) = (namespace.to_string(), name.to_string(), key.to_string());
            Err(if secret {
                EnvError::SecretKey {
                    namespace,
                    name,
                    key,
                }
            } else {
                EnvError::ConfigMapKey {
                    namespace,
                    name,
                    key,
                }
            })
        }
    }
}

/// `command` and `args` with `$(VAR)` expanded against the container's environment.
pub fn expand_command(
    container: &Container,
    env: &[(String, String)],
) -> (Vec<String>, Vec<String>) {
    let map: BTreeMap<String, String> = env.iter().cloned().collect();
    let ex = |v: &Option<Vec<String>>| -> Vec<String> {
        v.iter()
            .flatten()
            .map(|s| expand(s, |n| map.get(n).cloned()))
            .collect()
    };
    (ex(&container.command), ex(&container.args))
}

fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// Whether `s` is a valid environment variable name (`[-._a-zA-Z][-._a-zA-Z0-9]*`).
pub fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_') => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource,
        ObjectFieldSelector, PodSpec, SecretEnvSource, SecretKeySelector,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    struct Objs;
    impl ObjectLookup for Objs {
        fn config_map(&self, name: &str) -> Option<BTreeMap<String, String>> {
            (name == "cm").then(|| {
                [
                    ("color".to_string(), "blue".to_string()),
                    ("1bad".into(), "x".into()),
                ]
                .into()
            })
        }
        fn secret(&self, name: &str) -> Option<BTreeMap<String, String>> {
            (name == "sec").then(|| [("password".to_string(), "s3cret".to_string())].into())
        }
    }

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        }
    }

    fn from(name: &str, src: EnvVarSource) -> EnvVar {
        EnvVar {
            name: name.into(),
            value_from: Some(src),
            ..Default::default()
        }
    }

    fn pod(c: Container) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![c],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn order_expansion_and_sources() {
        let c = Container {
            name: "c".into(),
            env_from: Some(vec![
                EnvFromSource {
                    config_map_ref: Some(ConfigMapEnvSource {
                        name: "cm".into(),
                        ..Default::default()
                    }),
                    prefix: Some("CM_".into()),
                    ..Default::default()
                },
                EnvFromSource {
                    secret_ref: Some(SecretEnvSource {
                        name: "missing".into(),
                        optional: Some(true),
                    }),
                    ..Default::default()
                },
            ]),
            env: Some(vec![
                from(
                    "POD_NAME",
                    EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.name".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ),
                var(
                    "GREETING",
                    "hi $(POD_NAME) $(LATER) $$(POD_NAME) $(KUBERNETES_SERVICE_HOST)",
                ),
                var("LATER", "l"),
                from(
                    "PW",
                    EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "sec".into(),
                            key: "password".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ),
                from(
                    "OPT",
                    EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "cm".into(),
                            key: "nope".into(),
                            optional: Some(true),
                        }),
                        ..Default::default()
                    },
                ),
                var("CM_color", "override"),
            ]),
            command: Some(vec!["sh".into(), "-c".into(), "echo $(GREETING)".into()]),
            args: Some(vec!["$(PW)".into(), "$(NOPE)".into(), "$$(PW)".into()]),
            ..Default::default()
        };
        let p = pod(c.clone());
        let service = service_env("10.1.0.1", 6443);
        let env = container_env(
            &p,
            &c,
            &PodRuntimeInfo::default(),
            &Objs,
            &service,
            &BTreeMap::new(),
        )
        .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(env[0].0, "CM_1bad");
        assert_eq!(env[1].0, "CM_color");
        assert_eq!(get("CM_color").unwrap(), "override");
        assert_eq!(get("CM_1bad").unwrap(), "x");
        assert_eq!(get("POD_NAME").unwrap(), "web-0");
        assert_eq!(
            get("GREETING").unwrap(),
            "hi web-0 $(LATER) $(POD_NAME) 10.1.0.1"
        );
        assert_eq!(get("PW").unwrap(), "s3cret");
        assert_eq!(get("OPT"), None);
        assert_eq!(get("KUBERNETES_SERVICE_PORT").unwrap(), "6443");
        let (cmd, args) = expand_command(&c, &env);
        assert_eq!(cmd[2], "echo hi web-0 $(LATER) $(POD_NAME) 10.1.0.1");
        assert_eq!(args, vec!["s3cret", "$(NOPE)", "$(PW)"]);
    }

    #[test]
    fn missing_required_sources_fail() {
        let c = Container {
            name: "c".into(),
            env: Some(vec![from(
                "X",
                EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: "cm".into(),
                        key: "nope".into(),
                        optional: None,
                    }),
                    ..Default::default()
                },
            )]),
            ..Default::default()
        };
        let p = pod(c.clone());
        let err = container_env(
            &p,
            &c,
            &PodRuntimeInfo::default(),
            &Objs,
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "couldn't find key nope in ConfigMap ns/cm");
    }
}
