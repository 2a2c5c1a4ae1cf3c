//! A whole localkube environment: control plane, nodes and process-backed
//! pods, started from a test or the CLI and torn down when stopped or dropped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Taint;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::binaries::{Binaries, bin_dir};
use crate::controlplane::{ControlPlane, ControlPlaneConfig};
use crate::kubelet::{Faults, KubeletConfig, Kubelets, NodeSpec};
use crate::runtime::{self, ImageTable, Network, NetworkConfig};
use crate::slot::Slot;

/// Name of the default StorageClass the environment provisions volumes for.
pub const STORAGE_CLASS: &str = "standard";

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
    /// Allocatable CPU of each node.
    pub node_cpu: String,
    /// Allocatable memory of each node.
    pub node_memory: String,
    /// Maximum pods per node.
    pub node_pods: u32,
    /// Pod CIDR; by default a /24 slice of 10.244.0.0/16 unique on this machine.
    pub pod_cidr: Option<ipnet::Ipv4Net>,
    /// Narrows the default /24 slice to this prefix length (25 to 30): fewer pod addresses,
    /// so a released one serves another pod sooner (tests of address reuse).
    pub pod_cidr_prefix: Option<u8>,
    /// Image table file (YAML/JSON, see [`runtime::images`]); the built-in table when `None`.
    pub image_table: Option<PathBuf>,
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
            node_cpu: "4".to_string(),
            node_memory: "8Gi".to_string(),
            node_pods: 110,
            pod_cidr: None,
            pod_cidr_prefix: None,
            image_table: None,
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

/// The nodes of an environment: `node-1` … `node-N`, zones round robin.
pub fn node_specs(opts: &Options) -> Vec<NodeSpec> {
    let zones = opts.zones.max(1);
    (0..opts.nodes)
        .map(|i| NodeSpec {
            name: format!("node-{}", i + 1),
            zone: zone_name(i % zones),
            labels: opts.node_labels.clone(),
            taints: opts.node_taints.clone(),
            cpu: opts.node_cpu.clone(),
            memory: opts.node_memory.clone(),
            pods: opts.node_pods,
        })
        .collect()
}

/// A running environment.
pub struct Env {
    client: Client,
    control_plane: Option<ControlPlane>,
    kubelets: Option<Kubelets>,
    network: Option<Arc<Network>>,
    bridge: String,
    dir: PathBuf,
    node_names: Vec<String>,
    // Dropped last: the directory, then the slot lock.
    _tempdir: Option<tempfile::TempDir>,
    _slot: Slot,
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
        // Traversable by anyone (not listable unless it already was): containers running as
        // non-root (`runAsUser`) reach the image bin dirs under it.
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir)?.permissions().mode();
            std::fs::set_permissions(&dir, PermissionsExt::from_mode(mode | 0o711))?;
        }
        let bridge = slot.bridge();
        std::fs::write(dir.join("bridge"), &bridge)?;
        let with_pods = opts.kubelets && opts.nodes > 0;
        let network = if with_pods {
            // A crashed run that held this slot may have left its bridge.
            let _ = runtime::cleanup_leftovers(&dir, &bridge);
            let cidr = opts.pod_cidr.unwrap_or_else(|| {
                let slice = slot.pod_cidr();
                opts.pod_cidr_prefix
                    .and_then(|p| ipnet::Ipv4Net::new(slice.network(), p.clamp(24, 30)).ok())
                    .unwrap_or(slice)
            });
            // What every pod shares with the host, sized for as many pods as the nodes and
            // the CIDR (less its network, gateway and broadcast addresses) allow.
            let addresses = 1u64 << (32 - u32::from(cidr.prefix_len())).min(32);
            let pods = (opts.nodes as u64 * u64::from(opts.node_pods))
                .min(addresses.saturating_sub(3))
                .min(runtime::host_limits::MAX_BRIDGE_PORTS);
            tokio::task::spawn_blocking(move || runtime::host_limits::size_for(pods)).await?;
            let cfg = NetworkConfig {
                bridge: bridge.clone(),
                cidr,
            };
            Some(Arc::new(
                tokio::task::spawn_blocking(move || Network::create(cfg)).await??,
            ))
        } else {
            None
        };
        let control_plane = ControlPlane::start(ControlPlaneConfig {
            dir: dir.clone(),
            binaries,
            advertise_ip: network.as_ref().map(|n| n.gateway()),
            controllers: opts.controllers,
        })
        .await?;
        let client = client_from_kubeconfig(control_plane.kubeconfig()).await?;
        let nodes = if with_pods {
            node_specs(&opts)
        } else {
            Vec::new()
        };
        let node_names = nodes.iter().map(|n| n.name.clone()).collect();
        let kubelets = match &network {
            Some(network) => {
                let images_dir = dir.join("images");
                let images = match &opts.image_table {
                    Some(file) => ImageTable::from_file(file, &bin_dir(), &images_dir)?,
                    None => ImageTable::default_table(&bin_dir(), &images_dir)?,
                };
                Some(
                    Kubelets::start(KubeletConfig {
                        client: client.clone(),
                        nodes,
                        state_dir: dir.join("kubelet"),
                        network: network.clone(),
                        images,
                        api_host: control_plane.api_host.clone(),
                        api_port: control_plane.apiserver_port,
                        storage_class: STORAGE_CLASS.to_string(),
                        tls: Some(crate::kubelet::server::KubeletTls {
                            cert: control_plane.pki.kubelet_serving.cert.clone(),
                            key: control_plane.pki.kubelet_serving.key.clone(),
                            client_ca: control_plane.pki.ca_cert.clone(),
                        }),
                    })
                    .await?,
                )
            }
            None => None,
        };
        if kubelets.is_some() && opts.controllers {
            wait_nodes_schedulable(&client).await?;
        }
        tracing::info!(
            elapsed_ms = t0.elapsed().as_millis() as u64,
            dir = %dir.display(),
            "localkube ready"
        );
        Ok(Env {
            client,
            control_plane: Some(control_plane),
            kubelets,
            network,
            bridge,
            dir,
            node_names,
            _tempdir: tempdir,
            _slot: slot,
        })
    }

    /// Fault injection (kill/pause containers, cut pod networks, stop nodes).
    /// `None` for an environment without pods.
    pub fn faults(&self) -> Option<Faults> {
        self.kubelets.as_ref().map(|k| k.faults())
    }

    /// The pod network's gateway (the host's address on the pod bridge).
    pub fn gateway(&self) -> Option<std::net::Ipv4Addr> {
        self.network.as_ref().map(|n| n.gateway())
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
        self.control_plane
            .as_ref()
            .map(|c| c.pids())
            .unwrap_or_default()
    }

    /// Stops everything and removes what the environment created.
    pub async fn stop(mut self) {
        if let Some(k) = self.kubelets.take() {
            k.shutdown().await;
        }
        if let Some(cp) = self.control_plane.take() {
            cp.stop().await;
        }
        self.cleanup();
    }

    fn cleanup(&mut self) {
        if let Some(network) = self.network.take() {
            let _ = network.teardown();
            if let Err(e) = runtime::cleanup_leftovers(&self.dir, &self.bridge) {
                tracing::warn!(error = %e, "cleanup of the environment failed");
            }
        }
    }
}

impl Drop for Env {
    /// A dropped (not stopped) environment still removes its processes,
    /// namespaces, bridge and mounts; control-plane processes are killed.
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Waits until the node lifecycle controller has seen every node Ready and
/// removed the `node.kubernetes.io/not-ready` taint it puts on new nodes, so
/// that pods created right after start are schedulable at once.
async fn wait_nodes_schedulable(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let list = nodes.list(&Default::default()).await?;
        let pending: Vec<String> = list
            .items
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| {
                        t.iter().any(|t| {
                            matches!(
                                t.key.as_str(),
                                "node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable"
                            )
                        })
                    })
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("nodes still carry node-lifecycle taints after 60s: {pending:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Builds a client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}
