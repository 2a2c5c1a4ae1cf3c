//! A full environment (needs root and the built binaries): six nodes in three
//! zones become Ready, and stopping it leaves no namespace, bridge, mount or
//! process behind.

use std::time::Instant;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;

#[tokio::test]
async fn root_env_starts_six_ready_nodes_and_tears_down_cleanly() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let env = localkube::Env::start(localkube::Options::default()).await?;
    let startup = t0.elapsed();
    eprintln!("localkube start-to-ready: {:.1}s", startup.as_secs_f64());
    let nodes: Api<Node> = Api::all(env.client());
    let list = nodes.list(&ListParams::default()).await?.items;
    assert_eq!(list.len(), 6);
    let mut zones = std::collections::BTreeSet::new();
    for n in &list {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        zones.insert(labels["topology.kubernetes.io/zone"].clone());
        assert_eq!(labels["kubernetes.io/os"], "linux");
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone());
        assert_eq!(ready.as_deref(), Some("True"), "{:?}", n.metadata.name);
    }
    assert_eq!(zones.len(), 3);
    let mut rss_kib = 0u64;
    for (name, pid) in env.control_plane_pids() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        eprintln!("{name}: {} MiB RSS", kib / 1024);
        rss_kib += kib;
    }
    eprintln!("control plane: {} MiB RSS", rss_kib / 1024);

    let bridge = std::fs::read_to_string(env.dir().join("bridge"))?;
    let dir = env.dir().to_path_buf();
    env.stop().await;
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()?;
    assert!(!String::from_utf8_lossy(&links.stdout).contains(bridge.trim()));
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()?;
    assert!(!String::from_utf8_lossy(&netns.stdout).contains(&format!("{}-", bridge.trim())));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    assert!(!mounts.contains(&dir.display().to_string()));
    Ok(())
}
