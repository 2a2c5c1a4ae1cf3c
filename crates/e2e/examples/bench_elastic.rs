//! Benchmark: shard scale-out 3 → 4 and scale-in (drain) 4 → 3 through the operator on
//! localkube (needs root), with `--keys` keys loaded (default 1 000 000), on each `--images`
//! image in turn (default a Valkey 9.1 image, atomic slot migration, then a Valkey 8.0 image,
//! key-by-key `MIGRATE`), under a continuous cluster-aware writer (`SET`, plus `WAIT 1` when
//! `--replicas` > 0). Prints, per change: time from the patch to Ready with the even layout
//! (new pods, joins, every batch, forgetting and deleting the drained nodes), keys moved and
//! keys/s over that, and the time and keys/s of the migration steps alone (the operator's
//! `slot_migration_seconds` and `keys_migrated` metrics); per image: the writer's
//! acknowledged writes and longest gap. Every loaded key and acknowledged write must read
//! back.
//!
//! ```sh
//! cargo run --release -p e2e --example bench_elastic -- \
//!     [--keys 1000000] [--replicas 0] [--images valkey/valkey:9.1.0,valkey/valkey:8.0.1]
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use support::*;
use valkey_api::ValkeyCluster;

struct Args {
    keys: u64,
    replicas: i32,
    images: Vec<String>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        keys: 1_000_000,
        replicas: 0,
        images: vec!["valkey/valkey:9.1.0".into(), "valkey/valkey:8.0.1".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--keys" => a.keys = value.parse()?,
            "--replicas" => a.replicas = value.parse()?,
            "--images" => a.images = value.split(',').map(str::to_owned).collect(),
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

/// `DBSIZE` of the primary of shard `shard`.
async fn shard_keys(client: &Client, name: &str, shard: i32, pw: &str) -> anyhow::Result<u64> {
    for p in pods_of(client, name).await? {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        if labels.get(valkey_api::labels::SHARD_INDEX) != Some(&shard.to_string()) {
            continue;
        }
        let ip = pod_ip(&p).context("pod ip")?;
        if live_role(&ip, "_operator", pw).await? != "master" {
            continue;
        }
        let mut c = node_conn(&ip, "_operator", pw).await?;
        return Ok(redis::cmd("DBSIZE").query_async(&mut c).await?);
    }
    bail!("shard {shard} of {name} has no primary pod")
}

/// A metric's value in the in-process operator's `/metrics` text (0 when absent).
fn metric(fx: &Fixture, name: &str) -> f64 {
    fx.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Keys moved and seconds spent in migration steps since `before`.
fn migration_since(fx: &Fixture, before: (f64, f64)) -> (f64, f64) {
    (
        metric(fx, "valkey_operator_keys_migrated_total") - before.0,
        metric(fx, "valkey_operator_slot_migration_seconds_total") - before.1,
    )
}

/// `ip:6379` of one of the cluster's pods.
async fn seed_addr(client: &Client, name: &str) -> anyhow::Result<String> {
    let pods = pods_of(client, name).await?;
    let ip = pods.iter().find_map(pod_ip).context("no pod")?;
    Ok(format!("{ip}:6379"))
}

/// Patches `shards`, waits for Ready and the even layout; returns the time taken.
async fn scale(client: &Client, name: &str, shards: i32, pw: &str) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"shards": shards}})),
        )
        .await?;
    wait_ready(client, name, shards, Duration::from_secs(1800)).await?;
    let took = t0.elapsed();
    let addr = seed_addr(client, name).await?;
    let ip = addr.trim_end_matches(":6379");
    let layout = slot_layout(ip, "_operator", pw).await?;
    let n = usize::try_from(shards)?;
    let even: Vec<usize> = (0..n)
        .map(|i| 16384 / n + usize::from(i < 16384 % n))
        .collect();
    let got: Vec<usize> = layout.iter().map(|(s, _)| *s).collect();
    ensure!(
        got == even,
        "layout {got:?} is not even after {shards} shards"
    );
    Ok(took)
}

async fn bench(fx: &Fixture, name: &str, image: &str, a: &Args) -> anyhow::Result<()> {
    let client = &fx.client;
    let pw = format!("{name}-app-pw");
    create_user_secret(client, &format!("{name}-app"), &pw).await?;
    create_cluster_with(
        client,
        name,
        3,
        a.replicas,
        serde_json::json!({"image": image}),
    )
    .await?;
    wait_ready(client, name, 3, Duration::from_secs(600)).await?;
    let op_pw = system_operator_password(client, name).await?;
    let pool = valkey_testkit::pool_for("app", &pw, None);
    let seed = seed_addr(client, name).await?;
    let t0 = Instant::now();
    valkey_testkit::write_keys(&pool, &seed, a.keys).await;
    println!(
        "MEASURE {image}: loaded {} keys in {:.1}s",
        a.keys,
        t0.elapsed().as_secs_f64()
    );

    let writer = Writer::start(client, name, &pw, i64::from(a.replicas.min(1)));
    let before = migration_since(fx, (0.0, 0.0));
    let out = scale(client, name, 4, &op_pw).await?;
    let (keys, secs) = migration_since(fx, before);
    let moved = shard_keys(client, name, 3, &op_pw).await?;
    println!(
        "MEASURE {image}: 3→4 patch→Ready {:.1}s, {moved} keys moved ({:.0} keys/s end to end); migration steps {secs:.2}s for {keys:.0} keys ({:.0} keys/s)",
        out.as_secs_f64(),
        moved as f64 / out.as_secs_f64(),
        keys / secs.max(1e-9)
    );
    let drained = shard_keys(client, name, 3, &op_pw).await?;
    let before = migration_since(fx, (0.0, 0.0));
    let back = scale(client, name, 3, &op_pw).await?;
    let (keys, secs) = migration_since(fx, before);
    println!(
        "MEASURE {image}: 4→3 patch→Ready {:.1}s, {drained} keys drained ({:.0} keys/s end to end); migration steps {secs:.2}s for {keys:.0} keys ({:.0} keys/s)",
        back.as_secs_f64(),
        drained as f64 / back.as_secs_f64(),
        keys / secs.max(1e-9)
    );
    let (n, gap) = writer.stop_and_check(client, name, &pw, "3→4→3").await?;
    println!(
        "MEASURE {image}: writer {n} writes acknowledged over 3→4→3, longest gap {:.2}s",
        gap.as_secs_f64()
    );
    let seed = seed_addr(client, name).await?;
    let bad = valkey_testkit::count_bad_keys(&pool, &seed, a.keys).await;
    ensure!(bad == 0, "{bad} of {} loaded keys lost", a.keys);
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let mut result = Ok(());
    for (i, image) in a.images.iter().enumerate() {
        result = bench(&fx, &format!("bench{i}"), image, &a).await;
        if result.is_err() {
            break;
        }
    }
    fx.stop().await;
    result
}
