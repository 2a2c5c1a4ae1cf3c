//! Needs real `valkey-server` binaries (see the `valkey-testkit` crate): full RDB snapshots
//! streamed from the replica of a one-shard cluster (disk-based and diskless, Valkey 9.1 and
//! 8.0, TCP and TLS), each restored into a fresh standalone server and compared key by key
//! with the dataset written; the replica stays a healthy replica; errors carry the server's
//! words.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::FromRedisValue;
use tokio::io::AsyncWrite;
use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::commands;
use valkey_ops::snapshot::{
    RdbMagic, SnapshotError, SnapshotInfo, SnapshotOptions, Transfer, stream_snapshot,
};
use valkey_testkit::*;

const BACKUP_USER: &str = "backup";
const BACKUP_PASSWORD: &str = "backup-secret";
/// What a snapshot needs, and nothing else.
const BACKUP_RULES: &[&str] = &["resetchannels", "-@all", "+psync", "+replconf"];
const KEYS: u64 = 20_000;
const TTL_MS: i64 = 3_600_000;

/// A one-shard cluster: servers (primary, replica), operator and application pools, the
/// primary's and the replica's addresses.
struct Shard {
    servers: Vec<Server>,
    op: NodePool,
    app: NodePool,
    primary: String,
    replica: String,
}

async fn shard(flavor: Flavor, tls: Option<&TlsFiles>) -> Shard {
    let servers = start_servers(flavor, 2, tls);
    let op = operator_pool(tls);
    let app = app_pool(tls);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    form_cluster(&op, &addrs[..1], &addrs[1..]).await;
    wait_replica_synced(&op, &addrs[1], "replica synced").await;
    for a in &addrs {
        set_user(&op, a, BACKUP_USER, BACKUP_RULES).await;
    }
    Shard {
        servers,
        op,
        app,
        primary: addrs[0].clone(),
        replica: addrs[1].clone(),
    }
}

async fn set_user(op: &NodePool, addr: &str, user: &str, rules: &[&str]) {
    let mut c = redis::cmd("ACL");
    c.arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(format!(">{BACKUP_PASSWORD}"));
    for r in rules {
        c.arg(*r);
    }
    let () = op.query(addr, &c).await.unwrap();
}

fn backup_config(tls: Option<&TlsFiles>) -> ClientConfig {
    let c = ClientConfig::new(BACKUP_USER, BACKUP_PASSWORD);
    match tls {
        // The first name does not match the certificate: the next one is tried.
        Some(t) => c.with_tls_names(
            t.ca_pem.clone(),
            vec!["not-this.cluster.test".into(), TLS_SERVER_NAME.into()],
        ),
        None => c,
    }
}

/// Key `i` of the dataset: its name and type (by `i % 6`); every 7th key expires in an hour.
fn key_name(i: u64) -> String {
    let prefix = ["s", "h", "l", "S", "z", "x"][(i % 6) as usize];
    format!("{prefix}:{{{}}}:{i}", i % 97)
}

fn string_value(i: u64) -> String {
    if i.is_multiple_of(3000) {
        // A few large values (LZF-compressed in the RDB).
        format!("big-{i}-").repeat(20_000)
    } else {
        format!("value-{i}")
    }
}

fn members(i: u64) -> Vec<String> {
    (0..5).map(|j| format!("m{i}-{j}")).collect()
}

/// Writes keys `0..n` of assorted types to `addr`, pipelined.
async fn fill(app: &NodePool, addr: &str, n: u64) {
    let mut at = 0;
    while at < n {
        let end = (at + 500).min(n);
        let mut p = redis::pipe();
        for i in at..end {
            let k = key_name(i);
            let m = members(i);
            match i % 6 {
                0 => p.cmd("SET").arg(&k).arg(string_value(i)).ignore(),
                1 => {
                    let c = p.cmd("HSET").arg(&k);
                    for (j, f) in m.iter().enumerate() {
                        c.arg(f).arg(format!("v{j}"));
                    }
                    c.ignore()
                }
                2 => p.cmd("RPUSH").arg(&k).arg(&m).ignore(),
                3 => p.cmd("SADD").arg(&k).arg(&m).ignore(),
                4 => {
                    let c = p.cmd("ZADD").arg(&k);
                    for (j, f) in m.iter().enumerate() {
                        c.arg(j).arg(f);
                    }
                    c.ignore()
                }
                _ => {
                    p.cmd("XADD").arg(&k).arg("1-1").arg("a").arg(i).ignore();
                    p.cmd("XADD").arg(&k).arg("1-2").arg("b").arg(i).ignore()
                }
            };
            if i.is_multiple_of(7) {
                p.cmd("PEXPIRE").arg(&k).arg(TTL_MS).ignore();
            }
        }
        let () = app.pipeline(addr, &p).await.unwrap();
        at = end;
    }
}

fn parse<T: FromRedisValue>(v: redis::Value) -> T {
    T::from_redis_value(v).unwrap()
}

/// Checks that the server at `addr` holds exactly keys `0..n` with their values and TTLs.
async fn check_dataset(pool: &NodePool, addr: &str, n: u64) {
    let size: u64 = pool.query(addr, &redis::cmd("DBSIZE")).await.unwrap();
    assert_eq!(size, n, "DBSIZE of the restored server");
    let mut at = 0;
    while at < n {
        let end = (at + 500).min(n);
        let mut p = redis::pipe();
        for i in at..end {
            let k = key_name(i);
            match i % 6 {
                0 => p.cmd("GET").arg(&k),
                1 => p.cmd("HGETALL").arg(&k),
                2 => p.cmd("LRANGE").arg(&k).arg(0).arg(-1),
                3 => p.cmd("SMEMBERS").arg(&k),
                4 => p.cmd("ZRANGE").arg(&k).arg(0).arg(-1).arg("WITHSCORES"),
                _ => p.cmd("XRANGE").arg(&k).arg("-").arg("+"),
            };
            p.cmd("PTTL").arg(&k);
        }
        let replies: Vec<redis::Value> = pool.pipeline(addr, &p).await.unwrap();
        let mut replies = replies.into_iter();
        for i in at..end {
            let v = replies.next().unwrap();
            let m = members(i);
            match i % 6 {
                0 => assert_eq!(parse::<String>(v), string_value(i), "key {i}"),
                1 => {
                    let want: BTreeMap<String, String> = m
                        .iter()
                        .enumerate()
                        .map(|(j, f)| (f.clone(), format!("v{j}")))
                        .collect();
                    assert_eq!(parse::<BTreeMap<String, String>>(v), want, "key {i}");
                }
                2 => assert_eq!(parse::<Vec<String>>(v), m, "key {i}"),
                3 => assert_eq!(
                    parse::<BTreeSet<String>>(v),
                    m.iter().cloned().collect::<BTreeSet<_>>(),
                    "key {i}"
                ),
                4 => {
                    let want: Vec<String> = m
                        .iter()
                        .enumerate()
                        .flat_map(|(j, f)| [f.clone(), j.to_string()])
                        .collect();
                    assert_eq!(parse::<Vec<String>>(v), want, "key {i}");
                }
                _ => {
                    let entries: Vec<(String, Vec<String>)> = parse(v);
                    let want = vec![
                        ("1-1".to_owned(), vec!["a".to_owned(), i.to_string()]),
                        ("1-2".to_owned(), vec!["b".to_owned(), i.to_string()]),
                    ];
                    assert_eq!(entries, want, "key {i}");
                }
            }
            let pttl: i64 = parse(replies.next().unwrap());
            if i.is_multiple_of(7) {
                assert!(pttl > 0 && pttl <= TTL_MS, "key {i}: PTTL {pttl}");
            } else {
                assert_eq!(pttl, -1, "key {i}: PTTL");
            }
        }
        at = end;
    }
}

/// Starts a fresh standalone server of `flavor` on `rdb` (as its `dump.rdb`) and checks that
/// it loaded keys `0..n` intact.
async fn restore_and_check(flavor: Flavor, rdb: &[u8], n: u64) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dump.rdb"), rdb).unwrap();
    let port = free_port();
    let conf = dir.path().join("restore.conf");
    let d = dir.path().display();
    std::fs::write(
        &conf,
        format!(
            "bind 127.0.0.1\nport {port}\ndir {d}\ndbfilename dump.rdb\nappendonly no\n\
             save \"\"\ncluster-enabled no\nrequirepass restore-secret\n"
        ),
    )
    .unwrap();
    let server = Server::start_config(&flavor.binary(), &conf, port, &[]);
    let pool = NodePool::new(ClientConfig::new("default", "restore-secret"));
    let addr = server.addr();
    eventually(
        "restored server loaded",
        Duration::from_secs(30),
        || async {
            match pool.query::<u64>(&addr, &redis::cmd("DBSIZE")).await {
                Ok(_) => Some(()),
                Err(e) if e.server_code() == Some("LOADING") => None,
                Err(e) => panic!("restored server: {e}\n{}", log_of(&conf)),
            }
        },
    )
    .await;
    check_dataset(&pool, &addr, n).await;
}

fn log_of(conf: &Path) -> String {
    std::fs::read_to_string(conf.with_extension("log")).unwrap_or_default()
}

/// The replica is still a synced replica of the primary, takes new writes, and the snapshot
/// connection is gone from both nodes.
async fn check_replication_healthy(s: &Shard) {
    wait_replica_synced(&s.op, &s.replica, "replica synced after the snapshot").await;
    let () = s
        .app
        .query(&s.primary, redis::cmd("SET").arg("after-snapshot").arg("1"))
        .await
        .unwrap();
    let acked = commands::wait_replicas(&s.app, &s.primary, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(acked, 1, "WAIT 1 on the primary after the snapshot");
    let () = s
        .app
        .query(&s.primary, redis::cmd("DEL").arg("after-snapshot"))
        .await
        .unwrap();
    eventually(
        "snapshot connection gone, replica online",
        Duration::from_secs(10),
        || async {
            let p = commands::observe_node(&s.op, &s.primary)
                .await
                .ok()?
                .replication?;
            let r = commands::observe_node(&s.op, &s.replica)
                .await
                .ok()?
                .replication?;
            (p.connected_replicas == 1
                && p.replicas.iter().all(|c| c.is_online())
                && r.connected_replicas == 0)
                .then_some(())
        },
    )
    .await;
}

/// The serving node's replication offset.
async fn repl_offset(op: &NodePool, addr: &str) -> i64 {
    let r = commands::observe_node(op, addr)
        .await
        .unwrap()
        .replication
        .unwrap();
    r.replica_repl_offset.unwrap_or(r.master_repl_offset)
}

async fn snapshot_round_trips(flavor: Flavor, tls: Option<&TlsFiles>) {
    init_tracing();
    let s = shard(flavor, tls).await;
    fill(&s.app, &s.primary, KEYS).await;
    // On the writer's own connection: WAIT waits for the calling connection's last write (on
    // the operator's connection it returned at once and a snapshot over TLS on 8.0 missed up to
    // 2,400 keys the replica had not applied yet).
    let acked = commands::wait_replicas(&s.app, &s.primary, 1, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(acked, 1);
    for diskless in [false, true] {
        let delay = if diskless { "2" } else { "0" };
        commands::config_set(
            &s.op,
            &s.replica,
            &[
                ("repl-diskless-sync", if diskless { "yes" } else { "no" }),
                ("repl-diskless-sync-delay", delay),
            ],
        )
        .await
        .unwrap();
        let offset_before = repl_offset(&s.op, &s.replica).await;
        let mut rdb = Vec::new();
        let started = Instant::now();
        let info = stream_snapshot(
            &s.replica,
            &backup_config(tls),
            &SnapshotOptions::default(),
            &mut rdb,
        )
        .await
        .unwrap_or_else(|e| panic!("{flavor:?} diskless={diskless}: {e}"));
        println!(
            "{flavor:?} tls={} diskless={diskless}: {info:?} in {:?}",
            tls.is_some(),
            started.elapsed()
        );
        check_info(flavor, &info, &rdb, diskless);
        // The server's own count, read from the RDB's first database record.
        assert_eq!(info.keys, Some(KEYS), "{info:?}");
        assert!(
            info.offset as i64 >= offset_before,
            "snapshot offset {} before the replica's {offset_before}",
            info.offset
        );
        if diskless {
            // The server waited `repl-diskless-sync-delay` (2 s) for more replicas, sending a
            // newline every second.
            assert!(info.keepalives >= 1, "{info:?}");
        }
        restore_and_check(flavor, &rdb, KEYS).await;
        check_replication_healthy(&s).await;
    }
    drop(s.servers);
}

fn check_info(flavor: Flavor, info: &SnapshotInfo, rdb: &[u8], diskless: bool) {
    use sha2::Digest;
    assert_eq!(info.bytes, rdb.len() as u64);
    assert_eq!(info.sha256, hex::encode(sha2::Sha256::digest(rdb)));
    assert_eq!(info.replid.len(), 40, "{info:?}");
    match flavor {
        Flavor::V9 => {
            assert_eq!((info.rdb_magic, info.rdb_version), (RdbMagic::Valkey, 80));
            assert!(rdb.starts_with(b"VALKEY080"));
            assert!(info.server_version.starts_with("9."), "{info:?}");
        }
        Flavor::V8 => {
            assert_eq!((info.rdb_magic, info.rdb_version), (RdbMagic::Redis, 11));
            assert!(rdb.starts_with(b"REDIS0011"));
            assert!(info.server_version.starts_with("8."), "{info:?}");
        }
    }
    let stored = u64::from_le_bytes(rdb[rdb.len() - 8..].try_into().unwrap());
    assert_eq!(info.rdb_checksum, Some(stored));
    assert_eq!(rdb[rdb.len() - 9], 0xFF);
    match info.transfer {
        Transfer::Diskless => assert!(diskless, "{info:?}"),
        Transfer::Disk { len } => {
            assert!(!diskless, "{info:?}");
            assert_eq!(len, rdb.len() as u64);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_snapshot_from_replica_disk_and_diskless() {
    snapshot_round_trips(Flavor::V9, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_snapshot_from_replica_disk_and_diskless() {
    if Flavor::V8.installed().is_none() {
        println!(
            "skipped: no Valkey 8 binary at {}",
            Flavor::V8.binary().display()
        );
        return;
    }
    snapshot_round_trips(Flavor::V8, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_snapshot_over_tls() {
    if Flavor::V8.installed().is_none() {
        println!(
            "skipped: no Valkey 8 binary at {}",
            Flavor::V8.binary().display()
        );
        return;
    }
    let tls = TlsFiles::generate();
    snapshot_round_trips(Flavor::V8, Some(&tls)).await;
}

/// A sink that pauses on its first write (a slow object store), to look at the serving node
/// mid-transfer.
struct SlowSink {
    data: Vec<u8>,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
    paused: bool,
}

impl AsyncWrite for SlowSink {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if !self.paused {
            let sleep = self
                .pause
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(1500))));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.paused = true;
        }
        self.data.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

use std::future::Future;

/// A replica frozen while its primary takes writes lags behind; [`commands::wait_replica_offset`]
/// returns once it runs again and has applied them, so its snapshot holds every write the
/// primary had when the wait began. Frozen for longer than the wait, the result says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_snapshot_after_a_lagging_replica_caught_up() {
    init_tracing();
    let s = shard(Flavor::V9, None).await;
    fill(&s.app, &s.primary, 1_000).await;
    s.servers[1].freeze();
    let mut p = redis::pipe();
    for i in 0..5_000 {
        p.cmd("SET").arg(format!("late:{i}")).arg(i).ignore();
    }
    let () = s.app.pipeline(&s.primary, &p).await.unwrap();
    let resume = {
        let pid = s.servers[1].pid().unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status()
                .unwrap();
        })
    };
    let c = commands::wait_replica_offset(&s.op, &s.primary, &s.replica, Duration::from_secs(10))
        .await
        .unwrap();
    resume.await.unwrap();
    println!("{c:?}");
    assert!(c.caught_up() && c.lag() == Some(0), "{c:?}");
    assert!(c.waited >= Duration::from_millis(400), "{c:?}");
    let mut rdb = Vec::new();
    let info = stream_snapshot(
        &s.replica,
        &backup_config(None),
        &SnapshotOptions::default(),
        &mut rdb,
    )
    .await
    .unwrap();
    assert!(info.offset as i64 >= c.target, "{info:?} {c:?}");
    assert_eq!(
        info.keys,
        Some(6_000),
        "every write the primary had is in the snapshot"
    );

    // Frozen past the wait: not caught up, the replica never answered.
    s.servers[1].freeze();
    let () = s
        .app
        .query(&s.primary, redis::cmd("SET").arg("later").arg("1"))
        .await
        .unwrap();
    let c =
        commands::wait_replica_offset(&s.op, &s.primary, &s.replica, Duration::from_millis(300))
            .await
            .unwrap();
    s.servers[1].resume();
    assert!(
        !c.caught_up() && c.reached.is_none() && c.lag().is_none(),
        "{c:?}"
    );
    assert!(c.waited < Duration::from_secs(1), "{c:?}");
    // Running again, the same connection pool still works.
    let c = commands::wait_replica_offset(&s.op, &s.primary, &s.replica, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(c.caught_up(), "{c:?}");
    check_replication_healthy(&s).await;
}

/// While a snapshot is prepared, the serving node lists the connection as a replica with port
/// 0, and the operator's observation still parses; the primary is not involved. The sink then
/// stalls for 1.5 s, and the snapshot completes all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_serving_node_seen_mid_snapshot() {
    init_tracing();
    let s = shard(Flavor::V9, None).await;
    fill(&s.app, &s.primary, KEYS).await;
    commands::wait_replicas(&s.app, &s.primary, 1, Duration::from_secs(10))
        .await
        .unwrap();
    // The serving node waits 2 s for more replicas before it forks: the connection is listed
    // meanwhile (a transfer of this size is otherwise over, server side, within milliseconds:
    // it fits in the socket buffers).
    commands::config_set(
        &s.op,
        &s.replica,
        &[
            ("repl-diskless-sync", "yes"),
            ("repl-diskless-sync-delay", "2"),
        ],
    )
    .await
    .unwrap();
    let mut sink = SlowSink {
        data: Vec::new(),
        pause: None,
        paused: false,
    };
    let config = backup_config(None);
    let options = SnapshotOptions::default();
    let snapshot = stream_snapshot(&s.replica, &config, &options, &mut sink);
    let look = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let r = commands::observe_node(&s.op, &s.replica).await.unwrap();
        let p = commands::observe_node(&s.op, &s.primary).await.unwrap();
        (r.replication.unwrap(), p.replication.unwrap())
    };
    let (info, (serving, primary)) = tokio::join!(snapshot, look);
    let info = info.unwrap();
    println!("serving node mid-snapshot: {serving:?}\nprimary: {primary:?}");
    assert_eq!(serving.connected_replicas, 1, "{serving:?}");
    assert_eq!(serving.replicas[0].port, 0, "{serving:?}");
    assert!(!serving.replicas[0].is_online(), "{serving:?}");
    assert_eq!(primary.connected_replicas, 1, "{primary:?}");
    assert_eq!(info.bytes, sink.data.len() as u64);
    check_replication_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_snapshot_errors_carry_the_servers_words() {
    init_tracing();
    let mut s = shard(Flavor::V9, None).await;
    let options = SnapshotOptions::default();

    // No +psync.
    set_user(&s.op, &s.replica, "no-psync", &["-@all", "+replconf"]).await;
    let cfg = ClientConfig::new("no-psync", BACKUP_PASSWORD);
    let e = stream_snapshot(&s.replica, &cfg, &options, &mut Vec::new())
        .await
        .unwrap_err();
    println!("{e}");
    assert!(
        matches!(&e, SnapshotError::Server { command, .. } if command == "PSYNC"),
        "{e:?}"
    );
    let m = e.server_message().unwrap();
    assert!(m.starts_with("NOPERM") && m.contains("'psync'"), "{m}");

    // No +replconf.
    set_user(&s.op, &s.replica, "no-replconf", &["-@all", "+psync"]).await;
    let cfg = ClientConfig::new("no-replconf", BACKUP_PASSWORD);
    let e = stream_snapshot(&s.replica, &cfg, &options, &mut Vec::new())
        .await
        .unwrap_err();
    println!("{e}");
    assert!(
        matches!(&e, SnapshotError::Server { command, .. } if command == "REPLCONF"),
        "{e:?}"
    );
    assert!(e.to_string().contains("'replconf'"), "{e}");

    // Wrong password.
    let cfg = ClientConfig::new(BACKUP_USER, "wrong");
    let e = stream_snapshot(&s.replica, &cfg, &options, &mut Vec::new())
        .await
        .unwrap_err();
    println!("{e}");
    assert!(matches!(e, SnapshotError::Auth { .. }), "{e:?}");
    assert!(e.server_message().unwrap().starts_with("WRONGPASS"), "{e}");

    // A replica that lost its primary does not serve a snapshot.
    s.servers[0].kill();
    eventually("replica link down", Duration::from_secs(10), || async {
        let r = commands::observe_node(&s.op, &s.replica)
            .await
            .ok()?
            .replication?;
        (r.primary_link_status == Some(valkey_ops::model::PrimaryLinkStatus::Down)).then_some(())
    })
    .await;
    let e = stream_snapshot(&s.replica, &backup_config(None), &options, &mut Vec::new())
        .await
        .unwrap_err();
    println!("{e}");
    assert!(
        e.server_message()
            .is_some_and(|m| m.starts_with("NOMASTERLINK")),
        "{e:?}"
    );
}

/// Throughput on 1,000,000 small keys (`cargo test --test real_valkey_snapshot -- --ignored
/// --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: fills 1,000,000 keys"]
async fn real_valkey9_snapshot_throughput() {
    init_tracing();
    let n: u64 = std::env::var("SNAPSHOT_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let s = shard(Flavor::V9, None).await;
    let t = Instant::now();
    write_keys(&s.app, &s.primary, n).await;
    let acked = commands::wait_replicas(&s.app, &s.primary, 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(acked, 1);
    let replica_keys: u64 = s.op.query(&s.replica, &redis::cmd("DBSIZE")).await.unwrap();
    assert_eq!(replica_keys, n);
    println!("filled {n} keys in {:?}", t.elapsed());
    for diskless in [false, true, false, true] {
        commands::config_set(
            &s.op,
            &s.replica,
            &[
                ("repl-diskless-sync", if diskless { "yes" } else { "no" }),
                ("repl-diskless-sync-delay", "0"),
            ],
        )
        .await
        .unwrap();
        let t = Instant::now();
        let info = stream_snapshot(
            &s.replica,
            &backup_config(None),
            &SnapshotOptions::default(),
            &mut tokio::io::sink(),
        )
        .await
        .unwrap();
        let secs = t.elapsed().as_secs_f64();
        println!(
            "diskless={diskless}: {} bytes ({} keys) in {secs:.2} s = {:.1} MB/s (RDB {}, {} keep-alives, offset {})",
            info.bytes,
            n,
            info.bytes as f64 / secs / 1e6,
            info.rdb_version,
            info.keepalives,
            info.offset,
        );
    }
    check_replication_healthy(&s).await;
}
