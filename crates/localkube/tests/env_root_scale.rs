//! localkube at 200 pods: 200 Valkey cluster nodes scheduled by the real scheduler and a
//! Deployment, plus one on the host (at the gateway address), meet into one 201-node
//! cluster. A cluster bus is a full mesh, so every node connected to every other one proves
//! that every pod reaches every pod and the host, and the host reaches every pod (the
//! neighbour table, connection tracking and file limits sized by `runtime::host_limits`).
//! Needs root (network and mount namespaces); CI runs as root.

#[macro_use]
mod support;
use support::*;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

const PODS: usize = 200;

fn cli(addr: &str, args: &[&str]) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    let out = Command::new("valkey-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node ids a node's `CLUSTER NODES` shows with a connected link (itself included).
fn connected_peers(addr: &str) -> Option<usize> {
    let nodes = cli(addr, &["cluster", "nodes"])?;
    Some(
        nodes
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() >= 8
                    && f[7] == "connected"
                    && !f[2].contains("handshake")
                    && !f[2].contains("fail")
                    && !f[2].contains("noaddr")
            })
            .count(),
    )
}

struct HostNode(Child);

impl Drop for HostNode {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn env_root_200_pods_reach_each_other_and_the_host() {
    let ns = "scale";
    let Some((env, client, pods)) = support::start_env_in(ns).await else {
        return;
    };
    // The environment sized what its pods share with the host (a /24 slice: 253 pods).
    for (sysctl, min) in localkube::runtime::host_limits::minimums(253) {
        if let Ok(v) = std::fs::read_to_string(format!("/proc/sys/{sysctl}")) {
            let v: u64 = v.trim().parse().unwrap();
            assert!(v >= min, "{sysctl} is {v}, below {min}");
        }
    }
    let t0 = Instant::now();
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "mesh"},
        "spec": {
            "replicas": PODS,
            "selector": {"matchLabels": {"app": "mesh"}},
            "template": {
                "metadata": {"labels": {"app": "mesh"}},
                "spec": {
                    "containers": [{
                        "name": "valkey",
                        "image": "valkey/valkey:9.0.0",
                        "args": ["--port", "6379", "--cluster-enabled", "yes",
                            "--cluster-node-timeout", "60000", "--save", "",
                            "--appendonly", "no", "--protected-mode", "no"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                    "terminationGracePeriodSeconds": 1,
                },
            },
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let ips: Vec<String> = wait_for(
        &format!("{PODS} running pods answering PING"),
        Duration::from_secs(300),
        || async {
            let list: Vec<Pod> = pods
                .list(&ListParams::default().labels("app=mesh"))
                .await
                .ok()?
                .items;
            let ips: Vec<String> = list
                .iter()
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .collect();
            (ips.len() == PODS && ips.iter().all(|ip| ping(ip, 6379))).then_some(ips)
        },
    )
    .await;
    let nodes: BTreeSet<String> = pods
        .list(&ListParams::default().labels("app=mesh"))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    eprintln!(
        "{PODS} pods on {} nodes answer PING from the host after {:.1}s",
        nodes.len(),
        t0.elapsed().as_secs_f64()
    );

    // One more cluster node on the host, at the gateway: every pod must connect to it.
    let gateway = env.gateway().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind(format!("{gateway}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = localkube::binaries::bin_dir().join("valkey-server-9");
    let _host = HostNode(
        Command::new(server)
            .current_dir(dir.path())
            .args(["--bind", &gateway, "--port", &port.to_string()])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "60000",
            ])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let host = format!("{gateway}:{port}");
    wait_for("the host node", Duration::from_secs(10), || async {
        ping(&gateway, port).then_some(())
    })
    .await;
    let t1 = Instant::now();
    for ip in &ips {
        let ok = cli(&host, &["cluster", "meet", ip, "6379"]).unwrap_or_default();
        assert_eq!(ok.trim(), "OK", "CLUSTER MEET {ip}");
    }
    let mut all: Vec<String> = ips.iter().map(|ip| format!("{ip}:6379")).collect();
    all.push(host.clone());
    let want = all.len();
    wait_for(
        &format!("every one of {want} nodes connected to all the others"),
        Duration::from_secs(300),
        || {
            let all = all.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    let short: Vec<(String, usize)> = all
                        .iter()
                        .map(|a| (a.clone(), connected_peers(a).unwrap_or(0)))
                        .filter(|(_, n)| *n < want)
                        .collect();
                    if !short.is_empty() {
                        eprintln!(
                            "{} nodes not fully connected yet, e.g. {:?}",
                            short.len(),
                            &short[..short.len().min(3)]
                        );
                    }
                    short.is_empty().then_some(())
                })
                .await
                .ok()
                .flatten()
            }
        },
    )
    .await;
    eprintln!(
        "{want}-node full mesh (pods and host) after {:.1}s",
        t1.elapsed().as_secs_f64()
    );
}
