//! Needs real `valkey-server` binaries (see the `valkey-testkit` crate): a server of each
//! version (9.1 and 8.0, cluster mode) filled with keys of every type and encoding, saved;
//! its `dump.rdb` split by `valkey_ops::rdb::RecordReader`, each payload compared with the
//! source's own `DUMP`, then `RESTORE`d into fresh servers (same version; 8.0's file also into
//! 9.1) and compared key by key. A 9.1 payload is refused by 8.0 (the error is printed), and
//! `key_slot` agrees with `CLUSTER KEYSLOT`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, Value};
use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::rdb::{Item, RdbMagic, Record, RecordReader, Summary, split_dump_payload, types};
use valkey_testkit::*;

const PASSWORD: &str = "rdb-secret";
/// Bulk keys (small strings, hashes, lists, sets, sorted sets).
const BULK_KEYS: u64 = 200_000;
/// Every `TTL_EVERY`th bulk key expires.
const TTL_EVERY: u64 = 7;
/// Far enough ahead that nothing expires during the test.
const TTL_MS: i64 = 3_600_000;
const LIBRARY: &str = "#!lua name=rdblib\n\
    -- a library restored from an RDB: this comment is long enough, and repetitive enough,\n\
    -- to be LZF-compressed in the RDB, repetitive enough, repetitive enough, repetitive.\n\
    server.register_function('rdb_echo', function(keys, args) return args[1] end)\n";

/// A server started from a config of the test's own (kept with its directory).
struct Node {
    _server: Server,
    /// Cluster bus port (cluster mode).
    bus_port: u16,
    dir: tempfile::TempDir,
    pool: NodePool,
    addr: String,
}

/// Starts `flavor`'s server, standalone or in cluster mode (on 9.1 with 4 databases, owning
/// no slot yet); `extra` config lines.
async fn start(flavor: Flavor, cluster: bool, extra: &[&str]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let (port, bus_port) = (free_port(), free_port());
    let d = dir.path().display();
    let mut conf = vec![
        "bind 127.0.0.1".to_owned(),
        format!("port {port}"),
        format!("dir {d}"),
        "dbfilename dump.rdb".into(),
        "appendonly no".into(),
        "save \"\"".into(),
        format!("requirepass {PASSWORD}"),
        format!("masterauth {PASSWORD}"),
        "enable-debug-command yes".into(),
        "rdbcompression yes".into(),
        "databases 16".into(),
    ];
    if cluster {
        conf.extend([
            "cluster-enabled yes".into(),
            format!("cluster-port {bus_port}"),
            "cluster-config-file nodes.conf".into(),
        ]);
        if flavor == Flavor::V9 {
            conf.push("cluster-databases 4".into());
        }
    }
    conf.extend(extra.iter().map(|s| (*s).to_owned()));
    let path = dir.path().join("valkey.conf");
    std::fs::write(&path, conf.join("\n") + "\n").unwrap();
    let server = Server::start_config(&flavor.binary(), &path, port, &[]);
    let pool = NodePool::new(
        ClientConfig::new("default", PASSWORD)
            .with_timeouts(Duration::from_secs(5), Duration::from_secs(120)),
    );
    let addr = server.addr();
    Node {
        _server: server,
        bus_port,
        dir,
        pool,
        addr,
    }
}

/// Assigns slots `first..=last` to `node`.
async fn own_slots(node: &Node, first: u16, last: u16) {
    let () = node
        .pool
        .query(
            &node.addr,
            redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last),
        )
        .await
        .unwrap();
}

/// Waits until each node reports `cluster_state:ok` and knows `nodes.len()` nodes.
async fn wait_ok(nodes: &[&Node]) {
    for n in nodes {
        eventually("cluster_state:ok", Duration::from_secs(20), || async {
            let info: String = n
                .pool
                .query(&n.addr, redis::cmd("CLUSTER").arg("INFO"))
                .await
                .ok()?;
            (info.contains("cluster_state:ok")
                && info.contains(&format!("cluster_known_nodes:{}", nodes.len())))
            .then_some(())
        })
        .await;
    }
}

/// A standalone server, or a cluster node owning every slot.
async fn start_owning_all(flavor: Flavor, extra: &[&str]) -> Node {
    let node = start(flavor, true, extra).await;
    own_slots(&node, 0, 16383).await;
    wait_ok(&[&node]).await;
    node
}

/// A command from its arguments.
macro_rules! c {
    ($($a:expr),+ $(,)?) => {{
        let mut c = redis::Cmd::new();
        $(c.arg($a);)+
        c
    }};
}

/// Runs `cmds` in database `db`, pipelined, checking that none fails.
async fn run(node: &Node, db: u64, cmds: &[redis::Cmd]) {
    for batch in cmds.chunks(1000) {
        let mut p = redis::pipe();
        p.cmd("SELECT").arg(db).ignore();
        for c in batch {
            p.add_command(c.clone()).ignore();
        }
        let () = node
            .pool
            .pipeline(&node.addr, &p)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A deterministic, incompressible-looking byte string.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Keys of every type and encoding in database `db` (names prefixed by it); the large
/// collections have `big` elements (over the compact encodings' limits from 600), and with
/// `big` under 10,000 no string is large.
fn special_keys(flavor: Flavor, db: u64, big: u32) -> Vec<redis::Cmd> {
    let p = |s: &str| format!("{db}:{s}");
    let mut v = vec![
        c!("SET", p("str:small"), "hello"),
        c!("SET", p("str:empty"), ""),
        c!("SET", p("str:int8"), "-5"),
        c!("SET", p("str:int16"), "1000"),
        c!("SET", p("str:int32"), "-100000"),
        c!("SET", p("str:int64"), "12345678901234"),
        c!("SET", p("str:lzf"), "abcabcabc-".repeat(100)),
        c!("SET", p("str:noise"), noise(db, 3000)),
        c!("SET", "12345", "an integer-encoded key"),
        c!("SET", "k".repeat(80), "an LZF-compressed key"),
        c!("SET", b"bin\x00\xff{tag}".to_vec(), noise(7, 10)),
        c!("APPEND", p("str:appended"), "x"),
        c!("SETRANGE", p("str:appended"), 100, "y"),
        c!("RPUSH", p("list:small"), "a", "b", 3, -4),
        c!("LPUSH", p("list:ints"), 1, 2, 300, 70_000, 5_000_000_000i64),
        c!("PEXPIRE", p("list:ints"), TTL_MS),
        c!("SADD", p("set:intset"), 1, 2, 3, -70_000, 5_000_000_000i64),
        c!("SADD", p("set:listpack"), "a", "b", 3),
        c!(
            "ZADD",
            p("zset:listpack"),
            1.5,
            "a",
            "-inf",
            "b",
            "+inf",
            "c",
            0,
            "d"
        ),
        c!("HSET", p("hash:listpack"), "f1", "v1", "f2", 2, "f3", ""),
        c!("HSET", p("hash:bigvalue"), "f", "v".repeat(100)),
        c!("EXPIRE", p("hash:bigvalue"), 7200),
        c!("PEXPIREAT", p("str:small"), 4_102_444_800_000i64),
    ];
    if big >= 10_000 {
        v.push(c!("SET", p("str:big"), format!("big-{db}-").repeat(40_000)));
    }
    // Large encodings: quicklist of several (LZF-compressed) nodes, hash-table set and hash,
    // skiplist sorted set.
    let mut list = c!("RPUSH", p("list:big"));
    let mut set = c!("SADD", p("set:big"));
    let mut zset = c!("ZADD", p("zset:big"));
    let mut hash = c!("HSET", p("hash:big"));
    for i in 0..big {
        list.arg(format!("element-{i}"));
        set.arg(format!("member-{i}"));
        zset.arg(f64::from(i) / 7.0).arg(format!("member-{i}"));
        hash.arg(format!("field-{i}")).arg(i);
    }
    v.extend([list, set, zset, hash]);
    // A plain quicklist node: an element over the packed threshold.
    v.extend([
        c!("DEBUG", "QUICKLIST-PACKED-THRESHOLD", 1000),
        c!(
            "RPUSH",
            p("list:plain"),
            "small",
            "p".repeat(5000),
            noise(3, 2000)
        ),
        c!("DEBUG", "QUICKLIST-PACKED-THRESHOLD", "1G"),
    ]);
    // Streams: entries over several listpacks, deletions, groups with pending entries,
    // consumers (one idle, one with claimed entries), an empty stream with a group.
    let s = p("stream:groups");
    for i in 1..=u64::from(big / 20).max(250) {
        v.push(c!(
            "XADD",
            &s,
            format!("{i}-1"),
            "field",
            i,
            "other",
            "x".repeat((i % 5) as usize)
        ));
    }
    v.extend([
        c!("XDEL", &s, "10-1", "20-1"),
        c!("XGROUP", "CREATE", &s, "g1", "0"),
        c!("XGROUP", "CREATE", &s, "g2", "$"),
        c!(
            "XREADGROUP",
            "GROUP",
            "g1",
            "alice",
            "COUNT",
            20,
            "STREAMS",
            &s,
            ">"
        ),
        c!(
            "XREADGROUP",
            "GROUP",
            "g1",
            "bob",
            "COUNT",
            5,
            "STREAMS",
            &s,
            ">"
        ),
        c!("XACK", &s, "g1", "1-1", "2-1"),
        c!("XCLAIM", &s, "g1", "carol", 0, "3-1", "4-1", "21-1"),
        c!("XGROUP", "CREATECONSUMER", &s, "g2", "dave"),
        c!("XGROUP", "CREATE", p("stream:empty"), "g", "$", "MKSTREAM"),
        c!("XADD", p("stream:small"), "*", "a", 1),
        c!("PEXPIRE", p("stream:small"), TTL_MS),
    ]);
    if flavor == Flavor::V9 {
        // Hashes with field expirations: some fields, all fields, and one about to lose
        // its only volatile field's TTL.
        v.extend([
            c!("HSET", p("hash:ttl"), "plain", "v", "n", 1),
            c!(
                "HSETEX",
                p("hash:ttl"),
                "EX",
                3600,
                "FIELDS",
                2,
                "t1",
                "v1",
                "t2",
                2
            ),
            c!("HPEXPIRE", p("hash:ttl"), 7_200_000, "FIELDS", 1, "n"),
            c!(
                "HSETEX",
                p("hash:ttl-all"),
                "PX",
                5_000_000,
                "FIELDS",
                2,
                "a",
                "1",
                "b",
                "2"
            ),
            c!("PEXPIRE", p("hash:ttl-all"), TTL_MS),
            c!(
                "HSETEX",
                p("hash:ttl-persisted"),
                "EX",
                100,
                "FIELDS",
                1,
                "a",
                "1"
            ),
            c!("HPERSIST", p("hash:ttl-persisted"), "FIELDS", 1, "a"),
        ]);
        let mut big = c!("HSETEX", p("hash:ttl-big"), "EX", 9000, "FIELDS", 600);
        for i in 0..600 {
            big.arg(format!("f{i}")).arg(format!("v{i}"));
        }
        v.push(big);
    }
    v
}

fn bulk_key(i: u64) -> String {
    format!("bulk:{{{}}}:{i}", i % 1000)
}

/// Small keys of assorted types.
fn bulk_keys(n: u64) -> Vec<redis::Cmd> {
    let mut v = Vec::with_capacity(n as usize * 2);
    for i in 0..n {
        let k = bulk_key(i);
        v.push(match i % 6 {
            0 => c!("SET", &k, format!("value-{i}")),
            1 => c!("HSET", &k, "a", i, "b", "x"),
            2 => c!("RPUSH", &k, i, "y"),
            3 => c!("SADD", &k, i, i + 1),
            4 => c!("ZADD", &k, 1, "m", i, "n"),
            _ => c!("SET", &k, i),
        });
        if i.is_multiple_of(TTL_EVERY) {
            v.push(c!("PEXPIRE", &k, TTL_MS + i as i64));
        }
    }
    v
}

/// Fills `node`: special keys in databases 0 and (on 9.1) 2, bulk keys in database 0, the
/// library; returns the key count per database.
async fn fill(flavor: Flavor, node: &Node, bulk: u64) -> BTreeMap<u64, u64> {
    let dbs: &[u64] = if flavor == Flavor::V9 { &[0, 2] } else { &[0] };
    for &db in dbs {
        run(node, db, &special_keys(flavor, db, 10_000)).await;
    }
    run(node, 0, &bulk_keys(bulk)).await;
    let () = node
        .pool
        .query(
            &node.addr,
            redis::cmd("FUNCTION")
                .arg("LOAD")
                .arg("REPLACE")
                .arg(LIBRARY),
        )
        .await
        .map(|_: String| ())
        .unwrap();
    let mut sizes = BTreeMap::new();
    for &db in dbs {
        let mut p = redis::pipe();
        p.cmd("SELECT").arg(db).ignore().cmd("DBSIZE");
        let (n,): (u64,) = node.pool.pipeline(&node.addr, &p).await.unwrap();
        sizes.insert(db, n);
    }
    sizes
}

async fn save(node: &Node) -> Vec<u8> {
    let () = node
        .pool
        .query(&node.addr, &redis::cmd("SAVE"))
        .await
        .unwrap();
    std::fs::read(node.dir.path().join("dump.rdb")).unwrap()
}

/// Splits `rdb` fed in `chunk`-byte pieces.
fn split(rdb: &[u8], chunk: usize) -> (Vec<Record>, Vec<Vec<u8>>, Summary) {
    let mut reader = RecordReader::new();
    let (mut records, mut functions) = (Vec::new(), Vec::new());
    for piece in rdb.chunks(chunk) {
        reader.feed(piece).unwrap();
        while let Some(item) = reader.next_item() {
            match item {
                Item::Key(r) => records.push(r),
                Item::Function(f) => functions.push(f),
                Item::SlotImport(s) => panic!("unexpected slot import {s:?}"),
            }
        }
    }
    (records, functions, reader.finish().unwrap())
}

/// `DUMP` of each record's key in its database on `node`.
async fn dumps(node: &Node, records: &[Record]) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::with_capacity(records.len());
    for batch in records.chunk_by(|a, b| a.db == b.db) {
        for part in batch.chunks(1000) {
            let mut p = redis::pipe();
            p.cmd("SELECT").arg(part[0].db).ignore();
            for r in part {
                p.cmd("DUMP").arg(&r.key);
            }
            let v: Vec<Option<Vec<u8>>> = node.pool.pipeline(&node.addr, &p).await.unwrap();
            out.extend(v);
        }
    }
    out
}

/// `RESTORE key <abs ms> payload ABSTTL REPLACE` of every record into `node`: the error of
/// the first refused, if any.
async fn restore(node: &Node, records: &[Record]) -> Result<(), String> {
    for batch in records.chunk_by(|a, b| a.db == b.db) {
        for part in batch.chunks(1000) {
            let mut p = redis::pipe();
            p.cmd("SELECT").arg(part[0].db).ignore();
            for r in part {
                let c = p
                    .cmd("RESTORE")
                    .arg(&r.key)
                    .arg(r.expire_at_ms.unwrap_or(0))
                    .arg(&r.payload)
                    .arg("ABSTTL")
                    .arg("REPLACE");
                if let Some(f) = r.lfu_freq {
                    c.arg("FREQ").arg(f);
                }
                if let Some(s) = r.idle_secs {
                    c.arg("IDLETIME").arg(s);
                }
            }
            p.ignore_errors();
            let replies: Vec<Value> = node
                .pool
                .pipeline(&node.addr, &p)
                .await
                .map_err(|e| e.to_string())?;
            for (r, v) in part.iter().zip(replies) {
                if let Value::ServerError(e) = v {
                    return Err(format!(
                        "RESTORE {}: {} {}",
                        r.key.escape_ascii(),
                        e.code(),
                        e.details().unwrap_or_default()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// What a key holds, read with type-specific commands (hash-table orders normalised).
async fn contents(node: &Node, records: &[Record]) -> Vec<String> {
    let mut out = Vec::with_capacity(records.len());
    for batch in records.chunk_by(|a, b| a.db == b.db) {
        for part in batch.chunks(500) {
            let mut p = redis::pipe();
            p.cmd("SELECT").arg(part[0].db).ignore();
            for r in part {
                let k = &r.key;
                p.cmd("TYPE").arg(k).cmd("PEXPIRETIME").arg(k);
                match r.rdb_type {
                    types::STRING => p.cmd("GET").arg(k),
                    types::LIST_QUICKLIST_2 => p.cmd("LRANGE").arg(k).arg(0).arg(-1),
                    types::SET | types::SET_INTSET | types::SET_LISTPACK => {
                        p.cmd("SMEMBERS").arg(k)
                    }
                    types::ZSET_2 | types::ZSET_LISTPACK => {
                        p.cmd("ZRANGE").arg(k).arg(0).arg(-1).arg("WITHSCORES")
                    }
                    types::HASH | types::HASH_LISTPACK | types::HASH_2 => p.cmd("HGETALL").arg(k),
                    types::STREAM_LISTPACKS_3 => p.cmd("XINFO").arg("STREAM").arg(k).arg("FULL"),
                    t => panic!("type {t} not in the dataset"),
                };
                // Field TTLs (9.x).
                if r.rdb_type == types::HASH_2 {
                    p.cmd("HKEYS").arg(k);
                }
            }
            let replies: Vec<Value> = node.pool.pipeline(&node.addr, &p).await.unwrap();
            let mut it = replies.into_iter();
            for r in part {
                let (t, at, v) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
                let mut s = format!("{t:?} {at:?} {}", normalise(r.rdb_type, v));
                if r.rdb_type == types::HASH_2 {
                    let fields: Vec<Vec<u8>> =
                        FromRedisValue::from_redis_value(it.next().unwrap()).unwrap();
                    let mut c = redis::cmd("HPEXPIRETIME");
                    c.arg(&r.key).arg("FIELDS").arg(fields.len()).arg(&fields);
                    let mut p = redis::pipe();
                    p.cmd("SELECT").arg(r.db).ignore().add_command(c);
                    let (times,): (Vec<i64>,) = node.pool.pipeline(&node.addr, &p).await.unwrap();
                    let mut by_field: Vec<_> = fields.into_iter().zip(times).collect();
                    by_field.sort();
                    s += &format!(" field-expiries {by_field:?}");
                }
                out.push(s);
            }
        }
    }
    out
}

fn normalise(rdb_type: u8, v: Value) -> String {
    match rdb_type {
        types::SET | types::SET_INTSET | types::SET_LISTPACK => {
            let m: BTreeSet<Vec<u8>> = FromRedisValue::from_redis_value(v).unwrap();
            format!("{m:?}")
        }
        types::HASH | types::HASH_LISTPACK | types::HASH_2 => {
            let m: BTreeMap<Vec<u8>, Vec<u8>> = FromRedisValue::from_redis_value(v).unwrap();
            format!("{m:?}")
        }
        _ => format!("{v:?}"),
    }
}

fn is_hash_table(rdb_type: u8) -> bool {
    matches!(rdb_type, types::SET | types::HASH | types::HASH_2)
}

/// Byte-identical payloads: every record against `dumps`; the count of hash-table values that
/// differed (allowed: their iteration order follows the table's seed, and a server loading a
/// small hash table, e.g. one whose field expirations are gone, re-encodes it compactly).
fn compare_payloads(what: &str, records: &[Record], dumps: &[Option<Vec<u8>>]) -> usize {
    let mut differ = Vec::new();
    for (r, d) in records.iter().zip(dumps) {
        let d = d
            .as_deref()
            .unwrap_or_else(|| panic!("{what}: no key {}", r.key.escape_ascii()));
        if d != r.payload {
            assert!(
                is_hash_table(r.rdb_type),
                "{what}: payload of {} (type {}) differs from DUMP:\n ours {:?}\n dump {:?}",
                r.key.escape_ascii(),
                r.rdb_type,
                &r.payload[..r.payload.len().min(200)],
                &d[..d.len().min(200)]
            );
            let how = if d[0] != r.rdb_type {
                format!("re-encoded as type {}", d[0])
            } else if d.len() == r.payload.len() {
                "same length, other order".to_owned()
            } else {
                format!("{} bytes instead of {}", d.len(), r.payload.len())
            };
            differ.push(format!(
                "{} (type {}): {how}",
                r.key.escape_ascii(),
                r.rdb_type
            ));
        }
    }
    if !differ.is_empty() {
        println!("{what}: hash tables that differ from DUMP: {differ:#?}");
    }
    differ.len()
}

async fn functions_of(node: &Node) -> Value {
    node.pool
        .query(
            &node.addr,
            redis::cmd("FUNCTION").arg("LIST").arg("WITHCODE"),
        )
        .await
        .unwrap()
}

async fn load_functions(node: &Node, functions: &[Vec<u8>]) {
    for f in functions {
        let _: String = node
            .pool
            .query(
                &node.addr,
                redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(f),
            )
            .await
            .unwrap();
    }
}

/// Restores `records` and `functions` into a fresh standalone `flavor` server and checks
/// every key (and the payloads byte for byte, when the versions match).
async fn restore_and_compare(
    what: &str,
    flavor: Flavor,
    source: &Node,
    records: &[Record],
    functions: &[Vec<u8>],
    same_version: bool,
    policy: &str,
) {
    let target = start(flavor, false, &[policy]).await;
    let t = Instant::now();
    restore(&target, records).await.unwrap();
    load_functions(&target, functions).await;
    println!(
        "{what}: restored {} keys in {:.2} s",
        records.len(),
        t.elapsed().as_secs_f64()
    );
    let want = contents(source, records).await;
    let got = contents(&target, records).await;
    for ((r, w), g) in records.iter().zip(&want).zip(&got) {
        assert_eq!(
            w,
            g,
            "{what}: key {} (type {})",
            r.key.escape_ascii(),
            r.rdb_type
        );
    }
    assert_eq!(
        functions_of(source).await,
        functions_of(&target).await,
        "{what}"
    );
    let target_dumps = dumps(&target, records).await;
    if same_version {
        let reordered = compare_payloads(what, records, &target_dumps);
        println!("{what}: target DUMP identical for all but {reordered} hash tables");
    } else {
        // A newer server writes its own version; the values are the same bytes unless a
        // hash table's order differs.
        let mut differ = 0;
        for (r, d) in records.iter().zip(&target_dumps) {
            let (t, v, version) = split_dump_payload(d.as_deref().unwrap()).unwrap();
            let (ours_t, ours_v, _) = split_dump_payload(&r.payload).unwrap();
            assert_eq!(version, 80, "{what}");
            assert_eq!(t, ours_t, "{what}: {}", r.key.escape_ascii());
            if v != ours_v {
                assert!(
                    is_hash_table(r.rdb_type),
                    "{what}: {}",
                    r.key.escape_ascii()
                );
                differ += 1;
            }
        }
        println!("{what}: values identical (under version 80) for all but {differ} hash tables");
    }
}

fn print_types(what: &str, records: &[Record]) {
    let mut by_type: BTreeMap<u8, u64> = BTreeMap::new();
    for r in records {
        *by_type.entry(r.rdb_type).or_default() += 1;
    }
    println!("{what}: records by RDB type {by_type:?}");
}

/// Splits a saved RDB, checks it against the source, prints throughput.
async fn split_and_check(
    flavor: Flavor,
    source: &Node,
    sizes: &BTreeMap<u64, u64>,
) -> (Vec<u8>, Vec<Record>, Vec<Vec<u8>>) {
    let rdb = save(source).await;
    let t = Instant::now();
    let (records, functions, summary) = split(&rdb, 64 * 1024);
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{flavor:?}: split {} bytes into {} keys in {:.3} s: {:.0} keys/s, {:.1} MB/s",
        rdb.len(),
        records.len(),
        secs,
        records.len() as f64 / secs,
        rdb.len() as f64 / secs / 1e6
    );
    let mut s = summary.clone();
    s.aux.remove("ctime");
    s.aux.remove("used-mem");
    println!("{flavor:?}: {s:?}");
    print_types(&format!("{flavor:?}"), &records);
    let (magic, version, ver) = match flavor {
        Flavor::V9 => (RdbMagic::Valkey, 80, "9."),
        Flavor::V8 => (RdbMagic::Redis, 11, "8."),
    };
    assert_eq!((summary.magic, summary.version), (magic, version));
    assert!(
        summary.server_version().unwrap().starts_with(ver),
        "{summary:?}"
    );
    assert_eq!(&summary.keys_per_db, sizes);
    assert_eq!(summary.keys, records.len() as u64);
    assert_eq!(summary.functions, 1);
    assert_eq!(summary.bytes, rdb.len() as u64);
    // Cluster mode: one slot-info aux field per non-empty slot of each database.
    assert!(summary.slot_info_fields >= 1000, "{summary:?}");
    let with_ttl = records.iter().filter(|r| r.expire_at_ms.is_some()).count() as u64;
    assert_eq!(summary.keys_with_ttl, with_ttl);
    assert!(with_ttl > BULK_KEYS / TTL_EVERY, "{with_ttl}");
    for (db, (keys, _)) in &summary.db_size_hints {
        assert_eq!(sizes.get(db), Some(keys), "RESIZEDB of db {db}");
    }
    // The source's own DUMP of every key is the same payload.
    let source_dumps = dumps(source, &records).await;
    let reordered = compare_payloads(&format!("{flavor:?} source"), &records, &source_dumps);
    println!("{flavor:?}: source DUMP identical for all but {reordered} hash-table values");
    // Other chunk sizes, same records.
    for chunk in [1, 7, 4096, rdb.len()] {
        let (r, f, _) = split(&rdb, chunk);
        assert!(r == records && f == functions, "chunks of {chunk}");
    }
    (rdb, records, functions)
}

/// `key_slot` against `CLUSTER KEYSLOT` for keys of assorted shapes.
async fn check_key_slots(node: &Node) {
    let mut keys: Vec<Vec<u8>> = (0..300u64).map(|i| noise(i, (i % 40) as usize)).collect();
    keys.extend(
        [
            "foo",
            "{user1000}.following",
            "{}x",
            "x{}{y}",
            "{{a}}",
            "a{b",
            "}{a}",
            "",
        ]
        .map(|k| k.as_bytes().to_vec()),
    );
    for (i, k) in noise(99, 200).chunks(5).enumerate() {
        let mut k = k.to_vec();
        k.insert(i % 5, b'{');
        k.insert((i * 3) % k.len(), b'}');
        keys.push(k);
    }
    let mut p = redis::pipe();
    for k in &keys {
        p.cmd("CLUSTER").arg("KEYSLOT").arg(k);
    }
    let slots: Vec<u16> = node.pool.pipeline(&node.addr, &p).await.unwrap();
    for (k, s) in keys.iter().zip(slots) {
        assert_eq!(valkey_ops::key_slot(k), s, "key {}", k.escape_ascii());
    }
    println!(
        "key_slot agrees with CLUSTER KEYSLOT on {} keys",
        keys.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_rdb_split_and_restored() {
    init_tracing();
    let source = start_owning_all(Flavor::V9, &["maxmemory-policy allkeys-lfu"]).await;
    let sizes = fill(Flavor::V9, &source, BULK_KEYS).await;
    check_key_slots(&source).await;
    let (_, records, functions) = split_and_check(Flavor::V9, &source, &sizes).await;
    assert!(records.iter().any(|r| r.lfu_freq.is_some()));
    assert!(records.iter().any(|r| r.rdb_type == types::HASH_2));
    restore_and_compare(
        "9.1 -> 9.1",
        Flavor::V9,
        &source,
        &records,
        &functions,
        true,
        "maxmemory-policy allkeys-lfu",
    )
    .await;

    // Valkey 8 refuses a payload of RDB version 80.
    if Flavor::V8.installed().is_some() {
        let old = start(Flavor::V8, false, &[]).await;
        let small = records
            .iter()
            .find(|r| r.key == b"0:str:small")
            .unwrap()
            .clone();
        let e = restore(
            &old,
            &[Record {
                lfu_freq: None,
                ..small
            }],
        )
        .await
        .unwrap_err();
        println!("9.1 payload into 8.0: {e}");
        assert!(
            e.contains("DUMP payload version or checksum are wrong"),
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_rdb_split_and_restored() {
    if Flavor::V8.installed().is_none() {
        println!(
            "skipped: no Valkey 8 binary at {}",
            Flavor::V8.binary().display()
        );
        return;
    }
    init_tracing();
    let source = start_owning_all(Flavor::V8, &["maxmemory-policy allkeys-lru"]).await;
    let sizes = fill(Flavor::V8, &source, BULK_KEYS).await;
    let (_, records, functions) = split_and_check(Flavor::V8, &source, &sizes).await;
    assert!(records.iter().any(|r| r.idle_secs.is_some()));
    restore_and_compare(
        "8.0 -> 8.0",
        Flavor::V8,
        &source,
        &records,
        &functions,
        true,
        "maxmemory-policy allkeys-lru",
    )
    .await;
    restore_and_compare(
        "8.0 -> 9.1",
        Flavor::V9,
        &source,
        &records,
        &functions,
        false,
        "maxmemory-policy allkeys-lru",
    )
    .await;
}

/// Whether `v` holds the bulk string `s` anywhere.
fn holds(v: &Value, s: &str) -> bool {
    match v {
        Value::BulkString(b) => b == s.as_bytes(),
        Value::SimpleString(b) => b == s,
        Value::Array(a) | Value::Set(a) => a.iter().any(|v| holds(v, s)),
        Value::Map(m) => m.iter().any(|(k, v)| holds(k, s) || holds(v, s)),
        _ => false,
    }
}

/// An RDB saved by a 9.1 primary while it imports a slot (atomic slot migration) starts
/// with a `SLOT_IMPORT` record, and holds part of the slot's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_rdb_saved_mid_slot_import() {
    init_tracing();
    let (a, b) = tokio::join!(start(Flavor::V9, true, &[]), start(Flavor::V9, true, &[]));
    own_slots(&a, 0, 8191).await;
    own_slots(&b, 8192, 16383).await;
    let (host, port) = b.addr.split_once(':').unwrap();
    let () = a
        .pool
        .query(
            &a.addr,
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg(host)
                .arg(port)
                .arg(b.bus_port),
        )
        .await
        .unwrap();
    wait_ok(&[&a, &b]).await;
    let keys: Vec<redis::Cmd> = (0..2000)
        .map(|i| c!("SET", format!("{{a}}{i}"), i))
        .collect();
    run(&b, 0, &keys).await;
    let slot = valkey_ops::key_slot(b"{a}");
    assert!(slot >= 8192);
    // The source's snapshot takes 3 ms a key (6 s in all).
    let () = b
        .pool
        .query(
            &b.addr,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("rdb-key-save-delay")
                .arg(3000),
        )
        .await
        .unwrap();
    let a_id: String = a
        .pool
        .query(&a.addr, redis::cmd("CLUSTER").arg("MYID"))
        .await
        .unwrap();
    let () = b
        .pool
        .query(
            &b.addr,
            redis::cmd("CLUSTER")
                .arg("MIGRATESLOTS")
                .arg("SLOTSRANGE")
                .arg(slot)
                .arg(slot)
                .arg("NODE")
                .arg(&a_id),
        )
        .await
        .unwrap();
    eventually(
        "import receiving the snapshot",
        Duration::from_secs(10),
        || async {
            let v: Value = a
                .pool
                .query(&a.addr, redis::cmd("CLUSTER").arg("GETSLOTMIGRATIONS"))
                .await
                .ok()?;
            holds(&v, "receiving-snapshot").then_some(())
        },
    )
    .await;
    // Saved until some of the slot's keys have arrived.
    let (items, summary) = eventually(
        "keys of the slot imported",
        Duration::from_secs(5),
        || async {
            let rdb = save(&a).await;
            let mut reader = RecordReader::new();
            reader.feed(&rdb).unwrap();
            let items: Vec<Item> = std::iter::from_fn(|| reader.next_item()).collect();
            let summary = reader.finish().unwrap();
            (summary.keys > 0).then_some((items, summary))
        },
    )
    .await;
    let Some(Item::SlotImport(import)) = items.first() else {
        panic!("no slot import first: {:?}", items.first())
    };
    println!(
        "slot import {} of {:?}; {} keys of the slot saved",
        import.job.escape_ascii(),
        import.ranges,
        summary.keys
    );
    assert_eq!(
        import.ranges,
        [valkey_ops::SlotRange::single(slot).unwrap()]
    );
    assert_eq!(import.job.len(), 40);
    assert_eq!(summary.slot_imports, 1);
    assert!(summary.keys > 0 && summary.keys < 2000, "{summary:?}");
    for i in &items[1..] {
        let Item::Key(r) = i else { panic!("{i:?}") };
        assert_eq!(r.slot(), slot);
    }
}

/// Writes the unit tests' fixtures (`src/rdb/testdata`): small RDBs of each version from
/// standalone servers (several databases; LFU counters on 9.1, LRU idle times on 8.0) and
/// the servers' `DUMP` of every key (`.dumps`). `cargo test --test real_valkey_rdb_records -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the unit tests' fixtures"]
async fn write_rdb_fixtures() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/rdb/testdata");
    for (flavor, name, policy) in [
        (Flavor::V9, "valkey-9.1", "maxmemory-policy allkeys-lfu"),
        (Flavor::V8, "valkey-8.0", "maxmemory-policy allkeys-lru"),
    ] {
        let node = start(flavor, false, &[policy, "list-max-listpack-size 16"]).await;
        for db in [0, 5] {
            run(&node, db, &special_keys(flavor, db, 600)).await;
        }
        run(&node, 3, &bulk_keys(60)).await;
        let _: String = node
            .pool
            .query(&node.addr, redis::cmd("FUNCTION").arg("LOAD").arg(LIBRARY))
            .await
            .unwrap();
        let rdb = save(&node).await;
        let (records, _, _) = split(&rdb, rdb.len());
        let dumps = dumps(&node, &records).await;
        // Per key: database (u64), key and payload (each u32 length + bytes), little endian.
        let mut out = Vec::new();
        for (r, d) in records.iter().zip(dumps) {
            let d = d.unwrap();
            out.extend_from_slice(&r.db.to_le_bytes());
            for b in [&r.key, &d] {
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
        std::fs::write(dir.join(format!("{name}.rdb")), &rdb).unwrap();
        std::fs::write(dir.join(format!("{name}.dumps")), out).unwrap();
        println!("{name}: {} bytes, {} keys", rdb.len(), records.len());
    }
}
