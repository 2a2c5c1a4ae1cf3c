//! Benchmark: a backup of a 3 × 1 cluster holding `--keys` keys (default 1 000 000) to a real
//! S3 store (SeaweedFS) under a continuous `SET` + `WAIT 1` writer, then restores of it into
//! new clusters of each `--shards` count (default 3 and 5), on localkube (needs root). Prints
//! the backup's bytes, time, MB/s and keys/s and the writer's longest gap; per restore the
//! time from creation to Ready, the restore's own time and keys/s. Every loaded key must read
//! back from every restored cluster, and no acknowledged write may be lost.
//!
//! ```sh
//! cargo run --release -p e2e --example bench_backup -- [--keys 1000000] [--shards 3,5]
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use kube::Client;
use kube::api::{Api, PostParams};
use support::*;
use valkey_api::ValkeyCluster;
use valkey_api::backup::{BackupPhase, ValkeyBackup};
use valkey_api::bootstrap::RestorePhase;
use valkey_testkit::{S3_BUCKET, S3Server};

const PW: &str = "bench-app-pw";

struct Args {
    keys: u64,
    shards: Vec<i32>,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        keys: 1_000_000,
        shards: vec![3, 5],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--keys" => a.keys = value.parse()?,
            "--shards" => a.shards = value.split(',').map(str::parse).collect::<Result<_, _>>()?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

async fn seed_addr(client: &Client, name: &str) -> anyhow::Result<String> {
    let pod = pods_of(client, name)
        .await?
        .into_iter()
        .next()
        .context("no pod")?;
    Ok(format!("{}:6379", pod_ip(&pod).context("pod IP")?))
}

async fn backup(client: &Client, s3: &S3Server) -> anyhow::Result<ValkeyBackup> {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}
    }))?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    let api: Api<ValkeyBackup> = Api::namespaced(client.clone(), NS);
    let b: ValkeyBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyBackup",
        "metadata": {"name": "bench"},
        "spec": {"cluster": "src", "store": {"s3": {"bucket": S3_BUCKET,
            "endpoint": s3.endpoint(), "forcePathStyle": true,
            "credentials": {"secretName": "s3"}}}}
    }))?;
    api.create(&PostParams::default(), &b).await?;
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let b = api.get("bench").await?;
        match b.status.as_ref().and_then(|s| s.phase) {
            Some(BackupPhase::Completed) => return Ok(b),
            Some(BackupPhase::Failed) => bail!("backup failed: {:?}", b.status),
            _ if Instant::now() > deadline => bail!("backup not done: {:?}", b.status),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let s3 = tokio::task::spawn_blocking(S3Server::start).await?;
    create_ready_cluster(&client, "src", PW, 3, 1).await?;
    let pool = valkey_testkit::pool_for("app", PW, None);
    let t0 = Instant::now();
    valkey_testkit::write_keys(&pool, &seed_addr(&client, "src").await?, a.keys).await;
    println!(
        "MEASURE loaded {} keys in {:.1}s",
        a.keys,
        t0.elapsed().as_secs_f64()
    );

    let writer = Writer::start(&client, "src", PW, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t1 = Instant::now();
    let b = backup(&client, &s3).await?;
    let took = t1.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (writes, gap) = writer
        .stop_and_check(&client, "src", PW, "a backup")
        .await?;
    let st = b.status.context("status")?;
    let (bytes, keys) = (st.bytes.unwrap_or(0) as f64, st.keys.unwrap_or(0) as f64);
    let secs = st.duration_seconds.unwrap_or(took);
    println!(
        "MEASURE backup: {bytes:.0} bytes, {keys:.0} keys; create -> Completed {took:.2}s, \
         streaming {secs:.2}s = {:.1} MB/s, {:.0} keys/s; writer {writes} acknowledged writes, \
         longest gap {:.3}s; store RSS {} MiB",
        bytes / secs / 1e6,
        keys / secs,
        gap.as_secs_f64(),
        s3.rss_kib().unwrap_or(0) / 1024
    );

    for shards in a.shards {
        let name = format!("restored{shards}");
        create_user_secret(&client, &format!("{name}-app"), PW).await?;
        let t = Instant::now();
        create_cluster_with(
            &client,
            &name,
            shards,
            1,
            serde_json::json!({"bootstrap": {"backup": {"name": "bench"}}}),
        )
        .await?;
        wait_ready(&client, &name, shards, Duration::from_secs(1800)).await?;
        let ready = t.elapsed().as_secs_f64();
        let vc = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
            .get(&name)
            .await?;
        let r = vc
            .status
            .and_then(|s| s.restore)
            .context("status.restore")?;
        ensure!(r.phase == RestorePhase::Completed, "{r:?}");
        let restore_secs = r.duration_seconds.unwrap_or(0.0);
        println!(
            "MEASURE restore into {shards} shards: {} keys, {} bytes; create -> Ready {ready:.1}s; \
             restore (files checked, then every key) {restore_secs:.2}s = {:.0} keys/s, {:.1} MB/s",
            r.keys,
            r.bytes,
            r.keys as f64 / restore_secs.max(1e-9),
            r.bytes as f64 / restore_secs.max(1e-9) / 1e6
        );
        let bad =
            valkey_testkit::count_bad_keys(&pool, &seed_addr(&client, &name).await?, a.keys).await;
        ensure!(bad == 0, "{name}: {bad} of {} loaded keys missing", a.keys);
    }
    fx.stop().await;
    Ok(())
}
