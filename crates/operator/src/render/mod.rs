//! Pure builders of the Kubernetes objects the operator applies (no I/O).
//!
//! Cluster-level objects (Service, ConfigMap, Secrets, PodDisruptionBudget, ValkeyNodes) are
//! rendered from a [`valkey_api::ValkeyCluster`]; the per-node workload (StatefulSet or
//! Deployment, pod template, PersistentVolumeClaim) from a [`valkey_api::ValkeyNode`].

pub mod acl;
pub mod config;
pub mod containers;
pub mod names;
pub mod pdb;
pub mod pod;
pub mod probes;
pub mod secrets;
pub mod service;
pub mod spread;
pub mod start;
pub mod valkeynode;
pub mod workload;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

/// Controller owner reference to `obj` (for `metadata.ownerReferences` of its children), with
/// `blockOwnerDeletion`: a `propagationPolicy: Foreground` delete of the owner then keeps it
/// until its children (and theirs: ValkeyCluster → ValkeyNode → workload → pod) are gone.
/// `None` when the object has no name or uid yet (not read back from the API server).
pub fn owner_reference<K>(obj: &K) -> Option<OwnerReference>
where
    K: Resource<DynamicType = ()>,
{
    obj.controller_owner_ref(&()).map(|r| OwnerReference {
        block_owner_deletion: Some(true),
        ..r
    })
}

/// Test support: start a real `valkey-server` on loopback and check it accepts a config.
#[cfg(test)]
pub(crate) mod test_server {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// The Valkey 8 (TLS-capable) server, if installed.
    pub fn valkey8() -> Option<PathBuf> {
        let p = PathBuf::from("/usr/bin/valkey-server");
        p.exists().then_some(p)
    }

    /// The Valkey 9 server from the dependency cache, if installed.
    pub fn valkey9() -> Option<PathBuf> {
        let p = PathBuf::from(std::env::var_os("HOME")?)
            .join(".cache/valkey-operator/bin/valkey-server-9");
        p.exists().then_some(p)
    }

    /// A free loopback TCP port.
    pub fn free_port() -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    /// A running server, killed on drop.
    pub struct Server {
        child: Child,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Starts `bin` with `conf` and `extra` args; waits until it answers on loopback `port`.
    /// Panics with the server's output if it exits or never listens.
    pub fn start(bin: &Path, conf: &Path, port: u16, extra: &[&str]) -> Server {
        let log = conf.with_extension("log");
        let mut child = Command::new(bin)
            .arg(conf)
            .args(extra)
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("valkey-server exited ({status}): {text}");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Server { child };
            }
            assert!(Instant::now() < deadline, "valkey-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_reference_is_controller_and_blocks_owner_deletion() {
        let mut vc: valkey_api::ValkeyCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"shards": 1}
        }))
        .unwrap();
        assert!(owner_reference(&vc).is_none(), "no uid yet");
        vc.metadata.uid = Some("u-1".into());
        let r = owner_reference(&vc).unwrap();
        assert_eq!(
            (r.kind.as_str(), r.name.as_str(), r.uid.as_str()),
            ("ValkeyCluster", "c", "u-1")
        );
        assert_eq!(r.api_version, "valkey.io/v1alpha1");
        assert_eq!(r.controller, Some(true));
        assert_eq!(r.block_owner_deletion, Some(true));
    }
}
