//! A backup written to, checked in and restored from each kind of store the API offers,
//! through the operator's own store code (`backup::store`, `upload`, `restore_io`): S3 on a
//! real SeaweedFS, Google Cloud Storage on fake-gcs-server and Azure Blob Storage on Azurite,
//! each a real server on loopback spoken to by `object_store`'s client for that cloud. (The
//! GCS emulator cannot take `object_store`'s uploads: see [`gcs_round`].)
//!
//! For each store: a 1×1 Valkey 9.1 cluster holds 20,000 keys (100 with a TTL) and 500 values
//! of 20 kB (so the file, over 8 MiB, is uploaded in parts), acknowledged by its replica; the replica's snapshot is streamed into the store with its manifest; the
//! manifest reads back equal, the file matches its size and SHA-256, and restoring it into a
//! new 2-shard cluster puts every key, value and TTL on the shard that owns its slot. A file
//! changed in the store is refused, the backup's objects are deleted, wrong credentials are
//! refused with the store's own words and a closed port is reported as refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use valkey_api::backup_store::{
    AzureStore, BackupStore, GcsStore, S3Credentials, S3Store, SecretKey,
};
use valkey_operator::backup::manifest::{self, Manifest, ShardEntry};
use valkey_operator::backup::plan::ShardSource;
use valkey_operator::backup::restore_io::{self, Failure};
use valkey_operator::backup::{store, upload};
use valkey_ops::client::ClientConfig;
use valkey_ops::commands::{self, acl::REPLICATION_USER};
use valkey_testkit::*;

const KEYS: u64 = 20_000;
const WITH_TTL: u64 = 100;
const TTL_MS: i64 = 3_600_000;
/// Large values besides: the file is over 8 MiB, so it is uploaded in parts (the client's
/// multipart upload: S3 multipart, Azure blocks).
const BIG: u64 = 500;
const BIG_BYTES: usize = 20_000;

fn big_key(i: u64) -> String {
    format!("big-{i}")
}

/// 20 kB that do not compress (the RDB compresses values with LZF): SHA-256 digests in hex.
fn big_value(i: u64) -> String {
    use sha2::{Digest, Sha256};
    (0..BIG_BYTES / 64)
        .map(|j| hex::encode(Sha256::digest(format!("{i}-{j}"))))
        .collect()
}

/// The Secret every store's credentials are read from.
const SECRET: &str = "store-credentials";

fn secret(data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

fn s3_store(endpoint: String) -> BackupStore {
    BackupStore {
        prefix: Some("it/s3".into()),
        s3: Some(S3Store {
            bucket: S3_BUCKET.into(),
            endpoint: Some(endpoint),
            region: S3_REGION.into(),
            force_path_style: true,
            credentials: Some(S3Credentials {
                secret_name: SECRET.into(),
                access_key_id_key: "id".into(),
                secret_access_key_key: "key".into(),
                session_token_key: None,
            }),
        }),
        ..Default::default()
    }
}

fn gcs_store(endpoint: Option<String>) -> BackupStore {
    BackupStore {
        prefix: Some("it/gcs".into()),
        gcs: Some(GcsStore {
            bucket: GCS_BUCKET.into(),
            endpoint,
            credentials: Some(SecretKey {
                secret_name: SECRET.into(),
                key: "key.json".into(),
            }),
        }),
        ..Default::default()
    }
}

fn azure_store(endpoint: String) -> BackupStore {
    BackupStore {
        prefix: Some("it/azure".into()),
        azure: Some(AzureStore {
            account: AZURE_ACCOUNT.into(),
            container: AZURE_CONTAINER.into(),
            endpoint: Some(endpoint),
            credentials: Some(SecretKey {
                secret_name: SECRET.into(),
                key: "key".into(),
            }),
        }),
        ..Default::default()
    }
}

/// A 1×1 cluster holding keys `0..KEYS` (the first [`WITH_TTL`] expiring in an hour), every
/// write acknowledged by the replica.
struct Source {
    _servers: Vec<Server>,
    shard: ShardSource,
}

async fn source() -> Source {
    let servers = start_servers(Flavor::V9, 2, None);
    let op = operator_pool(None);
    let app = app_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    let ids = form_cluster(&op, &addrs[..1], &addrs[1..]).await;
    wait_replica_synced(&op, &addrs[1], "replica synced").await;
    write_keys(&app, &addrs[0], KEYS).await;
    let mut p = redis::pipe();
    for i in 0..WITH_TTL {
        p.cmd("PEXPIRE").arg(key(i)).arg(TTL_MS).ignore();
    }
    for i in 0..BIG {
        p.cmd("SET").arg(big_key(i)).arg(big_value(i)).ignore();
    }
    let () = app.pipeline(&addrs[0], &p).await.unwrap();
    // On the writer's own connection: WAIT covers that connection's writes.
    let acked = commands::wait_replicas(&app, &addrs[0], 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica acknowledged the writes");
    let replica_id = commands::node_id(&op, &addrs[1]).await.unwrap();
    Source {
        shard: ShardSource {
            slots: split_slots(1),
            primary_id: ids[0].clone(),
            primary_addr: addrs[0].parse().unwrap(),
            pod: "source-replica".into(),
            addr: addrs[1].parse().unwrap(),
            node_id: replica_id,
            from_replica: true,
        },
        _servers: servers,
    }
}

fn snapshot_client() -> ClientConfig {
    ClientConfig::new(REPLICATION_USER, REPLICATION_PASSWORD)
}

/// Streams the source's snapshot into `dir` and writes the manifest; the manifest.
async fn back_up(store: &Arc<dyn ObjectStore>, dir: &Path, src: &Source) -> Manifest {
    let file = manifest::shard_file(0);
    let t = Instant::now();
    let stored = upload::shard(
        store.clone(),
        &dir.clone().join(file.as_str()),
        &src.shard,
        &snapshot_client(),
    )
    .await
    .unwrap_or_else(|e| panic!("backup into the store: {e}"));
    println!(
        "stored {} bytes, {} keys in {:?}",
        stored.info.bytes,
        stored.summary.keys,
        t.elapsed()
    );
    assert_eq!(stored.summary.keys, KEYS + BIG);
    assert!(
        stored.info.bytes > 8 << 20,
        "{} bytes: not over one part",
        stored.info.bytes
    );
    let info = stored.info;
    let m = Manifest {
        format: manifest::FORMAT,
        cluster: "it/source".into(),
        backup: "it".into(),
        backup_uid: "uid".into(),
        valkey_version: info.server_version.clone(),
        rdb_version: info.rdb_version,
        started_at: Timestamp::now().to_string(),
        completed_at: Timestamp::now().to_string(),
        shards: vec![ShardEntry {
            file,
            slots: src.shard.slots.iter().map(manifest::range_text).collect(),
            bytes: info.bytes,
            sha256: info.sha256,
            rdb_checksum: info.rdb_checksum,
            rdb_version: info.rdb_version,
            keys: Some(stored.summary.keys),
            valkey_version: info.server_version,
            source_pod: src.shard.pod.clone(),
            source_node_id: src.shard.node_id.clone(),
            from_replica: true,
            replid: info.replid,
            offset: info.offset,
            primary_offset: None,
            started_at: Timestamp::now().to_string(),
            completed_at: Timestamp::now().to_string(),
        }],
    };
    upload::manifest(store, dir, &m).await.unwrap();
    m
}

/// Restores the backup in `dir` into a new 2-shard cluster and checks every key, value and
/// TTL on its slot's owner.
async fn restore_and_check(store: &Arc<dyn ObjectStore>, dir: &Path, written: &Manifest) {
    let m = restore_io::read_manifest(store, dir.as_ref(), "test location")
        .await
        .unwrap_or_else(|e| panic!("manifest: {e:?}"));
    assert_eq!(&m, written, "the manifest reads back as written");
    restore_io::verify(store, dir.as_ref(), &m.shards[0])
        .await
        .unwrap_or_else(|e| panic!("verify: {e:?}"));

    let servers = start_servers(Flavor::V9, 2, None);
    let op = operator_pool(None);
    let app = app_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    form_cluster(&op, &addrs, &[]).await;
    let mut owners: Vec<Option<SocketAddr>> = vec![None; 16384];
    for (a, r) in addrs.iter().zip(split_slots(2)) {
        for slot in r.start..=r.end {
            owners[usize::from(slot)] = Some(a.parse().unwrap());
        }
    }
    let primaries: Vec<SocketAddr> = addrs.iter().map(|a| a.parse().unwrap()).collect();
    let t = Instant::now();
    let got = restore_io::restore_file(
        store,
        dir.as_ref(),
        &m.shards[0].file,
        &owners,
        &primaries,
        &op,
    )
    .await
    .unwrap_or_else(|e| panic!("restore: {e:?}"));
    println!("restored {got:?} in {:?}", t.elapsed());
    assert_eq!((got.keys, got.expired, got.partial), (KEYS + BIG, 0, 0));
    assert_eq!(got.bytes, m.shards[0].bytes);
    assert_eq!(
        count_bad_keys(&app, &addrs[0], KEYS).await,
        0,
        "keys or values differ"
    );
    assert_eq!(total_keys(&app, &addrs).await, KEYS + BIG);
    for i in [0, BIG - 1] {
        let k = big_key(i);
        let owner = owners[usize::from(key_slot(k.as_bytes()))]
            .unwrap()
            .to_string();
        let v: String = app.query(&owner, redis::cmd("GET").arg(&k)).await.unwrap();
        assert!(v == big_value(i), "{k}: {} bytes differ", v.len());
    }
    let mut per_shard = BTreeMap::new();
    for a in &addrs {
        let n: u64 = app.query(a, &redis::cmd("DBSIZE")).await.unwrap();
        per_shard.insert(a.clone(), n);
    }
    assert!(
        per_shard.values().all(|n| *n > KEYS / 3),
        "keys on both shards: {per_shard:?}"
    );
    // TTLs: exact absolute expiries came along (within the time since they were set).
    for i in [0, WITH_TTL - 1, WITH_TTL, KEYS - 1] {
        let k = key(i);
        let owner = owners[usize::from(key_slot(k.as_bytes()))]
            .unwrap()
            .to_string();
        let pttl: i64 = app.query(&owner, redis::cmd("PTTL").arg(&k)).await.unwrap();
        if i < WITH_TTL {
            assert!(
                pttl > TTL_MS - 120_000 && pttl <= TTL_MS,
                "{k}: PTTL {pttl}"
            );
        } else {
            assert_eq!(pttl, -1, "{k}: PTTL");
        }
    }
}

/// The stored file with one byte changed (the same size), for the caller to write back.
async fn tampered(store: &Arc<dyn ObjectStore>, dir: &Path, m: &Manifest) -> (Path, Vec<u8>) {
    let path = dir.clone().join(m.shards[0].file.as_str());
    let mut body = store
        .get(&path)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap()
        .to_vec();
    let at = body.len() / 2;
    body[at] ^= 0x01;
    (path, body)
}

/// The changed file is refused: the sizes are equal and the digests are not.
async fn tampered_is_refused(store: &Arc<dyn ObjectStore>, dir: &Path, m: &Manifest) {
    match restore_io::verify(store, dir.as_ref(), &m.shards[0]).await {
        Err(Failure::Refuse(why)) => assert!(why.contains("the file was changed"), "{why}"),
        other => panic!("a changed file was not refused: {other:?}"),
    }
}

/// Deletes the backup's objects; none is left.
async fn delete(store: &Arc<dyn ObjectStore>, dir: &Path) {
    let n = store::delete_all(store, dir.as_ref()).await.unwrap();
    assert_eq!(n, 2, "the shard file and the manifest");
    match restore_io::read_manifest(store, dir.as_ref(), "deleted").await {
        Err(Failure::Refuse(why)) => assert!(why.contains("no manifest.json"), "{why}"),
        other => panic!("the manifest is still there: {other:?}"),
    }
}

/// The snapshot into `spec`'s store fails with a store error containing `words`.
async fn refused(spec: &BackupStore, secret: &Secret, src: &Source, words: &[&str]) {
    let store = store::build(spec, Some(secret)).unwrap();
    let t = Instant::now();
    match upload::shard(
        store,
        &Path::from("refused/shard-00000.rdb"),
        &src.shard,
        &snapshot_client(),
    )
    .await
    {
        Err(upload::UploadError::Store(why)) => {
            println!("refused in {:?}: {why}", t.elapsed());
            assert!(
                words.iter().any(|w| why.contains(w)),
                "{why:?} names none of {words:?}"
            );
        }
        Err(other) => panic!("not a store error: {other}"),
        Ok(_) => panic!("the store accepted the backup"),
    }
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
}

/// A loopback port nothing listens on.
fn closed_port_endpoint() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

async fn full_round(spec: &BackupStore, secret: &Secret, src: &Source) {
    let store = store::build(spec, Some(secret)).unwrap();
    let dir = Path::from(spec.backup_path("ns", "source", "b1").as_str());
    let m = back_up(&store, &dir, src).await;
    restore_and_check(&store, &dir, &m).await;
    let (path, body) = tampered(&store, &dir, &m).await;
    store.put(&path, PutPayload::from(body)).await.unwrap();
    tampered_is_refused(&store, &dir, &m).await;
    delete(&store, &dir).await;
}

/// [`full_round`] for Google Cloud Storage. The emulator serves reads, lists and deletes but
/// not the XML API object upload that `object_store`'s GCS client writes with (it answers
/// `400 invalid uploadType`), so the backup is taken into `object_store`'s in-memory store and
/// its objects copied in through the emulator's JSON API; everything after that (manifest,
/// file check, restore, the changed file, deletion) goes through the operator's GCS client.
async fn gcs_round(spec: &BackupStore, secret: &Secret, src: &Source, gcs: &GcsServer) {
    let staging: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dir = Path::from(spec.backup_path("ns", "source", "b1").as_str());
    let m = back_up(&staging, &dir, src).await;
    let objects: Vec<_> = staging.list(Some(&dir)).try_collect().await.unwrap();
    for o in &objects {
        let body = staging
            .get(&o.location)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        gcs.put_object(o.location.as_ref(), &body).unwrap();
    }
    let store = store::build(spec, Some(secret)).unwrap();
    restore_and_check(&store, &dir, &m).await;
    let (path, body) = tampered(&store, &dir, &m).await;
    gcs.put_object(path.as_ref(), &body).unwrap();
    tampered_is_refused(&store, &dir, &m).await;
    delete(&store, &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_store_round_trip_on_seaweedfs() {
    init_tracing();
    let s3 = S3Server::start();
    let src = source().await;
    let creds = secret(&[("id", &s3.access_key), ("key", &s3.secret_key)]);
    full_round(&s3_store(s3.endpoint()), &creds, &src).await;
    let wrong = secret(&[("id", &s3.access_key), ("key", "not-the-secret-key")]);
    refused(
        &s3_store(s3.endpoint()),
        &wrong,
        &src,
        &["SignatureDoesNotMatch"],
    )
    .await;
    refused(
        &s3_store(closed_port_endpoint()),
        &creds,
        &src,
        &["Connection refused"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_store_round_trip_on_fake_gcs_server() {
    init_tracing();
    let gcs = GcsServer::start();
    let src = source().await;
    // The emulator's address from the key file (the form object_store documents for it), and
    // then from the store's `endpoint` (which wins over the key file's).
    let key = gcs.service_account_key();
    let creds = secret(&[("key.json", &key)]);
    gcs_round(&gcs_store(None), &creds, &src, &gcs).await;
    gcs_round(&gcs_store(Some(gcs.endpoint())), &creds, &src, &gcs).await;
    // The emulator checks no credentials: only the closed port.
    refused(
        &gcs_store(Some(closed_port_endpoint())),
        &creds,
        &src,
        &["Connection refused"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_store_round_trip_on_azurite() {
    init_tracing();
    let az = AzureServer::start();
    let src = source().await;
    let creds = secret(&[("key", AZURE_KEY)]);
    full_round(&azure_store(az.endpoint()), &creds, &src).await;
    // Another valid base64 key: the signature does not match.
    let wrong = secret(&[("key", "bm90LXRoZS1hY2NvdW50LWtleS1idXQtdmFsaWQtYmFzZTY0")]);
    refused(
        &azure_store(az.endpoint()),
        &wrong,
        &src,
        &["AuthorizationFailure", "AuthenticationFailed", "403"],
    )
    .await;
    let closed = format!("{}/{AZURE_ACCOUNT}", closed_port_endpoint());
    refused(&azure_store(closed), &creds, &src, &["Connection refused"]).await;
}
