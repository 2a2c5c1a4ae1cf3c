//! Benchmark: memory of the operator process managing many clusters on localkube.
//!
//! Starts localkube (needs root), runs the operator binary as its own process against it,
//! applies `CLUSTERS` ValkeyClusters of `SHARDS` × `REPLICAS` at once, waits until all are
//! Ready, idles a minute, and prints the operator's resident memory (VmRSS, and the peak
//! VmHWM) at each point plus the time to all Ready.
//!
//! ```sh
//! cargo build --release -p valkey-operator
//! cargo run --release -p e2e --example bench_operator_memory -- \
//!     [--clusters 10] [--shards 3] [--replicas 1] [--operator target/release/valkey-operator]
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube::api::Api;
use support::{Fixture, NS, create_cluster, create_user_secret};
use valkey_api::ValkeyCluster;
use valkey_api::status::ClusterState;

struct Args {
    clusters: usize,
    shards: i32,
    replicas: i32,
    operator: String,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        clusters: 10,
        shards: 3,
        replicas: 1,
        operator: "target/release/valkey-operator".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--clusters" => a.clusters = value.parse()?,
            "--shards" => a.shards = value.parse()?,
            "--replicas" => a.replicas = value.parse()?,
            "--operator" => a.operator = value,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// `VmRSS` and `VmHWM` of a process, in MiB.
fn memory(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<f64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("{name} missing"))?;
        let kib: f64 = line.split_whitespace().nth(1).context("value")?.parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

fn report(what: &str, child: &Child) -> anyhow::Result<()> {
    let (rss, hwm) = memory(child.id())?;
    println!("MEASURE operator memory {what}: RSS {rss:.1} MiB (peak {hwm:.1} MiB)");
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let Some(fx) = Fixture::start_with(localkube::Options::default(), false).await? else {
        return Ok(());
    };
    let env = &fx.env;
    let client = fx.client.clone();
    let mut operator = Command::new(&a.operator)
        .args(["run", "--metrics-address", "127.0.0.1:0"])
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", a.operator))?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    report("before any cluster", &operator)?;

    let started = Instant::now();
    for i in 0..a.clusters {
        let name = format!("m{i}");
        create_user_secret(&client, &format!("{name}-app"), "bench-password").await?;
        create_cluster(&client, &name, a.shards, a.replicas).await?;
    }
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    loop {
        let list = api.list(&Default::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .is_some_and(|s| s.state == ClusterState::Ready)
            })
            .count();
        if ready == a.clusters {
            break;
        }
        if started.elapsed() > Duration::from_secs(900) {
            bail!("only {ready} of {} clusters Ready after 900 s", a.clusters);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "MEASURE {} clusters of {}x{} apply → all Ready: {:.1}s",
        a.clusters,
        a.shards,
        a.replicas,
        started.elapsed().as_secs_f64()
    );
    report(&format!("with {} Ready clusters", a.clusters), &operator)?;
    tokio::time::sleep(Duration::from_secs(60)).await;
    report("after an idle minute", &operator)?;

    let _ = operator.kill();
    let _ = operator.wait();
    fx.stop().await;
    Ok(())
}
