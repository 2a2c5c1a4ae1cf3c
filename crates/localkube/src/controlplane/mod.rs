//! The real Kubernetes control plane: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler as child processes, with a PKI
//! generated at start and readiness checked on each component's health
//! endpoint.

mod kubeconfig;
mod process;

pub use kubeconfig::write_kubeconfig;
pub use process::{Component, free_port, kill_recorded, log_tail};

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::binaries::Binaries;
use crate::certs::{CertFiles, Pki, ServingNames};

/// The `kubernetes` Service's cluster IP (first address of the service range).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// What to start.
#[derive(Debug, Clone)]
pub struct ControlPlaneConfig {
    /// State directory (PKI, etcd data, logs, kubeconfigs).
    pub dir: PathBuf,
    pub binaries: Binaries,
    /// Address pods use to reach the apiserver (the pod bridge's gateway).
    /// `None` runs the apiserver for host clients only (no pods).
    pub advertise_ip: Option<Ipv4Addr>,
    /// Start kube-controller-manager and kube-scheduler too.
    pub controllers: bool,
}

/// Errors while starting the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Certs(#[from] crate::certs::CertError),
    #[error("{0}")]
    Died(String),
    #[error("{component} did not become healthy within {seconds}s; last log lines:\n{log}")]
    Timeout {
        component: String,
        seconds: u64,
        log: String,
    },
    #[error("http client: {0}")]
    Http(#[from] reqwest::Error),
}

/// A running control plane.
#[derive(Debug)]
pub struct ControlPlane {
    pub pki: Pki,
    pub apiserver_port: u16,
    /// Admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// Host/port pods use for `KUBERNETES_SERVICE_HOST/PORT`.
    pub api_host: String,
    components: Vec<Component>,
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// The flags kube-controller-manager and kube-scheduler share: `kubeconfig` for the API
/// and for delegated authn/authz, serving on 127.0.0.1:`port` with certificates in
/// `cert_dir`, no leader election.
fn secure_controller_args(kubeconfig: &Path, port: u16, cert_dir: &Path) -> Vec<String> {
    let kubeconfig = kubeconfig.display();
    vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        s("--bind-address=127.0.0.1"),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", cert_dir.display()),
        s("--leader-elect=false"),
    ]
}

impl ControlPlane {
    /// Starts etcd, then the apiserver, then (optionally) the controller
    /// manager and the scheduler, waiting for each to be healthy.
    pub async fn start(cfg: ControlPlaneConfig) -> Result<ControlPlane, ControlPlaneError> {
        let dir = &cfg.dir;
        let pki_dir = dir.join("pki");
        let logs = dir.join("logs");
        std::fs::create_dir_all(&pki_dir)?;
        std::fs::create_dir_all(&logs)?;
        let extra: Vec<IpAddr> = cfg.advertise_ip.iter().map(|ip| IpAddr::V4(*ip)).collect();
        let pki = Pki::generate(
            &pki_dir,
            &ServingNames::apiserver(&extra, IpAddr::V4(SERVICE_IP)),
        )?;
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(2))
            .build()?;
        let mut components = Vec::new();
        let spawn = |name: &str, bin: &Path, args: &[String]| {
            Component::spawn(name, bin, args, &logs.join(format!("{name}.log")))
        };

        // etcd
        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            s("--name=localkube"),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=localkube={peer_url}"),
            s("--unsafe-no-fsync=true"),
            s("--log-level=warn"),
            s("--quota-backend-bytes=4294967296"),
        ];
        let mut etcd = spawn("etcd", &cfg.binaries.etcd, &etcd_args)?;
        let health = format!("{etcd_url}/health");
        wait_healthy(&http, &mut etcd, &health, Duration::from_secs(30)).await?;
        components.push(etcd);

        // kube-apiserver
        let api_port = free_port()?;
        let (bind, advertise, reconciler) = match cfg.advertise_ip {
            Some(ip) => ("0.0.0.0".to_string(), ip.to_string(), "lease"),
            None => ("127.0.0.1".to_string(), "127.0.0.1".to_string(), "none"),
        };
        let api_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--bind-address={bind}"),
            format!("--advertise-address={advertise}"),
            format!("--secure-port={api_port}"),
            format!("--endpoint-reconciler-type={reconciler}"),
            format!("--cert-dir={}", pki_dir.display()),
            format!("--tls-cert-file={}", pki.apiserver.cert.display()),
            format!("--tls-private-key-file={}", pki.apiserver.key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            s("--service-account-issuer=https://kubernetes.default.svc.cluster.local"),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            s("--authorization-mode=Node,RBAC"),
            // `kubectl logs` through the kubelets' API (kubelet::server), by node address.
            format!(
                "--kubelet-client-certificate={}",
                pki.kubelet_client.cert.display()
            ),
            format!("--kubelet-client-key={}", pki.kubelet_client.key.display()),
            format!("--kubelet-certificate-authority={}", pki.ca_cert.display()),
            s("--kubelet-preferred-address-types=InternalIP,Hostname"),
            s("--allow-privileged=true"),
            s("--profiling=false"),
            s("--v=1"),
        ];
        let mut apiserver = spawn("kube-apiserver", &cfg.binaries.kube_apiserver, &api_args)?;
        let api_url = format!("https://127.0.0.1:{api_port}");
        let health = format!("{api_url}/readyz");
        wait_healthy(&http, &mut apiserver, &health, Duration::from_secs(90)).await?;
        components.push(apiserver);

        let write_kubeconfig_of = |path: &Path, files: &CertFiles, user: &str| {
            write_kubeconfig(path, &api_url, &pki.ca_pem, &files.cert, &files.key, user)
        };
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig_of(&kubeconfig, &pki.admin, "localkube-admin")?;

        if cfg.controllers {
            let kcm_kc = pki_dir.join("controller-manager.kubeconfig");
            write_kubeconfig_of(
                &kcm_kc,
                &pki.controller_manager,
                "system:kube-controller-manager",
            )?;
            let sched_kc = pki_dir.join("scheduler.kubeconfig");
            write_kubeconfig_of(&sched_kc, &pki.scheduler, "system:kube-scheduler")?;
            let kcm_port = free_port()?;
            let mut kcm_args = secure_controller_args(&kcm_kc, kcm_port, &dir.join("kcm-certs"));
            kcm_args.extend([
                s("--controllers=*"),
                s("--use-service-account-credentials=true"),
                format!(
                    "--service-account-private-key-file={}",
                    pki.sa_key.display()
                ),
                format!("--root-ca-file={}", pki.ca_cert.display()),
                format!("--cluster-signing-cert-file={}", pki.ca_cert.display()),
                format!("--cluster-signing-key-file={}", pki.ca_key.display()),
                format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                s("--allocate-node-cidrs=false"),
                // Notice node readiness (and remove the not-ready taint of new
                // nodes) within a second instead of five.
                s("--node-monitor-period=1s"),
                // Each controller's client may make 20 requests a second by default (burst
                // 30): the StatefulSet controller's five per pod (create, event, status)
                // then pace a 64-shard cluster's 128 pods at about 4 a second. Large
                // clusters raise these; so does localkube, which shares its one API server
                // with nobody.
                s("--kube-api-qps=100"),
                s("--kube-api-burst=200"),
                s("--concurrent-statefulset-syncs=20"),
                s("--v=1"),
            ]);
            let mut kcm = spawn(
                "kube-controller-manager",
                &cfg.binaries.kube_controller_manager,
                &kcm_args,
            )?;
            let sched_port = free_port()?;
            let mut sched_args =
                secure_controller_args(&sched_kc, sched_port, &dir.join("scheduler-certs"));
            sched_args.push(s("--v=1"));
            let mut sched = spawn("kube-scheduler", &cfg.binaries.kube_scheduler, &sched_args)?;
            let kcm_url = format!("https://127.0.0.1:{kcm_port}/healthz");
            let sched_url = format!("https://127.0.0.1:{sched_port}/healthz");
            let limit = Duration::from_secs(60);
            let (a, b) = tokio::join!(
                wait_healthy(&http, &mut kcm, &kcm_url, limit),
                wait_healthy(&http, &mut sched, &sched_url, limit),
            );
            components.push(kcm);
            components.push(sched);
            a?;
            b?;
        }

        Ok(ControlPlane {
            pki,
            apiserver_port: api_port,
            kubeconfig,
            api_host: advertise,
            components,
        })
    }

    /// The admin kubeconfig path.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Process ids of the running components (for memory measurements).
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.components
            .iter()
            .filter_map(|c| c.pid().map(|p| (c.name.clone(), p)))
            .collect()
    }

    /// Stops the components in reverse start order.
    pub async fn stop(mut self) {
        while let Some(c) = self.components.pop() {
            c.stop(Duration::from_secs(5)).await;
        }
    }
}

/// Polls `url` until it answers 200, failing early if the process dies.
async fn wait_healthy(
    http: &reqwest::Client,
    component: &mut Component,
    url: &str,
    limit: Duration,
) -> Result<(), ControlPlaneError> {
    let start = Instant::now();
    loop {
        component.check_alive().map_err(ControlPlaneError::Died)?;
        if let Ok(resp) = http.get(url).send().await
            && resp.status().is_success()
        {
            tracing::info!(component = %component.name, elapsed_ms = start.elapsed().as_millis() as u64, "healthy");
            return Ok(());
        }
        if start.elapsed() > limit {
            return Err(ControlPlaneError::Timeout {
                component: component.name.clone(),
                seconds: limit.as_secs(),
                log: log_tail(&component.log, 20),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
