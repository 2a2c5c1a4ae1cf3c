//! A whole localkube environment: control plane, nodes and process-backed
//! pods, started from a test or the CLI and torn down when stopped or dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use k8s_openapi::api::core::v1::Taint;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::binaries::Binaries;
use crate::controlplane::{ControlPlane, ControlPlaneConfig};
use crate::slot::Slot;

/// How to start an environment.
#[derive(Debug, Clone)]
pub struct Options {
    /// Number of nodes (0 for a control plane without nodes).
    pub nodes: usize,
    /// Number of zones the nodes are spread over (round robin).
    pub zones: usize,
    /// Start kube-controller-manager and kube-scheduler.
    pub controllers: bool,
    /// Run pods as processes on the nodes (needs root).
    pub kubelets: bool,
    /// Extra labels on every node.
    pub node_labels: BTreeMap<String, String>,
    /// Taints on every node.
    pub node_taints: Vec<Taint>,
    /// State directory; a fresh temporary directory when `None`.
    pub dir: Option<PathBuf>,
}

impl Default for Options {
    /// 6 nodes over 3 zones, full control plane, process pods.
    fn default() -> Self {
        Options {
            nodes: 6,
            zones: 3,
            controllers: true,
            kubelets: true,
            node_labels: BTreeMap::new(),
            node_taints: Vec::new(),
            dir: None,
        }
    }
}

impl Options {
    /// Only etcd and kube-apiserver (admission and API tests).
    pub fn apiserver_only() -> Self {
        Options {
            nodes: 0,
            zones: 0,
            controllers: false,
            kubelets: false,
            ..Options::default()
        }
    }
}

/// Zone names: `zone-a`, `zone-b`, …
pub fn zone_name(i: usize) -> String {
    let letter = (b'a' + (i % 26) as u8) as char;
    format!("zone-{letter}")
}

/// A running environment.
pub struct Env {
    client: Client,
    control_plane: Option<ControlPlane>,
    dir: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
    _slot: Slot,
    node_names: Vec<String>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("dir", &self.dir)
            .field("nodes", &self.node_names)
            .finish()
    }
}

impl Env {
    /// Starts an environment and waits until every component is ready.
    pub async fn start(opts: Options) -> anyhow::Result<Env> {
        let t0 = Instant::now();
        let binaries = Binaries::locate()?;
        let slot = Slot::acquire()?;
        let (dir, tempdir) = match &opts.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new().prefix("localkube-").tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        if opts.kubelets || opts.nodes > 0 {
            anyhow::bail!("nodes and process pods are not wired into Env yet");
        }
        let control_plane = ControlPlane::start(ControlPlaneConfig {
            dir: dir.clone(),
            binaries,
            advertise_ip: None,
            controllers: opts.controllers,
        })
        .await?;
        let client = client_from_kubeconfig(control_plane.kubeconfig()).await?;
        tracing::info!(elapsed_ms = t0.elapsed().as_millis() as u64, dir = %dir.display(), "localkube ready");
        Ok(Env {
            client,
            control_plane: Some(control_plane),
            dir,
            _tempdir: tempdir,
            _slot: slot,
            node_names: Vec::new(),
        })
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Names of the nodes.
    pub fn node_names(&self) -> &[String] {
        &self.node_names
    }

    /// Process ids of the control-plane components.
    pub fn control_plane_pids(&self) -> Vec<(String, u32)> {
        self.control_plane.as_ref().map(|c| c.pids()).unwrap_or_default()
    }

    /// Stops everything and removes what the environment created.
    pub async fn stop(mut self) {
        if let Some(cp) = self.control_plane.take() {
            cp.stop().await;
        }
    }
}

/// Builds a client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}
