//! Benchmark: how the operator's cost grows with the shard count and the number of clusters,
//! on localkube (needs root), with the operator binary as its own process.
//!
//! For each `--shards` count N (default 3, 12, 24, 48, 64): an N×1 cluster from apply to
//! Ready; `--keys` keys loaded (default 1 000 000, 0 to skip); then, under the continuous
//! writer (`SET` + `WAIT 1`, every acknowledged write read back), a scale-out to
//! N × `--scale-out` shards (default 1.5) from patch to Ready with the even layout; every
//! loaded key read back; then the cluster is deleted. Then `--clusters` clusters of 3×1
//! (default 20, 0 to skip) applied at once, to all Ready, and an idle minute. Each phase
//! reports the operator's CPU seconds, RSS and API writes (requests that change objects the
//! operator owns: `valkey.io` objects, workloads, ConfigMaps, Secrets, Services, disruption
//! budgets, network policies and `events.k8s.io` events; leader-election renewals apart), and
//! the run ends with a Markdown table.
//!
//! ```sh
//! cargo build --release -p valkey-operator
//! cargo run --release -p e2e --example bench_scale -- \
//!     [--shards 3,12,24,48,64] [--scale-out 1.5] [--keys 1000000] [--clusters 20] \
//!     [--operator target/release/valkey-operator]
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use support::*;
use valkey_api::ValkeyCluster;
use valkey_api::status::ClusterState;

struct Args {
    shards: Vec<i32>,
    scale_out: f64,
    keys: u64,
    clusters: usize,
    operator: String,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        shards: vec![3, 12, 24, 48, 64],
        scale_out: 1.5,
        keys: 1_000_000,
        clusters: 20,
        operator: "target/release/valkey-operator".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--shards" => {
                a.shards = value
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
            }
            "--scale-out" => a.scale_out = value.parse()?,
            "--keys" => a.keys = value.parse()?,
            "--clusters" => a.clusters = value.parse()?,
            "--operator" => a.operator = value,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// The operator process: CPU seconds and RSS from `/proc`.
struct Operator(Child);

impl Operator {
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id()))?;
        // Fields after the command (which may hold spaces): state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')').context("stat")?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
        Ok(ticks / 100.0)
    }

    fn rss_mib(&self) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.0.id()))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .context("VmRSS")?
            .parse()?;
        Ok(kib / 1024.0)
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether an `apiserver_request_total` series counts a write to an object the operator owns.
fn operator_write(labels: &str) -> bool {
    let get = |k: &str| {
        labels
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
            .map(|v| v.trim_end_matches('"'))
            .unwrap_or("")
    };
    let verb = get("verb");
    if !matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY") {
        return false;
    }
    let (group, resource, sub) = (get("group"), get("resource"), get("subresource"));
    match group {
        "valkey.io" => true,
        "apps" => matches!(resource, "statefulsets" | "deployments") && sub.is_empty(),
        "" => matches!(resource, "configmaps" | "secrets" | "services"),
        "policy" => resource == "poddisruptionbudgets",
        "networking.k8s.io" => resource == "networkpolicies",
        "events.k8s.io" => true,
        _ => false,
    }
}

/// Writes the API server has served so far to objects the operator owns.
async fn api_writes(client: &Client) -> anyhow::Result<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("apiserver_request_total{"))
        .filter_map(|l| l.split_once("} "))
        .filter(|(labels, _)| operator_write(labels))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum())
}

/// What a phase cost the operator.
struct Cost {
    seconds: f64,
    cpu: f64,
    rss: f64,
    writes: f64,
}

/// Measures the operator's cost over `phase`.
async fn measured<T>(
    op: &Operator,
    client: &Client,
    phase: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<(T, Cost)> {
    let (t0, cpu0, w0) = (Instant::now(), op.cpu_seconds()?, api_writes(client).await?);
    let out = phase.await?;
    Ok((
        out,
        Cost {
            seconds: t0.elapsed().as_secs_f64(),
            cpu: op.cpu_seconds()? - cpu0,
            rss: op.rss_mib()?,
            writes: api_writes(client).await? - w0,
        },
    ))
}

/// `ip:6379` of one of the cluster's pods.
async fn seed_addr(client: &Client, name: &str) -> anyhow::Result<String> {
    let pods = pods_of(client, name).await?;
    let ip = pods.iter().find_map(pod_ip).context("no pod")?;
    Ok(format!("{ip}:6379"))
}

/// Slots per shard are even.
async fn check_even(client: &Client, name: &str, shards: i32, pw: &str) -> anyhow::Result<()> {
    let addr = seed_addr(client, name).await?;
    let layout = slot_layout(addr.trim_end_matches(":6379"), "_operator", pw).await?;
    let n = usize::try_from(shards)?;
    let mut got: Vec<usize> = layout.iter().map(|(s, _)| *s).collect();
    got.sort_unstable();
    let mut even: Vec<usize> = (0..n)
        .map(|i| 16384 / n + usize::from(i < 16384 % n))
        .collect();
    even.sort_unstable();
    ensure!(got == even, "{shards} shards, slots per shard {got:?}");
    Ok(())
}

/// The cluster's events whose reason starts with `Failover` (a primary changed during a
/// phase that should move none).
async fn failover_events(client: &Client, name: &str) -> anyhow::Result<usize> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| {
            e.reason
                .as_deref()
                .is_some_and(|r| r.starts_with("Failover"))
        })
        .count())
}

/// Deletes the cluster and waits for its pods to be gone.
async fn delete(client: &Client, name: &str) -> anyhow::Result<()> {
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await?;
    let t0 = Instant::now();
    while !pods_of(client, name).await?.is_empty() {
        ensure!(
            t0.elapsed() < Duration::from_secs(300),
            "{name}'s pods stay"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

struct Row {
    what: String,
    cost: Cost,
    note: String,
}

/// Prints the measurement of a phase and adds it to the table.
fn record(rows: &mut Vec<Row>, what: String, cost: Cost, note: String) {
    println!(
        "MEASURE {what}: {:.1}s (operator CPU {:.1}s, RSS {:.0} MiB, {} API writes) {note}",
        cost.seconds, cost.cpu, cost.rss, cost.writes
    );
    rows.push(Row { what, cost, note });
}

async fn shard_count(op: &Operator, client: &Client, n: i32, a: &Args) -> anyhow::Result<Vec<Row>> {
    let name = format!("s{n}");
    let pw = "bench-password";
    let mut rows = Vec::new();
    create_user_secret(client, &format!("{name}-app"), pw).await?;
    let (_, cost) = measured(op, client, async {
        create_cluster(client, &name, n, 1).await?;
        wait_ready(client, &name, n, Duration::from_secs(900)).await
    })
    .await?;
    record(
        &mut rows,
        format!("{n}×1 apply → Ready"),
        cost,
        String::new(),
    );
    let op_pw = system_operator_password(client, &name).await?;
    check_even(client, &name, n, &op_pw).await?;
    let pool = valkey_testkit::pool_for("app", pw, None);
    if a.keys > 0 {
        let t0 = Instant::now();
        valkey_testkit::write_keys(&pool, &seed_addr(client, &name).await?, a.keys).await;
        println!(
            "MEASURE {n}x1: loaded {} keys in {:.1}s",
            a.keys,
            t0.elapsed().as_secs_f64()
        );
    }
    let target = ((f64::from(n) * a.scale_out).round() as i32).max(n + 1);
    let writer = Writer::start(client, &name, pw, 1);
    let (_, cost) = measured(op, client, async {
        Api::<ValkeyCluster>::namespaced(client.clone(), NS)
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"shards": target}})),
            )
            .await?;
        wait_ready(client, &name, target, Duration::from_secs(1800)).await
    })
    .await?;
    let (acked, gap) = writer
        .stop_and_check(client, &name, pw, "the scale-out")
        .await?;
    check_even(client, &name, target, &op_pw).await?;
    if a.keys > 0 {
        let bad =
            valkey_testkit::count_bad_keys(&pool, &seed_addr(client, &name).await?, a.keys).await;
        ensure!(bad == 0, "{bad} of {} loaded keys lost", a.keys);
    }
    let note = format!(
        "{} keys; writer: {acked} acknowledged, 0 lost, longest gap {:.2}s; {} failover events",
        a.keys,
        gap.as_secs_f64(),
        failover_events(client, &name).await?
    );
    record(
        &mut rows,
        format!("{n} → {target} shards, patch → Ready"),
        cost,
        note,
    );
    delete(client, &name).await?;
    Ok(rows)
}

async fn many_clusters(op: &Operator, client: &Client, count: usize) -> anyhow::Result<Vec<Row>> {
    let names: Vec<String> = (0..count).map(|i| format!("m{i}")).collect();
    for name in &names {
        create_user_secret(client, &format!("{name}-app"), "bench-password").await?;
    }
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let (_, cost) = measured(op, client, async {
        for name in &names {
            create_cluster(client, name, 3, 1).await?;
        }
        let t0 = Instant::now();
        loop {
            let list = api.list(&Default::default()).await?;
            let ready = list
                .items
                .iter()
                .filter(|c| names.contains(&c.metadata.name.clone().unwrap_or_default()))
                .filter(|c| {
                    c.status
                        .as_ref()
                        .is_some_and(|s| s.state == ClusterState::Ready)
                })
                .count();
            if ready == count {
                return anyhow::Ok(());
            }
            ensure!(
                t0.elapsed() < Duration::from_secs(1200),
                "only {ready} of {count} clusters Ready"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await?;
    let mut rows = Vec::new();
    let note = format!("{:.2} s CPU per cluster", cost.cpu / count as f64);
    record(
        &mut rows,
        format!("{count} clusters of 3×1, apply → all Ready"),
        cost,
        note,
    );
    let (_, idle) = measured(op, client, async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        anyhow::Ok(())
    })
    .await?;
    let note = format!(
        "{:.3} s CPU and {:.1} MiB RSS per cluster",
        idle.cpu / count as f64,
        idle.rss / count as f64
    );
    record(
        &mut rows,
        format!("{count} Ready clusters, an idle minute"),
        idle,
        note,
    );
    Ok(rows)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let Some(fx) = Fixture::start_with(localkube::Options::default(), false).await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let op = Operator(
        Command::new(&a.operator)
            .args(["run", "--metrics-address", "127.0.0.1:0"])
            .env("KUBECONFIG", fx.env.kubeconfig_path())
            // BENCH_OPERATOR_LOG=<file> keeps the operator's log (with BENCH_RUST_LOG's filter,
            // such as `info,valkey_operator::stage_clock=debug` for the stage timings).
            .env(
                "RUST_LOG",
                std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(match std::env::var_os("BENCH_OPERATOR_LOG") {
                Some(path) => Stdio::from(std::fs::File::create(path)?),
                None => Stdio::null(),
            })
            .spawn()
            .with_context(|| format!("starting {}", a.operator))?,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rows = Vec::new();
    let mut result = Ok(());
    for &n in &a.shards {
        match shard_count(&op, &client, n, &a).await {
            Ok(r) => rows.extend(r),
            Err(e) => {
                result = Err(e.context(format!("{n} shards")));
                break;
            }
        }
    }
    if result.is_ok() && a.clusters > 0 {
        match many_clusters(&op, &client, a.clusters).await {
            Ok(r) => rows.extend(r),
            Err(e) => result = Err(e),
        }
    }
    println!("\n| run | time | operator CPU | operator RSS | API writes | notes |");
    println!("|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.1} s | {:.1} s | {:.0} MiB | {} | {} |",
            r.what, r.cost.seconds, r.cost.cpu, r.cost.rss, r.cost.writes, r.note
        );
    }
    let ready = |n: i32| {
        rows.iter()
            .find(|r| r.what == format!("{n}×1 apply → Ready"))
            .map(|r| r.cost.seconds)
    };
    if let (Some(&lo), Some(&hi)) = (a.shards.first(), a.shards.last())
        && let (Some(t_lo), Some(t_hi)) = (ready(lo), ready(hi))
    {
        println!(
            "\nMEASURE apply → Ready grows {:.1}× from {lo} to {hi} shards ({:.1}× the shards)",
            t_hi / t_lo,
            f64::from(hi) / f64::from(lo)
        );
    }
    drop(op);
    fx.stop().await;
    result
}
