//! End-to-end (needs root): backups of a ValkeyCluster to a real S3 store (SeaweedFS, the
//! testkit's `S3Server`) and to Azure Blob Storage's emulator, on localkube with real Valkey
//! pods.
//!
//! A 3 × 1 cluster with persistence (RDB) holds acknowledged keys, some with a TTL; under a
//! continuous `SET` + `WAIT 1` writer a ValkeyBackup completes. Its manifest lists 3 shards
//! covering the 16384 slots, each read from a replica; every file's size and SHA-256 match the
//! manifest; each file, loaded by a standalone Valkey server, holds the count of keys the
//! manifest says, and together they hold every key acknowledged before the backup with its
//! value and TTL. The writer loses nothing. Then the failures, each reported in the
//! `Completed` condition with the store's words and one event: wrong credentials, a missing
//! credentials Secret, and an unreachable store. The backup is restored into new clusters of
//! 3 and 5 shards (by the ValkeyBackup's name, and by store and path): every key with its
//! value and TTL, exactly the backup's key count, Ready only after. Refused without writing
//! a key: a Valkey 8.0 target for a 9.1 backup, a path without a manifest, and a file changed
//! in the store. The same cluster backed up into Azure Blob Storage (Azurite, the testkit's
//! `AzureServer`) is restored from there into 2 shards. A schedule every 10 s keeping 2
//! deletes older backups and their files.
//!
//! Measured times are printed as `MEASURE …` lines.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::Digest;
use support::*;
use valkey_api::backup::{BackupPhase, ValkeyBackup};
use valkey_ops::client::{ClientConfig, NodePool};
use valkey_testkit::{
    AZURE_ACCOUNT, AZURE_CONTAINER, AZURE_KEY, AzureServer, Flavor, S3_BUCKET, S3Server, Server,
    free_port,
};

const NAME: &str = "bk";
const PW: &str = "backup-app-pw";
const KEYS: usize = 3_000;
const TTL_KEYS: usize = 300;
const PREFIX: &str = "e2e";

async fn create_secret(client: &Client, name: &str, id: &str, key: &str) -> anyhow::Result<()> {
    let s: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "stringData": {"AWS_ACCESS_KEY_ID": id, "AWS_SECRET_ACCESS_KEY": key}
    }))?;
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &s)
        .await?;
    Ok(())
}

async fn create_backup(
    client: &Client,
    name: &str,
    endpoint: &str,
    secret: &str,
) -> anyhow::Result<()> {
    let b: ValkeyBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyBackup",
        "metadata": {"name": name},
        "spec": {"cluster": NAME, "store": {"prefix": PREFIX, "s3": {
            "bucket": S3_BUCKET, "endpoint": endpoint, "forcePathStyle": true,
            "credentials": {"secretName": secret}}}}
    }))?;
    Api::<ValkeyBackup>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &b)
        .await?;
    Ok(())
}

/// Waits until backup `name`'s `Completed` condition has `reason`; returns the backup.
async fn wait_reason(
    client: &Client,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> anyhow::Result<ValkeyBackup> {
    let api: Api<ValkeyBackup> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let b = api.get(name).await?;
        let st = b.status.clone().unwrap_or_default();
        let cond = st.conditions.iter().find(|c| c.type_ == "Completed");
        let now = format!(
            "{:?} {:?} {:?} {:?}",
            st.phase,
            st.progress,
            cond.map(|c| &c.reason),
            cond.map(|c| &c.message)
        );
        if now != last {
            eprintln!("[backup {name} {:.1}s] {now}", clock());
            last = now;
        }
        if cond.is_some_and(|c| c.reason == reason) {
            return Ok(b);
        }
        if st.phase == Some(BackupPhase::Failed) || Instant::now() > deadline {
            bail!("backup {name}: no reason {reason} after {timeout:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn get_object(s3: &S3Server, key: &str) -> anyhow::Result<Vec<u8>> {
    let (status, body) = s3
        .request_bytes("GET", &format!("/{S3_BUCKET}/{key}"), b"")
        .map_err(anyhow::Error::msg)?;
    ensure!(status == 200, "GET {key}: {status}");
    Ok(body)
}

/// A standalone Valkey 9 server that loaded `rdb` (a shard's file), with its pool.
async fn load(rdb: &[u8]) -> anyhow::Result<(Server, tempfile::TempDir, NodePool)> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("dump.rdb"), rdb)?;
    let port = free_port();
    let conf = dir.path().join("load.conf");
    std::fs::write(
        &conf,
        format!(
            "bind 127.0.0.1\nport {port}\ndir {}\ndbfilename dump.rdb\nappendonly no\n\
             save \"\"\nrequirepass load-secret\n",
            dir.path().display()
        ),
    )?;
    let server = Server::start_config(&Flavor::V9.binary(), &conf, port, &[]);
    let pool = NodePool::new(ClientConfig::new("default", "load-secret"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match pool
            .query::<u64>(&server.addr(), &redis::cmd("DBSIZE"))
            .await
        {
            Ok(_) => return Ok((server, dir, pool)),
            Err(e) if Instant::now() > deadline => bail!("loading a shard file: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Checks the manifest and files of the completed backup `name`: shards, slots, sources,
/// sizes, digests, key counts, and every key of `k:` and `t:` with its value and TTL.
async fn check_backup_content(s3: &S3Server, name: &str) -> anyhow::Result<u64> {
    let dir = format!("{PREFIX}/{NS}/{NAME}/{name}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&get_object(s3, &format!("{dir}/manifest.json"))?)?;
    let shards = manifest["shards"].as_array().context("shards")?;
    ensure!(shards.len() == 3, "{manifest:#}");
    ensure!(
        manifest["cluster"] == format!("{NS}/{NAME}"),
        "{manifest:#}"
    );
    let mut slots = BTreeSet::new();
    let mut servers = Vec::new();
    let mut total = 0u64;
    for s in shards {
        for r in s["slots"].as_array().context("slots")? {
            let (a, b) = r
                .as_str()
                .and_then(|r| r.split_once('-'))
                .context("range")?;
            slots.extend(a.parse::<u16>()?..=b.parse::<u16>()?);
        }
        ensure!(
            s["fromReplica"] == true,
            "shard read from its primary: {s:#}"
        );
        // The replica had applied its primary's stream up to the primary's offset when the
        // shard's turn began.
        let (offset, primary_offset) = (s["offset"].as_u64(), s["primaryOffset"].as_u64());
        ensure!(
            primary_offset.is_some() && offset >= primary_offset,
            "replica behind its primary: {s:#}"
        );
        let file = get_object(
            s3,
            &format!("{dir}/{}", s["file"].as_str().context("file")?),
        )?;
        ensure!(s["bytes"].as_u64() == Some(file.len() as u64), "{s:#}");
        ensure!(
            s["sha256"].as_str() == Some(hex::encode(sha2::Sha256::digest(&file)).as_str()),
            "SHA-256 differs: {s:#}"
        );
        let (server, tmp, pool) = load(&file).await?;
        let keys: u64 = pool.query(&server.addr(), &redis::cmd("DBSIZE")).await?;
        ensure!(
            s["keys"].as_u64() == Some(keys),
            "loaded {keys} keys: {s:#}"
        );
        total += keys;
        servers.push((server, tmp, pool));
    }
    ensure!(
        slots.len() == 16384,
        "the shards cover {} slots",
        slots.len()
    );
    // Every key acknowledged before the backup is in exactly one file, with its value and TTL.
    for (prefix, n, ttl) in [("k", KEYS, false), ("t", TTL_KEYS, true)] {
        for i in 0..n {
            let key = format!("{prefix}:{i}");
            let mut found = 0;
            for (server, _, pool) in &servers {
                let v: Option<String> = pool
                    .query(&server.addr(), redis::cmd("GET").arg(&key))
                    .await?;
                let Some(v) = v else { continue };
                found += 1;
                ensure!(v == i.to_string(), "{key} = {v}");
                let left: i64 = pool
                    .query(&server.addr(), redis::cmd("TTL").arg(&key))
                    .await?;
                ensure!(
                    if ttl {
                        left > 3000 && left <= 3600
                    } else {
                        left == -1
                    },
                    "{key}: TTL {left}"
                );
            }
            ensure!(found == 1, "{key} found in {found} shard files");
        }
    }
    Ok(total)
}

async fn backup_under_writer(fx: &Fixture, s3: &S3Server) -> anyhow::Result<i64> {
    let client = &fx.client;
    let mut conn = cluster_client(client, NAME, PW).await?;
    acked_writes(&mut conn, KEYS, "k").await?;
    for i in 0..TTL_KEYS {
        let _: () = redis::cmd("SET")
            .arg(format!("t:{i}"))
            .arg(i)
            .arg("EX")
            .arg(3600)
            .query_async(&mut conn)
            .await?;
    }
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut conn)
        .await?;
    ensure!(acked >= 1, "TTL keys not acknowledged");
    create_secret(client, "s3-good", &s3.access_key, &s3.secret_key).await?;

    let writer = Writer::start(client, NAME, PW, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    create_backup(client, "first", &s3.endpoint(), "s3-good").await?;
    let b = wait_reason(client, "first", "Completed", Duration::from_secs(120)).await?;
    let took = t0.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (writes, gap) = writer.stop_and_check(client, NAME, PW, "a backup").await?;
    let st = b.status.context("status")?;
    eprintln!(
        "MEASURE backup 3x1: {} bytes, {:?} keys, create -> Completed {:.2}s (status {:?} s); \
         writer {writes} acknowledged writes, longest gap {:.3}s",
        st.bytes.unwrap_or(0),
        st.keys,
        took.as_secs_f64(),
        st.duration_seconds,
        gap.as_secs_f64()
    );
    ensure!(st.phase == Some(BackupPhase::Completed), "{st:?}");
    ensure!(
        (st.shards, st.shards_done, st.progress.as_deref()) == (Some(3), Some(3), Some("3/3")),
        "{st:?}"
    );
    ensure!(st.attempts == Some(1), "{st:?}");
    ensure!(
        st.location.as_deref() == Some(&*format!("s3://{S3_BUCKET}/{PREFIX}/{NS}/{NAME}/first")),
        "{st:?}"
    );
    let loaded = check_backup_content(s3, "first").await?;
    ensure!(
        st.keys == Some(loaded as i64) && loaded >= (KEYS + TTL_KEYS) as u64,
        "status keys {:?}, files hold {loaded}",
        st.keys
    );
    ensure!(
        event_count(client, "first", "BackupCompleted", "Normal").await? == 1,
        "one BackupCompleted event"
    );
    Ok(loaded as i64)
}

async fn failures_are_reported(fx: &Fixture, s3: &S3Server) -> anyhow::Result<()> {
    let client = &fx.client;
    create_secret(client, "s3-wrong", &s3.access_key, "not-the-secret-key").await?;
    create_backup(client, "wrong-key", &s3.endpoint(), "s3-wrong").await?;
    let b = wait_reason(client, "wrong-key", "StoreError", Duration::from_secs(90)).await?;
    let st = b.status.context("status")?;
    let msg = &st.conditions[0].message;
    ensure!(msg.contains("SignatureDoesNotMatch"), "{msg}");
    ensure!(
        st.phase == Some(BackupPhase::Pending) && st.retry_at.is_some(),
        "{st:?}"
    );
    ensure!(event_count(client, "wrong-key", "StoreError", "Warning").await? >= 1);

    create_backup(client, "no-secret", &s3.endpoint(), "absent").await?;
    let b = wait_reason(
        client,
        "no-secret",
        "CredentialsMissing",
        Duration::from_secs(30),
    )
    .await?;
    let msg = &b.status.context("status")?.conditions[0].message;
    ensure!(msg.contains("Secret absent"), "{msg}");

    // A port nothing listens on.
    let closed = format!("http://127.0.0.1:{}", free_port());
    create_backup(client, "unreachable", &closed, "s3-good").await?;
    let b = wait_reason(
        client,
        "unreachable",
        "StoreError",
        Duration::from_secs(120),
    )
    .await?;
    let msg = &b.status.context("status")?.conditions[0].message;
    eprintln!("unreachable store: {msg}");
    ensure!(
        msg.contains("attempt 1 of 6 failed") && msg.contains("Connection refused"),
        "{msg}"
    );
    Ok(())
}

/// Whether any object of backup `name`'s directory (manifest and the 3 shard files) exists.
fn any_file_of(s3: &S3Server, name: &str) -> anyhow::Result<bool> {
    let dir = format!("/{S3_BUCKET}/{PREFIX}/{NS}/{NAME}/{name}");
    let mut found = false;
    for f in [
        "manifest.json",
        "shard-00000.rdb",
        "shard-00001.rdb",
        "shard-00002.rdb",
    ] {
        let (status, _) = s3
            .request("HEAD", &format!("{dir}/{f}"), b"")
            .map_err(anyhow::Error::msg)?;
        ensure!(status == 200 || status == 404, "HEAD {dir}/{f}: {status}");
        found |= status == 200;
    }
    Ok(found)
}

/// (name, phase) of the schedule's backups.
async fn scheduled(
    client: &Client,
    schedule: &str,
) -> anyhow::Result<Vec<(String, Option<BackupPhase>)>> {
    Ok(Api::<ValkeyBackup>::namespaced(client.clone(), NS)
        .list(
            &kube::api::ListParams::default()
                .labels(&format!("valkey.io/scheduled-backup={schedule}")),
        )
        .await?
        .items
        .into_iter()
        .map(|b| {
            (
                b.metadata.name.clone().unwrap_or_default(),
                b.status.and_then(|s| s.phase),
            )
        })
        .collect())
}

async fn schedule_status(
    api: &Api<valkey_api::ValkeyScheduledBackup>,
) -> anyhow::Result<valkey_api::ValkeyScheduledBackupStatus> {
    api.get("every10s").await?.status.context("schedule status")
}

/// A schedule every 10 s keeping 2: the oldest backups go, with their files; suspended, it
/// creates none; deleted, its backups and their files go.
async fn scheduled_backups_with_retention(fx: &Fixture, s3: &S3Server) -> anyhow::Result<()> {
    use kube::api::{DeleteParams, Patch, PatchParams};
    use valkey_api::ValkeyScheduledBackup;
    let client = &fx.client;
    let api: Api<ValkeyScheduledBackup> = Api::namespaced(client.clone(), NS);
    let sched: ValkeyScheduledBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyScheduledBackup",
        "metadata": {"name": "every10s"},
        "spec": {"cluster": NAME, "schedule": "*/10 * * * * *", "retention": {"keep": 2},
                 "store": {"prefix": PREFIX, "s3": {"bucket": S3_BUCKET,
                     "endpoint": s3.endpoint(), "forcePathStyle": true,
                     "credentials": {"secretName": "s3-good"}}}}
    }))?;
    api.create(&PostParams::default(), &sched).await?;
    let t0 = Instant::now();
    let mut seen = BTreeSet::new();
    let listed = loop {
        let now = scheduled(client, "every10s").await?;
        seen.extend(now.iter().map(|(n, _)| n.clone()));
        let completed = now
            .iter()
            .filter(|(_, p)| *p == Some(BackupPhase::Completed))
            .count();
        if seen.len() >= 4 && completed == 2 && now.len() == 2 {
            break now;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("schedule: seen {seen:?}, now {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "MEASURE schedule every 10 s, keep 2: {} backups created, {listed:?} kept after {:.1}s",
        seen.len(),
        t0.elapsed().as_secs_f64()
    );
    for name in &seen {
        let kept = listed.iter().any(|(n, _)| n == name);
        ensure!(
            any_file_of(s3, name)? == kept,
            "backup {name}: kept {kept}, files in the store disagree"
        );
    }
    let s = schedule_status(&api).await?;
    ensure!(
        s.last_completed_backup.is_some() && s.next_schedule_time.is_some(),
        "{s:?}"
    );

    // Suspended: nothing new.
    api.patch(
        "every10s",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"suspend": true}})),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let names = || async {
        anyhow::Ok(
            scheduled(client, "every10s")
                .await?
                .into_iter()
                .map(|(n, _)| n)
                .collect::<BTreeSet<String>>(),
        )
    };
    let before = names().await?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = names().await?;
    ensure!(
        after.is_subset(&before),
        "suspended, yet {after:?} after {before:?}"
    );
    let s = schedule_status(&api).await?;
    ensure!(
        s.conditions
            .iter()
            .any(|c| c.type_ == "Scheduled" && c.reason == "Suspended"),
        "{s:?}"
    );

    // Deleted: its backups and their files go.
    api.delete("every10s", &DeleteParams::background()).await?;
    let t1 = Instant::now();
    while !scheduled(client, "every10s").await?.is_empty() {
        ensure!(
            t1.elapsed() < Duration::from_secs(60),
            "backups outlive their schedule"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for name in &seen {
        ensure!(!any_file_of(s3, name)?, "files of {name} outlive it");
    }
    eprintln!(
        "MEASURE schedule deleted -> its backups and files gone: {:.1}s",
        t1.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Waits until cluster `name`'s `status.restore` reaches a final phase; returns it.
async fn wait_restore(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<valkey_api::bootstrap::RestoreStatus> {
    let api: Api<valkey_api::ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        let vc = api.get(name).await?;
        let r = vc.status.as_ref().and_then(|s| s.restore.clone());
        let now = format!("{:?}", r.as_ref().map(|r| (r.phase, &r.message)));
        if now != last {
            eprintln!("[restore {name} {:.1}s] {now}", clock());
            last = now;
        }
        if let Some(r) = r.filter(|r| r.phase.is_final()) {
            return Ok(r);
        }
        if Instant::now() > deadline {
            bail!("restore {name}: not done after {timeout:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every key acknowledged before backup `first` is in cluster `name` with its value and TTL,
/// and the cluster holds exactly the backup's keys.
async fn check_restored(client: &Client, name: &str, backup_keys: i64) -> anyhow::Result<()> {
    let mut conn = cluster_client(client, name, PW).await?;
    check_acked(&mut conn, KEYS, "k", "a restore").await?;
    for i in 0..TTL_KEYS {
        let key = format!("t:{i}");
        let v: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
        ensure!(
            v.as_deref() == Some(&*i.to_string()),
            "{name}: {key} = {v:?}"
        );
        let ttl: i64 = redis::cmd("TTL").arg(&key).query_async(&mut conn).await?;
        ensure!(ttl > 3000 && ttl <= 3600, "{name}: {key} TTL {ttl}");
    }
    let mut total = 0i64;
    for p in pods_of(client, name).await? {
        let ip = pod_ip(&p).context("pod IP")?;
        let role = live_role(&ip, "app", PW).await?;
        if role == "master" {
            let mut c = node_conn(&ip, "app", PW).await?;
            let n: i64 = query_cmd(&mut c, &["DBSIZE"]).await?;
            total += n;
        }
    }
    ensure!(
        total == backup_keys,
        "{name}: {total} keys, the backup holds {backup_keys}"
    );
    Ok(())
}

fn bootstrap(backup: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"bootstrap": {"backup": backup}})
}

/// A backup into Azure Blob Storage (Azurite) through the API's `azure` store (`endpoint` and
/// an account key Secret), restored from there by store and path into 2 shards.
async fn azure_round(fx: &Fixture, az: &AzureServer) -> anyhow::Result<()> {
    let client = &fx.client;
    let s: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "az-key"},
        "stringData": {"accountKey": AZURE_KEY}
    }))?;
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &s)
        .await?;
    let store = serde_json::json!({"prefix": PREFIX, "azure": {
        "account": AZURE_ACCOUNT, "container": AZURE_CONTAINER, "endpoint": az.endpoint(),
        "credentials": {"secretName": "az-key", "key": "accountKey"}}});
    let b: ValkeyBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyBackup",
        "metadata": {"name": "to-azure"},
        "spec": {"cluster": NAME, "store": store}
    }))?;
    Api::<ValkeyBackup>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &b)
        .await?;
    let t0 = Instant::now();
    let b = wait_reason(client, "to-azure", "Completed", Duration::from_secs(120)).await?;
    let st = b.status.context("status")?;
    eprintln!(
        "MEASURE backup 3x1 to Azurite: {} bytes, {:?} keys, create -> Completed {:.2}s",
        st.bytes.unwrap_or(0),
        st.keys,
        t0.elapsed().as_secs_f64()
    );
    let path = format!("{PREFIX}/{NS}/{NAME}/to-azure");
    ensure!(
        st.location.as_deref() == Some(&*format!("az://{AZURE_ACCOUNT}/{AZURE_CONTAINER}/{path}")),
        "{st:?}"
    );
    let keys = st.keys.context("keys")?;
    create_user_secret(client, "ra-app", PW).await?;
    let t0 = Instant::now();
    create_cluster_with(
        client,
        "ra",
        2,
        1,
        bootstrap(serde_json::json!({"store": store, "path": path})),
    )
    .await?;
    let r = wait_restore(client, "ra", Duration::from_secs(300)).await?;
    ensure!(
        r.phase == valkey_api::bootstrap::RestorePhase::Completed && r.keys == keys,
        "ra: {r:?}"
    );
    wait_ready(client, "ra", 2, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE restore from Azurite into 2 shards: {} keys, create -> Ready {:.1}s",
        r.keys,
        t0.elapsed().as_secs_f64()
    );
    check_restored(client, "ra", keys).await
}

/// Restores backup `first` into 3 and 5 shards; refuses a Valkey 8 target, a missing
/// manifest and a changed file, writing nothing.
async fn restores(fx: &Fixture, s3: &S3Server, backup_keys: i64) -> anyhow::Result<()> {
    let client = &fx.client;
    let t0 = Instant::now();
    for name in ["r3", "r5"] {
        create_user_secret(client, &format!("{name}-app"), PW).await?;
    }
    create_cluster_with(
        client,
        "r3",
        3,
        1,
        bootstrap(serde_json::json!({"name": "first"})),
    )
    .await?;
    let store = serde_json::json!({"s3": {"bucket": S3_BUCKET, "endpoint": s3.endpoint(),
        "forcePathStyle": true, "credentials": {"secretName": "s3-good"}}});
    create_cluster_with(
        client,
        "r5",
        5,
        1,
        bootstrap(
            serde_json::json!({"store": store, "path": format!("{PREFIX}/{NS}/{NAME}/first")}),
        ),
    )
    .await?;
    for (name, shards) in [("r3", 3), ("r5", 5)] {
        let r = wait_restore(client, name, Duration::from_secs(300)).await?;
        ensure!(
            r.phase == valkey_api::bootstrap::RestorePhase::Completed,
            "{name}: {r:?}"
        );
        ensure!(r.keys == backup_keys && r.expired == 0, "{name}: {r:?}");
        wait_ready(client, name, shards, Duration::from_secs(120)).await?;
        eprintln!(
            "MEASURE restore into {shards} shards: {} keys, {} bytes, create -> Ready {:.1}s ({})",
            r.keys,
            r.bytes,
            t0.elapsed().as_secs_f64(),
            r.message.unwrap_or_default()
        );
        check_restored(client, name, backup_keys).await?;
        ensure!(event_count(client, name, "RestoreCompleted", "Normal").await? == 1);
    }

    // Refusals: nothing is written, the cluster says why.
    let refused = |name: &'static str, extra: serde_json::Value, words: &'static str| async move {
        create_user_secret(client, &format!("{name}-app"), PW).await?;
        create_cluster_with(client, name, 1, 0, extra).await?;
        let r = wait_restore(client, name, Duration::from_secs(180)).await?;
        let msg = r.message.clone().unwrap_or_default();
        ensure!(
            r.phase == valkey_api::bootstrap::RestorePhase::Failed && msg.contains(words),
            "{name}: {r:?}"
        );
        ensure!(r.keys == 0, "{name}: keys written: {r:?}");
        let vc = wait_cluster_reason(client, name, "RestoreFailed").await?;
        eprintln!(
            "{name}: refused: {msg} (state {:?})",
            vc.status.map(|s| s.state)
        );
        anyhow::Ok(())
    };
    let mut older = bootstrap(serde_json::json!({"name": "first"}));
    older["image"] = serde_json::json!("valkey/valkey:8.0.1");
    refused("r8", older, "RDB version 80").await?;
    refused(
        "rmissing",
        bootstrap(serde_json::json!({"store": store, "path": format!("{PREFIX}/{NS}/{NAME}/nothing-here")})),
        "no manifest.json",
    )
    .await?;
    // One byte of a file changed in the store.
    let key = format!("/{S3_BUCKET}/{PREFIX}/{NS}/{NAME}/first/shard-00001.rdb");
    let mut file = get_object(s3, key.trim_start_matches(&format!("/{S3_BUCKET}/")))?;
    let mid = file.len() / 2;
    file[mid] ^= 0x01;
    let (status, body) = s3.request("PUT", &key, &file).map_err(anyhow::Error::msg)?;
    ensure!(status == 200, "PUT {key}: {status} {body}");
    refused(
        "rtampered",
        bootstrap(serde_json::json!({"name": "first"})),
        "SHA-256",
    )
    .await?;
    Ok(())
}

/// Waits until cluster `name`'s status reason is `reason`.
async fn wait_cluster_reason(
    client: &Client,
    name: &str,
    reason: &str,
) -> anyhow::Result<valkey_api::ValkeyCluster> {
    let api: Api<valkey_api::ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let vc = api.get(name).await?;
        if vc.status.as_ref().and_then(|s| s.reason.as_deref()) == Some(reason) {
            return Ok(vc);
        }
        if Instant::now() > deadline {
            bail!(
                "{name}: reason {:?}, not {reason}",
                vc.status.and_then(|s| s.reason)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_backup_to_s3() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let s3 = tokio::task::spawn_blocking(S3Server::start).await?;
    eprintln!("MEASURE S3 store start: {:.1}s", s3.startup.as_secs_f64());
    let az = tokio::task::spawn_blocking(AzureServer::start).await?;
    eprintln!(
        "MEASURE Azure store start: {:.1}s",
        az.startup.as_secs_f64()
    );
    let persistence = serde_json::json!({"persistence": {
        "size": "1Gi", "storageClassName": "standard", "reclaimPolicy": "Delete"}});
    let t0 = Instant::now();
    create_ready_cluster_with(&fx.client, NAME, PW, 3, 1, persistence).await?;
    eprintln!("MEASURE 3x1 Ready: {:.1}s", t0.elapsed().as_secs_f64());
    let result = async {
        let backup_keys = backup_under_writer(&fx, &s3).await?;
        restores(&fx, &s3, backup_keys).await?;
        azure_round(&fx, &az).await?;
        failures_are_reported(&fx, &s3).await?;
        scheduled_backups_with_retention(&fx, &s3).await
    }
    .await;
    if result.is_err() {
        eprintln!(
            "store log tail:\n{}",
            s3.log()
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    fx.stop().await;
    result
}
