//! Benchmark: what clients see when a primary changes, through the operator on localkube
//! (needs root). A 3×1 cluster (`--image`, default Valkey 9.1) under a continuous writer with
//! `--tags` hash-tag workers (`SET` + `WAIT 1`, every acknowledged write read back): per
//! disruption, the longest time any tag went without a successful write (write gap) and
//! without a replica-acknowledged one (durable gap), lost writes, and the time to Ready.
//!
//! - `floor`: a coordinated `CLUSTER FAILOVER` issued by hand on each shard's replica in turn
//!   (as many primary changes as a roll makes, 3 s apart), no pod touched: the least a
//!   primary change costs a client; `floor1` does it on shard 0 only (as a pod delete);
//!   `floorwake` and `floor1wake` are the same with the promoted replica asked for its role
//!   every 2 ms (Valkey announces a won election only on the winner's next event-loop pass,
//!   which a packet brings forward; the operator polls likewise, back to back at first);
//! - `roll`: a rolling update of every pod (a pod-template change);
//! - `delete`: a graceful delete of shard 0's primary pod (Ready is awaited once the
//!   replacement pod exists);
//! - `kill`: `SIGKILL` of shard 0's primary server process;
//! - `node`: the localkube node of shard 0's primary stops as if it crashed (every process on
//!   it killed, heartbeats stop) and starts again once every slot is writable;
//! - `stale`: every shard's replica pod is deleted and replaced (waited for Ready), then the
//!   floor's hand failovers run, with the writer's clients started before the replacements:
//!   a primary change onto a node the client has not connected to yet, as in a roll;
//! - `churn`: no Valkey node touched: an unrelated `busybox` pod is started and deleted three
//!   times, the pod work a roll or a delete brings (kubelet, network namespace, API), to show
//!   what that alone costs the writer on this machine.
//!
//! Each phase also prints its *stall events*: probe stalls of at least 5 ms, grouped across
//! tags, with their start relative to the disruption; a primary change is one event. Each
//! coordinated failover (by hand or the operator's) is split, from the servers' logs, into
//! its handshake, announcement and client parts (see `timeline.rs`), and a summary per phase
//! over all rounds ends the run.
//!
//! ```sh
//! cargo run --release -p e2e --example bench_failover -- [--image valkey/valkey:9.1.0] [--tags 12] \
//!     [--rounds 1] [--phases floor,floorwake,floor1,floor1wake,stale,churn,roll,delete,kill,node]
//! ```

#[path = "../../tests/support/mod.rs"]
mod support;
mod timeline;

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use support::tagwriter::{self, TagWriter};
use support::*;
use valkey_api::ValkeyCluster;
use valkey_api::status::ClusterState;

struct Args {
    image: String,
    tags: usize,
    rounds: usize,
    phases: Vec<String>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        image: "valkey/valkey:9.1.0".into(),
        tags: 12,
        rounds: 1,
        phases: [
            "floor",
            "floorwake",
            "floor1",
            "floor1wake",
            "stale",
            "churn",
            "roll",
            "delete",
            "kill",
            "node",
        ]
        .map(String::from)
        .to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--image" => a.image = value,
            "--tags" => a.tags = value.parse()?,
            "--rounds" => a.rounds = value.parse()?,
            "--phases" => a.phases = value.split(',').map(String::from).collect(),
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(a)
}

const NAME: &str = "bfo";
const PW: &str = "bench-app-pw";

/// Shard 0's primary pod and its replica's IP, in the live topology.
async fn shard0(client: &Client) -> anyhow::Result<(String, String)> {
    shard_pair(client, 0).await
}

/// A shard's primary pod and its replica's IP.
async fn shard_pair(client: &Client, shard: i32) -> anyhow::Result<(String, String)> {
    let pods = shard_roles(client, NAME, shard, PW).await?;
    let primary = pods.iter().find(|(_, _, r)| r == "master");
    let replica = pods.iter().find(|(_, _, r)| r != "master");
    let ((p, _, _), (_, rip, _)) = primary
        .zip(replica)
        .with_context(|| format!("shard {shard} primary and replica"))?;
    Ok((p.clone(), rip.clone()))
}

/// Ready with the full, synced topology (as the status and every pod say).
async fn ready(client: &Client, since: Instant) -> anyhow::Result<Duration> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let op_pw = system_operator_password(client, NAME).await?;
    loop {
        let s = api.get(NAME).await?.status.unwrap_or_default();
        if s.state == ClusterState::Ready
            && check_topology_as(client, NAME, 3, 1, "_operator", &op_pw, false)
                .await
                .is_ok()
        {
            return Ok(since.elapsed());
        }
        ensure!(
            since.elapsed() < Duration::from_secs(600),
            "not Ready: {:?}",
            s.message
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Prints how soon every slot takes writes from a client that starts afresh on each try (no
/// stale slot map, no back-off): the server side of the gap, next to the long-running writer's.
async fn fresh_client_writable(client: &Client, what: &str) -> anyhow::Result<()> {
    let t = wait_writable(client, NAME, PW, Duration::from_secs(120)).await?;
    println!(
        "MEASURE bench_failover {what}: every slot writable by a fresh client after {:.2}s",
        t.as_secs_f64()
    );
    Ok(())
}

/// What one phase of one round measured.
struct PhaseResult {
    phase: String,
    write_gap: Duration,
    changes: Vec<timeline::Change>,
}

/// The bench's shared state: the cluster client, the arguments, the servers' logs and the
/// results so far.
struct Bench<'a> {
    client: &'a Client,
    a: &'a Args,
    logs: timeline::LogTail,
    results: std::sync::Mutex<Vec<PhaseResult>>,
}

impl Bench<'_> {
    /// Runs `disrupt` under the writer, waits for Ready, reports.
    async fn measure<F, Fut>(&self, what: &str, disrupt: F) -> anyhow::Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let (client, a) = (self.client, self.a);
        if !a.phases.iter().any(|p| p == what) {
            return Ok(());
        }
        ready(client, Instant::now()).await?;
        let w = TagWriter::start(client, NAME, PW, what, a.tags, 1).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let clock = timeline::Clock::now();
        let t0 = clock.at.0;
        disrupt().await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let took = ready(client, t0).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let s = w.stop_and_check().await?;
        println!(
            "MEASURE bench_failover {what}: write gap {:.3}s, durable gap {:.2}s, {} acknowledged, {} lost, Ready after {:.1}s (longest gap: {})",
            s.write_gap.as_secs_f64(),
            s.durable_gap.as_secs_f64(),
            s.acked,
            s.lost,
            took.as_secs_f64(),
            s.gap_cause
        );
        // Each event: seconds after the disruption started (negative: before it) and its
        // longest stall in ms; the floor's events are its primary changes.
        let show = |events: &[(Instant, Duration)]| -> Vec<String> {
            events
                .iter()
                .map(|(start, len)| {
                    let at = if *start >= t0 {
                        start.duration_since(t0).as_secs_f64()
                    } else {
                        -t0.duration_since(*start).as_secs_f64()
                    };
                    format!("{at:+.3}s:{}ms", len.as_millis())
                })
                .collect()
        };
        let events = show(&s.events);
        println!(
            "MEASURE bench_failover {what}: {} stall events ≥ {}ms after unix {:.3} [{}]",
            events.len(),
            tagwriter::EPISODE.as_millis(),
            clock.unix(t0),
            events.join(" ")
        );
        println!(
            "MEASURE bench_failover {what}: {} machine stall events [{}]; {} of {} probe stalls overlap one",
            s.hiccups.len(),
            show(&s.hiccups).join(" "),
            s.stalls_on_hiccups.1,
            s.stalls_on_hiccups.0
        );
        // The phase's primary changes, from the servers' logs (writer started 2 s before t0).
        let stalls: Vec<(f64, f64)> = s
            .episodes
            .iter()
            .map(|(start, len)| (clock.unix(*start), len.as_secs_f64()))
            .collect();
        let changes = timeline::changes(
            &timeline::failovers(&self.logs.since(clock.unix(t0) - 2.0)),
            &stalls,
        );
        for c in &changes {
            println!(
                "MEASURE bench_failover {what}: primary change by {} at {:+.3}s: handshake {}, announce {}, client {}, stall {}",
                c.failover.by,
                c.failover.requested - clock.unix(t0),
                timeline::ms(c.failover.handshake_ms()),
                timeline::ms(c.failover.announce_ms()),
                timeline::ms(c.client_ms),
                c.stall_ms.map_or_else(
                    || format!("<{}ms", tagwriter::EPISODE.as_millis()),
                    |v| format!("{v:.0}ms")
                ),
            );
        }
        self.results.lock().expect("results").push(PhaseResult {
            phase: what.to_owned(),
            write_gap: s.write_gap,
            changes,
        });
        ensure!(s.lost == 0, "{what}: {} acknowledged writes lost", s.lost);
        Ok(())
    }

    /// Per phase over all rounds: the median and range of the write gap, and the medians of
    /// the primary changes' parts (a stall under the writer's episode length counts as 0).
    fn summary(&self) {
        let results = self.results.lock().expect("results");
        for phase in &self.a.phases {
            let mine: Vec<&PhaseResult> = results.iter().filter(|r| &r.phase == phase).collect();
            if mine.is_empty() {
                continue;
            }
            let gaps: Vec<f64> = mine
                .iter()
                .map(|r| r.write_gap.as_secs_f64() * 1000.0)
                .collect();
            let (lo, hi) = gaps
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), g| (lo.min(*g), hi.max(*g)));
            let changes: Vec<&timeline::Change> = mine.iter().flat_map(|r| &r.changes).collect();
            let med = |f: &dyn Fn(&timeline::Change) -> Option<f64>| {
                timeline::ms(timeline::median(
                    changes.iter().filter_map(|c| f(c)).collect(),
                ))
            };
            println!(
                "MEASURE bench_failover summary {phase}: {} rounds, write gap median {:.0}ms ({lo:.0}–{hi:.0}ms); {} primary changes, medians: handshake {}, announce {}, client {}, stall {}",
                mine.len(),
                timeline::median(gaps).unwrap_or_default(),
                changes.len(),
                med(&|c| c.failover.handshake_ms()),
                med(&|c| c.failover.announce_ms()),
                med(&|c| c.client_ms),
                med(&|c| Some(c.stall_ms.unwrap_or(0.0))),
            );
        }
    }
}

/// The cluster's shards (3×1).
const SHARDS: i32 = 3;

/// `CLUSTER FAILOVER` on `shard`'s replica, waited for until the replica says it is primary.
/// With `wake`, the replica is asked for its `ROLE` every 2 ms on the same connection until
/// it is primary (as the operator's `commands::failover` does).
async fn hand_failover(client: &Client, op_pw: &str, shard: i32, wake: bool) -> anyhow::Result<()> {
    let (_, replica_ip) = shard_pair(client, shard).await?;
    let mut c = node_conn(&replica_ip, "_operator", op_pw).await?;
    let () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query_async(&mut c)
        .await?;
    let started = Instant::now();
    while wake && started.elapsed() < Duration::from_secs(1) {
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await?;
        if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    while live_role(&replica_ip, "app", PW).await? != "master" {
        ensure!(
            started.elapsed() < Duration::from_secs(10),
            "failover of shard {shard} not done"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Starts an unrelated `busybox` pod, waits until it runs, deletes it and waits until it is
/// gone; three times, 3 s apart.
async fn pod_churn(client: &Client, round: usize) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for i in 0..3 {
        let name = format!("churn-{round}-{i}");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"],
                                "securityContext": {"allowPrivilegeEscalation": false,
                                                    "capabilities": {"drop": ["ALL"]}}}],
            },
        }))?;
        pods.create(&Default::default(), &pod).await?;
        let started = Instant::now();
        while pods
            .get(&name)
            .await?
            .status
            .and_then(|s| s.phase)
            .as_deref()
            != Some("Running")
        {
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "{name} not running"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        pods.delete(&name, &DeleteParams::default()).await?;
        while pods.get_opt(&name).await?.is_some() {
            ensure!(
                started.elapsed() < Duration::from_secs(120),
                "{name} not gone"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    Ok(())
}

async fn bench(fx: &Fixture, a: &Args) -> anyhow::Result<()> {
    let client = &fx.client;
    let b = Bench {
        client,
        a,
        logs: timeline::LogTail::start(fx.env.dir()),
        results: std::sync::Mutex::new(Vec::new()),
    };
    let result = rounds(fx, &b).await;
    b.summary();
    result
}

/// The phases of every round.
async fn rounds(fx: &Fixture, b: &Bench<'_>) -> anyhow::Result<()> {
    let (client, a) = (b.client, b.a);
    create_user_secret(client, &format!("{NAME}-app"), PW).await?;
    create_cluster_with(
        client,
        NAME,
        SHARDS,
        1,
        serde_json::json!({"image": a.image}),
    )
    .await?;
    wait_ready(client, NAME, SHARDS, Duration::from_secs(600)).await?;
    let op_pw = system_operator_password(client, NAME).await?;
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    for round in 0..a.rounds {
        for (phase, shards) in [
            ("floor", 0..SHARDS),
            ("floorwake", 0..SHARDS),
            ("floor1", 0..1),
            ("floor1wake", 0..1),
        ] {
            b.measure(phase, || async {
                let last = shards.end - 1;
                for shard in shards {
                    hand_failover(client, &op_pw, shard, phase.ends_with("wake")).await?;
                    if shard < last {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                }
                Ok(())
            })
            .await?;
        }
        b.measure("stale", || async {
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS);
            for shard in 0..SHARDS {
                let replica = shard_roles(client, NAME, shard, PW)
                    .await?
                    .into_iter()
                    .find(|(_, _, r)| r != "master")
                    .context("a replica")?;
                pods.delete(&replica.0, &DeleteParams::default()).await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
                ready(client, Instant::now()).await?;
            }
            println!("MEASURE bench_failover stale: hand failovers start now");
            let t = Instant::now();
            for shard in 0..SHARDS {
                hand_failover(client, &op_pw, shard, false).await?;
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            println!(
                "MEASURE bench_failover stale: hand failovers took {:.1}s",
                t.elapsed().as_secs_f64()
            );
            Ok(())
        })
        .await?;
        b.measure("churn", || pod_churn(client, round)).await?;
        b.measure("roll", || async {
            let patch = serde_json::json!({"spec": {"resources": {"requests": {"cpu": format!("{}m", 10 + round)}}}});
            api.patch(NAME, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            // The roll has started once the status leaves Ready.
            let started = Instant::now();
            while api.get(NAME).await?.status.unwrap_or_default().state == ClusterState::Ready {
                ensure!(started.elapsed() < Duration::from_secs(60), "roll did not start");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(())
        })
        .await?;
        b.measure("delete", || async {
            let (primary, _) = shard0(client).await?;
            let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS);
            let old = pods.get(&primary).await?.metadata.uid;
            pods.delete(&primary, &DeleteParams::default()).await?;
            fresh_client_writable(client, "delete").await?;
            // Ready counts from here only once the replacement pod exists: until the old pod
            // has stopped (its hook lingers), the status may still say Ready.
            let since = Instant::now();
            while pods
                .get_opt(&primary)
                .await?
                .is_none_or(|p| p.metadata.uid == old)
            {
                ensure!(
                    since.elapsed() < Duration::from_secs(120),
                    "{primary} not replaced"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(())
        })
        .await?;
        b.measure("kill", || async {
            let (primary, _) = shard0(client).await?;
            fx.faults()?.kill_container(NS, &primary, "server")?;
            fresh_client_writable(client, "kill").await
        })
        .await?;
        b.measure("node", || async {
            let (primary, _) = shard0(client).await?;
            let node = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
                .get(&primary)
                .await?
                .spec
                .and_then(|s| s.node_name)
                .context("primary pod's node")?;
            let faults = fx.faults()?;
            faults.stop_node(&node).await?;
            let writable = fresh_client_writable(client, "node").await;
            faults.start_node(&node).await?;
            writable
        })
        .await?;
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    // RUST_LOG=redis=debug shows what the writers' cluster client does (its `log` records).
    if let Ok(filter) = std::env::var("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .try_init();
    }
    let a = args()?;
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let result = bench(&fx, &a).await;
    fx.stop().await;
    result
}
