//! Helpers shared by the kubelet end-to-end tests (they need root).
#![allow(dead_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::support::is_root() {
            eprintln!("skipped: needs root for network/mount namespaces and bridges");
            return;
        }
    };
}

/// A default localkube with `localkube=info` logs, or `None` (skipped, said on stderr) when
/// not root.
pub async fn start_env() -> Option<localkube::Env> {
    if !is_root() {
        eprintln!("skipped: needs root for network/mount namespaces and bridges");
        return None;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter("localkube=info")
        .try_init();
    Some(
        localkube::Env::start(localkube::Options::default())
            .await
            .expect("localkube starts"),
    )
}

/// [`start_env`] with namespace `ns` created: the env, its client and the pods of `ns`.
pub async fn start_env_in(ns: &str) -> Option<(localkube::Env, Client, Api<Pod>)> {
    let env = start_env().await?;
    let client = env.client();
    create_ns(&client, ns).await;
    let pods = Api::namespaced(client.clone(), ns);
    Some((env, client, pods))
}

pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until pod `name` is Ready; on timeout the panic shows its status.
pub async fn ready(pods: &Api<Pod>, name: &str, timeout: Duration) -> Pod {
    let start = Instant::now();
    loop {
        let pod = pods.get_opt(name).await.ok().flatten();
        if let Some(p) = pod.as_ref().filter(|p| pod_ready(p)) {
            return p.clone();
        }
        if start.elapsed() > timeout {
            let status = pod
                .and_then(|p| p.status)
                .map(|s| serde_json::to_string_pretty(&s).unwrap_or_default());
            panic!(
                "timed out after {timeout:?} waiting for pod {name} to be Ready; status: {status:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn create_ns(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    // The service account controller creates "default" asynchronously.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), name);
    wait_for(
        "default service account",
        Duration::from_secs(30),
        || async { sas.get_opt("default").await.ok().flatten() },
    )
    .await;
}

pub fn ping(ip: &str, port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().unwrap(),
        Duration::from_secs(1),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// The log of a container instance (the kubelet's `/var/log/pods` equivalent).
pub fn log_of(dir: &Path, pod: &Pod, container: &str, instance: u32) -> String {
    let path: PathBuf = dir
        .join("kubelet/pods")
        .join(pod.uid().unwrap())
        .join("logs")
        .join(container)
        .join(format!("{instance}.log"));
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits up to `timeout` for `marker` in the log of the first instance of `pod`'s container
/// `main`.
pub async fn wait_for_main_log(dir: &Path, pod: &Pod, marker: &str, timeout: Duration) {
    let what = format!("{marker:?} in the log of pod {}", pod.name_any());
    wait_for(&what, timeout, || {
        let log = log_of(dir, pod, "main", 0);
        async move { log.contains(marker).then_some(()) }
    })
    .await;
}
