//! localkube: a real single-machine Kubernetes (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler built from the Kubernetes sources)
//! whose nodes are simulated honestly and whose pods are host processes in
//! their own network and mount namespaces. It is the base of the end-to-end
//! tests and of the demo; nothing in it knows about the Valkey operator.

pub mod binaries;
pub mod certs;
pub mod controlplane;
pub mod env;
pub mod kubelet;
pub mod runtime;
pub mod slot;

pub use env::{Env, Options};
pub use kubelet::Faults;

/// Removes whatever an environment using `dir` left behind after a crash:
/// control-plane processes, pods' processes, network namespaces, the bridge
/// and mounts.
pub fn down(dir: &std::path::Path) {
    let marker = dir.display().to_string();
    let killed = controlplane::kill_recorded(&dir.join("logs"), &marker);
    if !killed.is_empty() {
        tracing::info!(?killed, "killed leftover control-plane processes");
    }
    if let Ok(bridge) = std::fs::read_to_string(dir.join("bridge")) {
        match runtime::cleanup_leftovers(dir, bridge.trim()) {
            Ok(report) => tracing::info!(?report, "removed leftovers"),
            Err(e) => tracing::warn!(error = %e, "cleanup failed"),
        }
    }
}
