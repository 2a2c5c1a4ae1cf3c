//! End-to-end primary failback (needs root: localkube runs pods as processes in network
//! namespaces). Three clusters with `failback: {mode: Automatic, quietPeriodSeconds: 10}` run
//! at once in one environment, each under a continuous writer (`SET` + `WAIT 1`, every
//! acknowledged write read back at the end), each ending with the exact topology, a clean
//! `valkey-cli --cluster check`, every primary at node-index 0 and one `FailbackCompleted`
//! event per failback (no `FailbackFailed`):
//!
//! 1. `fb-main` (2×1, RDB): a hand-made `CLUSTER FAILOVER` on shard 0's replica (its write
//!    gap is the reference), then three disruptions that put every primary at node-index 1: a
//!    roll (a pod-template change), both primary pods deleted, both primaries' servers killed.
//!    After each, every primary is back at node-index 0 within the quiet period + 30 s of the
//!    cluster's recovery, and the write gap of each failback is at most 1.25× the reference.
//! 2. `fb-waits` (1×2, no persistence, no snapshots): (a) a second failover of the off-home
//!    shard (node-index 1 → 2) 3 s before its failback was due moves `failbackAt` later, and the
//!    failback comes a full quiet period after the second failover; (c) node-index 0's server
//!    restarted into a full sync held by its primary (`repl-diskless-sync-delay`) for longer
//!    than the quiet period: no failback and no `failbackAt` while it syncs, the failback a
//!    quiet period after.
//! 3. `fb-scale` (2×1 → 3×1, AOF): (b) a scale-out started 1.5 s before a failback was due: no
//!    failback while it runs (and no `failbackAt` while `status.operation` shows the slot
//!    moves), the failback a quiet period after it.
//!
//! For every failback: `status.shardStatuses[i].failbackAt` announced it, it came no earlier
//! than that time, and that time was at least a quiet period after the last status that showed
//! no (or another) due time for the shard, and after the disruption itself (so a reset wait is
//! seen as a reset); `status.operation.kind` showed `Failback` for that shard (a watch sees every
//! status write). Write gaps are the longest plain-`SET` stall of a hash-tag writer
//! (`support/tagwriter.rs`) over a window that holds only that failover or failback; gaps under
//! 0.3 s count as fine whatever the reference (both are tens of milliseconds here, where noise
//! dominates).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use support::tagwriter::{TagSummary, TagWriter};
use support::*;
use valkey_api::ValkeyCluster;
use valkey_api::failback::FailbackMode;

const PW: &str = "failback-app-pw";

/// `spec.failback.quietPeriodSeconds` of every cluster here.
const QUIET: f64 = 10.0;

/// A failback is due within the quiet period plus this after the cluster recovered.
const DUE_WITHIN: f64 = 30.0;

/// Tolerance of "at least a quiet period after": `failbackAt` has whole seconds (the operator
/// truncates), and a status is seen here a few milliseconds after it was written.
const SLACK: f64 = 1.5;

/// A failback's write gap may be this many times the hand-made failover's...
const GAP_FACTOR: f64 = 1.25;

/// ...or, whatever the reference, up to this (both are tens of milliseconds on localkube, where
/// scheduling noise of this size dominates the comparison).
const GAP_FLOOR: Duration = Duration::from_millis(300);

const MAIN: &str = "fb-main";
const WAITS: &str = "fb-waits";
const SCALE: &str = "fb-scale";

/// Seconds since the Unix epoch (comparable with `failbackAt`).
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `at` relative to the test's start, for log lines.
fn rel(at: f64) -> String {
    static START: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    format!("{:+.2}s", at - *START.get_or_init(now))
}

async fn sleep_until(at: f64) {
    let left = at - now();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

/// An RFC 3339 time as seconds since the epoch.
fn parse_time(s: &str) -> Option<f64> {
    let t: jiff::Timestamp = s.parse().ok()?;
    Some(t.as_millisecond() as f64 / 1000.0)
}

// --- the status, as every write of it was seen ---

/// One version of a ValkeyCluster's status, read as JSON (the fields of the failback feature
/// are read by name, not through the API crate's types).
#[derive(Clone, Debug)]
struct Snap {
    /// When it was seen (seconds since the epoch).
    at: f64,
    generation: i64,
    observed: i64,
    state: String,
    reason: String,
    shards: i64,
    ready_shards: i64,
    /// `status.operation`: kind and shard.
    operation: Option<(String, Option<i64>)>,
    /// Shard → `failbackAt` as written.
    failback_at: BTreeMap<i64, String>,
    /// Shard → `primaryPod`.
    primaries: BTreeMap<i64, String>,
    /// Shard → its slot ranges (inclusive).
    slots: BTreeMap<i64, Vec<(u16, u16)>>,
}

impl Snap {
    fn of(o: &DynamicObject, at: f64) -> Self {
        let s = &o.data["status"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        let mut snap = Self {
            at,
            generation: o.metadata.generation.unwrap_or(0),
            observed: s["observedGeneration"].as_i64().unwrap_or(-1),
            state: text(&s["state"]),
            reason: text(&s["reason"]),
            shards: s["shards"].as_i64().unwrap_or(0),
            ready_shards: s["readyShards"].as_i64().unwrap_or(0),
            operation: s
                .get("operation")
                .filter(|v| v.is_object())
                .map(|op| (text(&op["kind"]), op["shardIndex"].as_i64())),
            failback_at: BTreeMap::new(),
            primaries: BTreeMap::new(),
            slots: BTreeMap::new(),
        };
        for sh in s["shardStatuses"].as_array().into_iter().flatten() {
            let i = sh["index"].as_i64().unwrap_or(-1);
            if let Some(f) = sh["failbackAt"].as_str() {
                snap.failback_at.insert(i, f.to_owned());
            }
            if let Some(p) = sh["primaryPod"].as_str() {
                snap.primaries.insert(i, p.to_owned());
            }
            let ranges = sh["slots"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| {
                    let r = r.as_str()?;
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            snap.slots.insert(i, ranges);
        }
        snap
    }

    /// Shard `shard`'s `failbackAt` in seconds since the epoch.
    fn due(&self, shard: i64) -> Option<f64> {
        self.failback_at.get(&shard).and_then(|t| parse_time(t))
    }

    /// Ready, for the current generation, with no operation under way.
    fn calm(&self) -> bool {
        self.state == "Ready" && self.operation.is_none() && self.observed == self.generation
    }

    fn summary(&self) -> String {
        let op = self.operation.as_ref().map_or("-".to_owned(), |(k, s)| {
            format!("{k}{}", s.map(|s| format!("[{s}]")).unwrap_or_default())
        });
        let due: Vec<String> = self
            .failback_at
            .iter()
            .map(|(s, t)| match parse_time(t) {
                Some(at) => format!("{s}@{}", rel(at)),
                None => format!("{s}@{t:?}"),
            })
            .collect();
        format!(
            "{}/{} gen {}/{} shards {}/{} op {op} primaries {:?} failbackAt [{}]",
            self.state,
            self.reason,
            self.observed,
            self.generation,
            self.ready_shards,
            self.shards,
            self.primaries.values().collect::<Vec<_>>(),
            due.join(" ")
        )
    }
}

/// Every version of a cluster's status a watch delivers, with the time it was seen.
struct StatusLog {
    snaps: Arc<Mutex<Vec<Snap>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StatusLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusLog {
    fn start(client: &Client, name: &str) -> Self {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            NS,
            &ApiResource::erase::<ValkeyCluster>(&()),
        );
        let snaps = Arc::new(Mutex::new(Vec::new()));
        let (log, name) = (snaps.clone(), name.to_owned());
        let task = tokio::spawn(async move {
            let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut stream = watcher(api, cfg)
                .default_backoff()
                .applied_objects()
                .boxed();
            let mut last = String::new();
            while let Some(item) = stream.next().await {
                let Ok(o) = item else { continue };
                let s = Snap::of(&o, now());
                let line = s.summary();
                if line != last {
                    eprintln!("[{name} {}] status {line}", rel(s.at));
                    last = line;
                }
                log.lock().expect("status log").push(s);
            }
        });
        Self { snaps, task }
    }

    fn snaps(&self) -> Vec<Snap> {
        self.snaps.lock().expect("status log").clone()
    }

    fn latest(&self) -> Option<Snap> {
        self.snaps.lock().expect("status log").last().cloned()
    }

    /// Waits (up to `timeout`) until a version seen at or after `since` satisfies `pred`.
    async fn wait_seen(
        &self,
        what: &str,
        since: f64,
        timeout: Duration,
        pred: impl Fn(&Snap) -> bool,
    ) -> anyhow::Result<Snap> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.snaps().into_iter().find(|s| s.at >= since && pred(s)) {
                return Ok(s);
            }
            ensure!(
                Instant::now() < deadline,
                "{what} not seen in the status within {timeout:?} (since {}): last {}",
                rel(since),
                self.latest().map(|s| s.summary()).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

// --- live roles ---

/// One pod of a shard as its server reports itself.
#[derive(Clone, Debug)]
struct Member {
    pod: String,
    ip: Option<String>,
    /// `master` / `slave` from `INFO replication`; `None` when it did not answer in 500 ms.
    role: Option<String>,
}

/// Where a shard's primary is, from its members' own roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Node-index 0 is the only primary and every other member answers as a replica.
    Home,
    /// Node-index `n` ≠ 0 is the only primary among the members that answer.
    Away(i32),
    /// Anything else (no primary, two, node-index 0 primary with a member silent).
    Unclear,
}

fn place(members: &BTreeMap<i32, Member>) -> Place {
    let masters: Vec<i32> = members
        .iter()
        .filter(|(_, m)| m.role.as_deref() == Some("master"))
        .map(|(i, _)| *i)
        .collect();
    match masters.as_slice() {
        [0] if members
            .iter()
            .all(|(i, m)| *i == 0 || m.role.as_deref() == Some("slave")) =>
        {
            Place::Home
        }
        [n] if *n != 0 => Place::Away(*n),
        _ => Place::Unclear,
    }
}

/// The shard and node index of pod `valkey-<cluster>-<shard>-<node index>-0`.
fn shard_and_index(cluster: &str, pod: &str) -> Option<(i32, i32)> {
    let rest = pod.strip_prefix(&format!("valkey-{cluster}-"))?;
    let mut it = rest.split('-');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Reads every pod's role, keeping one connection per pod IP.
struct Roles {
    client: Client,
    name: String,
    conns: HashMap<String, redis::aio::MultiplexedConnection>,
}

impl Roles {
    fn new(client: &Client, name: &str) -> Self {
        Self {
            client: client.clone(),
            name: name.to_owned(),
            conns: HashMap::new(),
        }
    }

    /// `INFO replication` of the pod at `ip` (as `app`), or `None` within 500 ms.
    async fn info(&mut self, ip: &str) -> Option<String> {
        let conn = match self.conns.get(ip) {
            Some(c) => c.clone(),
            None => {
                let c = tokio::time::timeout(Duration::from_millis(500), node_conn(ip, "app", PW))
                    .await
                    .ok()?
                    .ok()?;
                self.conns.insert(ip.to_owned(), c.clone());
                c
            }
        };
        let mut conn = conn;
        let info = tokio::time::timeout(
            Duration::from_millis(500),
            query_cmd::<String>(&mut conn, &["INFO", "replication"]),
        )
        .await;
        match info {
            Ok(Ok(info)) => Some(info),
            _ => {
                self.conns.remove(ip);
                None
            }
        }
    }

    async fn role(&mut self, ip: &str) -> Option<String> {
        let info = self.info(ip).await?;
        info.lines()
            .find_map(|l| l.strip_prefix("role:"))
            .map(|r| r.trim().to_owned())
    }

    /// Shard → node index → member.
    async fn get(&mut self) -> anyhow::Result<BTreeMap<i32, BTreeMap<i32, Member>>> {
        let mut out: BTreeMap<i32, BTreeMap<i32, Member>> = BTreeMap::new();
        for p in pods_of(&self.client, &self.name).await? {
            let pod = p.metadata.name.clone().unwrap_or_default();
            let Some((shard, index)) = shard_and_index(&self.name, &pod) else {
                continue;
            };
            let ip = pod_ip(&p);
            let role = match &ip {
                Some(ip) => self.role(ip).await,
                None => None,
            };
            out.entry(shard)
                .or_default()
                .insert(index, Member { pod, ip, role });
        }
        Ok(out)
    }

    async fn places(&mut self) -> anyhow::Result<BTreeMap<i32, Place>> {
        Ok(self
            .get()
            .await?
            .iter()
            .map(|(s, m)| (*s, place(m)))
            .collect())
    }
}

/// When each tracked shard was seen off home at the expected node index, and then home.
#[derive(Debug, Default)]
struct Track {
    /// When every tracked shard was first seen away at its expected node index at once.
    all_away: Option<f64>,
    /// Shard → when first seen home after that.
    home: BTreeMap<i32, f64>,
}

/// Polls every 100 ms until every shard of `away` (shard → the node index its primary must
/// be seen at first) has been seen there (all at once), and then back home; the other shards
/// must never be seen away. Fails after `timeout`.
async fn track(
    client: &Client,
    name: &str,
    away: &BTreeMap<i32, i32>,
    timeout: Duration,
) -> anyhow::Result<Track> {
    let mut roles = Roles::new(client, name);
    let started = Instant::now();
    let mut out = Track::default();
    let mut seen_away = std::collections::BTreeSet::new();
    let mut last = String::new();
    loop {
        let places = roles.places().await?;
        let t = now();
        let line = format!("{places:?}");
        if line != last {
            eprintln!("[{name} {}] live primaries {line}", rel(t));
            last = line;
        }
        for (shard, p) in &places {
            if !away.contains_key(shard) {
                ensure!(
                    !matches!(p, Place::Away(_)),
                    "shard {shard} left node-index 0 ({p:?}) though nothing moved it"
                );
            }
        }
        if out.all_away.is_none() {
            for (s, idx) in away {
                if places.get(s) == Some(&Place::Away(*idx)) {
                    seen_away.insert(*s);
                } else if seen_away.contains(s) && places.get(s) == Some(&Place::Home) {
                    bail!(
                        "shard {s} is at node-index 0 again before every shard was seen away at {away:?}: {places:?}"
                    );
                }
            }
            if seen_away.len() == away.len()
                && away
                    .iter()
                    .all(|(s, idx)| places.get(s) == Some(&Place::Away(*idx)))
            {
                out.all_away = Some(t);
            }
        } else {
            for s in away.keys() {
                if places.get(s) == Some(&Place::Home) {
                    out.home.entry(*s).or_insert(t);
                }
            }
            if out.home.len() == away.len() {
                return Ok(out);
            }
        }
        ensure!(
            started.elapsed() < timeout,
            "{name}: primaries not back at node-index 0 within {timeout:?} (away {:?}, home {:?}): {places:?}",
            out.all_away.map(rel),
            out.home
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// --- one cluster under test ---

struct Ctx<'a> {
    fx: &'a Fixture,
    name: &'static str,
    shards: i32,
    replicas: i32,
    op_pw: String,
    log: StatusLog,
    /// The write gap of the hand-made failover.
    reference: Option<Duration>,
    /// Failbacks seen so far.
    failbacks: usize,
    /// Every figure, printed again at the end.
    measures: Vec<String>,
}

impl<'a> Ctx<'a> {
    /// Creates the cluster with failback Automatic (quiet period [`QUIET`]) and the extra
    /// `spec` fields of `extra`, waits until it is Ready with every primary at node-index 0.
    async fn create(
        fx: &'a Fixture,
        name: &'static str,
        shards: i32,
        replicas: i32,
        extra: serde_json::Value,
    ) -> anyhow::Result<Self> {
        let client = &fx.client;
        create_user_secret(client, &format!("{name}-app"), PW).await?;
        let mut spec = serde_json::json!({
            "failback": {"mode": "Automatic", "quietPeriodSeconds": QUIET as i64},
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        create_cluster_with(client, name, shards, replicas, spec).await?;
        let created = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
            .get(name)
            .await?;
        let failback = &created.spec.failback;
        ensure!(
            failback.mode == FailbackMode::Automatic
                && failback.quiet_period_seconds == QUIET as i64,
            "{name}: spec.failback not kept by the API server: {failback:?}"
        );
        let log = StatusLog::start(client, name);
        let t0 = Instant::now();
        wait_ready(client, name, shards, Duration::from_secs(300)).await?;
        let op_pw = system_operator_password(client, name).await?;
        let mut c = Self {
            fx,
            name,
            shards,
            replicas,
            op_pw,
            log,
            reference: None,
            failbacks: 0,
            measures: Vec::new(),
        };
        c.wait_all_home(Duration::from_secs(60)).await?;
        c.measure(format!(
            "{shards}x{replicas} Ready with every primary at node-index 0 {:.1}s after apply",
            t0.elapsed().as_secs_f64()
        ));
        Ok(c)
    }

    /// [`Self::failback`] of both shards of a 2-shard cluster whose primaries the disruption
    /// `what` (at `t`, after `after`) put at node-index 1, and the time to Ready again.
    async fn failback_of_both(
        &mut self,
        what: &str,
        tag: &str,
        t: f64,
        replaced: Option<Vec<String>>,
        after: &str,
    ) -> anyhow::Result<()> {
        let recovered = self.failback(what, tag, t, away_at(2, 1), replaced).await?;
        self.measure(format!(
            "{what}: Ready again {:.1}s after the {after}",
            recovered - t
        ));
        Ok(())
    }

    /// [`Self::create`], then the continuous writer started (and given 2 s to write).
    async fn create_under_writer(
        fx: &'a Fixture,
        name: &'static str,
        shards: i32,
        replicas: i32,
        extra: serde_json::Value,
    ) -> anyhow::Result<(Self, Writer)> {
        let c = Self::create(fx, name, shards, replicas, extra).await?;
        let writer = Writer::start(&fx.client, name, PW, 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok((c, writer))
    }

    fn client(&self) -> &Client {
        &self.fx.client
    }

    fn measure(&mut self, line: String) {
        eprintln!("MEASURE failback {}: {line}", self.name);
        self.measures.push(line);
    }

    async fn wait_all_home(&self, timeout: Duration) -> anyhow::Result<()> {
        let mut roles = Roles::new(self.client(), self.name);
        let deadline = Instant::now() + timeout;
        loop {
            let places = roles.places().await?;
            if places.len() == self.shards as usize && places.values().all(|p| *p == Place::Home) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{}: not every primary at node-index 0: {places:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A hand-made `CLUSTER FAILOVER` (as `_operator`) on shard `shard`'s node-index `to`, a
    /// synced replica; waits until it is the shard's only primary. Returns when it was issued
    /// and when the change was seen.
    async fn hand_failover(&self, shard: i32, to: i32) -> anyhow::Result<(f64, f64)> {
        let mut roles = Roles::new(self.client(), self.name);
        let members = roles.get().await?.remove(&shard).context("no such shard")?;
        let target = members.get(&to).context("no such node index")?;
        let ip = target.ip.clone().context("target has no IP")?;
        let info = roles.info(&ip).await.context("target does not answer")?;
        ensure!(
            info.contains("role:slave") && info.contains("master_link_status:up"),
            "{}: {} is not a synced replica:\n{info}",
            self.name,
            target.pod
        );
        let mut conn = node_conn(&ip, "_operator", &self.op_pw).await?;
        let issued = now();
        let () = query_cmd(&mut conn, &["CLUSTER", "FAILOVER"]).await?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let places = roles.places().await?;
            let want = if to == 0 {
                Place::Home
            } else {
                Place::Away(to)
            };
            if places.get(&shard) == Some(&want) {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "{}: hand-made failover to {} not done: {places:?}",
                self.name,
                target.pod
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let done = now();
        eprintln!(
            "[{} {}] hand-made CLUSTER FAILOVER on {}: primary of shard {shard} after {:.3}s",
            self.name,
            rel(done),
            target.pod,
            done - issued
        );
        Ok((issued, done))
    }

    /// Starts a hash-tag writer whose tags cover every shard; returns it 1 s later.
    async fn gaps_start(&self, prefix: &str) -> anyhow::Result<TagWriter> {
        let snap = self.log.latest().context("no status yet")?;
        let covered = |n: usize| {
            snap.slots.values().all(|ranges| {
                (0..n).any(|t| {
                    let slot = valkey_testkit::keys::key_slot(format!("{prefix}{t}").as_bytes());
                    ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot))
                })
            })
        };
        let tags = (4..=32)
            .find(|n| covered(*n))
            .with_context(|| format!("no tag count covers every shard: {:?}", snap.slots))?;
        let w = TagWriter::start(self.client(), self.name, PW, prefix, tags, 1).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(w)
    }

    /// Stops the writer 1 s from now; every acknowledged write reads back.
    async fn gaps_stop(&mut self, w: TagWriter, what: &str) -> anyhow::Result<TagSummary> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = w.stop_and_check().await?;
        let events: Vec<String> = s
            .events
            .iter()
            .filter(|(_, len)| *len >= Duration::from_millis(10))
            .map(|(_, len)| format!("{}ms", len.as_millis()))
            .collect();
        self.measure(format!(
            "{what}: write gap {:.3}s, durable gap {:.2}s, {} acknowledged, {} lost; stall events ≥10ms [{}]; {} of {} stalls on a machine stall",
            s.write_gap.as_secs_f64(),
            s.durable_gap.as_secs_f64(),
            s.acked,
            s.lost,
            events.join(" "),
            s.stalls_on_hiccups.1,
            s.stalls_on_hiccups.0
        ));
        ensure!(
            s.lost == 0,
            "{}: {what}: {} of {} acknowledged writes lost",
            self.name,
            s.lost,
            s.acked
        );
        Ok(s)
    }

    /// The hand-made failover of shard 0 to node-index `to`, its write gap kept as the
    /// reference. Returns when it was issued and done.
    async fn reference_failover(&mut self, to: i32) -> anyhow::Result<(f64, f64)> {
        let w = self.gaps_start("ref").await?;
        let r = self.hand_failover(0, to).await;
        let s = self.gaps_stop(w, "hand-made failover (reference)").await?;
        self.reference = Some(s.write_gap);
        r
    }

    /// Waits until the status says when shard `shard`'s failback is due (a status seen at or
    /// after `since`); that time.
    async fn announced(&self, shard: i64, since: f64) -> anyhow::Result<f64> {
        let s = self
            .log
            .wait_seen(
                &format!("failbackAt of shard {shard}"),
                since,
                // A Ready cluster is observed every 10 s: a hand-made failover is seen then.
                Duration::from_secs(25),
                |s| s.failback_at.contains_key(&shard),
            )
            .await?;
        let raw = &s.failback_at[&shard];
        s.due(shard)
            .with_context(|| format!("failbackAt {raw:?} is not an RFC 3339 time"))
    }

    /// [`Self::announced`], checked to be at least the quiet period after the failover issued
    /// at `issued`.
    async fn announced_a_quiet_period_after(&self, shard: i64, issued: f64) -> anyhow::Result<f64> {
        let due = self.announced(shard, issued).await?;
        ensure!(
            due >= issued + QUIET - SLACK,
            "failbackAt {} less than the quiet period after the failover at {}",
            rel(due),
            rel(issued)
        );
        Ok(due)
    }

    /// The failback of every shard of `away` (shard → node index its primary is at after the
    /// disruption that started at `disrupted`): tracks the live primaries from now on (they
    /// must all be seen at `away` at once), waits until the cluster recovered (with `recover`:
    /// these pods replaced, Ready with the full topology; else now), opens a write-gap window
    /// once the status announces the failbacks, and checks every failback (see the module
    /// docs). Returns when the cluster recovered.
    async fn failback(
        &mut self,
        what: &str,
        prefix: &str,
        disrupted: f64,
        away: BTreeMap<i32, i32>,
        recover: Option<Vec<String>>,
    ) -> anyhow::Result<f64> {
        let (client, name) = (self.client().clone(), self.name);
        let tracking = track(&client, name, &away, Duration::from_secs(300));
        let shards = self.shards as usize;
        let replicas = self.replicas as usize;
        let opening = async {
            let recovered = match &recover {
                Some(uids) => {
                    // The status has shown the disruption (so a Ready status is not the one from
                    // before it), then the cluster recovered.
                    let unsettled = |s: &Snap| !s.calm();
                    if !self.log.latest().is_some_and(|s| unsettled(&s)) {
                        self.log
                            .wait_seen(
                                "the disruption",
                                disrupted,
                                Duration::from_secs(60),
                                unsettled,
                            )
                            .await?;
                    }
                    let since = Instant::now() - Duration::from_secs_f64(now() - disrupted);
                    wait_recovered(
                        &client,
                        name,
                        shards,
                        replicas,
                        uids,
                        since,
                        Duration::from_secs(240),
                    )
                    .await?;
                    now()
                }
                None => now(),
            };
            // The window opens once the status says when every failback is due.
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let latest = self.log.latest().context("no status")?;
                if away
                    .keys()
                    .all(|k| latest.failback_at.contains_key(&i64::from(*k)))
                {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "{name}: {what}: no failbackAt for every shard off home 60 s after recovery: {}",
                    latest.summary()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let opened = now();
            let w = self.gaps_start(prefix).await?;
            anyhow::Ok((recovered, opened, w))
        };
        let (tracked, opened) = tokio::join!(tracking, opening);
        let (recovered, opened, w) = opened?;
        let tracked = match tracked {
            Ok(t) => t,
            Err(e) => {
                drop(w);
                return Err(e);
            }
        };
        let gaps = self.gaps_stop(w, &format!("{what}: failback")).await?;
        let snaps = self.log.snaps();
        for (shard, home_at) in &tracked.home {
            let shard64 = i64::from(*shard);
            ensure!(
                *home_at > opened + 1.0,
                "{name}: {what}: shard {shard} failed back at {} before the write-gap window opened at {}",
                rel(*home_at),
                rel(opened)
            );
            // The due time announced last before the failback, and when it was first shown.
            let before: Vec<&Snap> = snaps.iter().filter(|s| s.at < *home_at).collect();
            let last = before
                .iter()
                .rposition(|s| s.failback_at.contains_key(&shard64))
                .with_context(|| format!("{what}: shard {shard} failed back unannounced"))?;
            let raw = &before[last].failback_at[&shard64];
            let due = before[last]
                .due(shard64)
                .with_context(|| format!("failbackAt {raw:?} is not an RFC 3339 time"))?;
            let mut first = last;
            while first > 0 && before[first - 1].failback_at.get(&shard64) == Some(raw) {
                first -= 1;
            }
            // The last status without that due time (none, or another one): the wait restarted
            // no earlier than then.
            let reset = if first > 0 {
                before[first - 1].at.max(disrupted)
            } else {
                disrupted
            };
            self.measure(format!(
                "{what}: shard {shard} back at node-index 0 {:.1}s after the disruption, {:.1}s after recovery, {:.2}s after its failbackAt; failbackAt {:.1}s after the last reset of the wait",
                home_at - disrupted,
                home_at - recovered,
                home_at - due,
                due - reset
            ));
            ensure!(
                due >= reset + QUIET - SLACK,
                "{name}: {what}: shard {shard}'s failbackAt {raw} ({}) is less than the quiet period after the wait restarted ({})",
                rel(due),
                rel(reset)
            );
            ensure!(
                *home_at >= due - 0.1,
                "{name}: {what}: shard {shard} failed back at {}, before its failbackAt {raw} ({})",
                rel(*home_at),
                rel(due)
            );
            ensure!(
                *home_at <= recovered + QUIET + DUE_WITHIN,
                "{name}: {what}: shard {shard} failed back {:.1}s after recovery (quiet period + {DUE_WITHIN}s allowed)",
                home_at - recovered
            );
            self.log
                .wait_seen(
                    &format!("status.operation Failback of shard {shard}"),
                    reset,
                    Duration::from_secs(15),
                    |s| {
                        s.operation
                            .as_ref()
                            .is_some_and(|(k, i)| k == "Failback" && *i == Some(shard64))
                    },
                )
                .await?;
        }
        self.check_gap(what, gaps.write_gap)?;
        // Once home, no failbackAt, and the status's primaries are the node-index-0 pods.
        let home_pods: BTreeMap<i64, String> = (0..self.shards)
            .map(|s| (i64::from(s), format!("valkey-{name}-{s}-0-0")))
            .collect();
        self.log
            .wait_seen(
                "every primary at node-index 0 and no failbackAt",
                now(),
                Duration::from_secs(20),
                |s| s.failback_at.is_empty() && s.primaries == home_pods,
            )
            .await
            .or_else(|e| match self.log.latest() {
                Some(s) if s.failback_at.is_empty() && s.primaries == home_pods => Ok(s),
                _ => Err(e),
            })?;
        self.failbacks += tracked.home.len();
        Ok(recovered)
    }

    /// A failback's write gap against the reference.
    fn check_gap(&mut self, what: &str, gap: Duration) -> anyhow::Result<()> {
        let reference = self.reference.context("no reference failover measured")?;
        let limit = reference.mul_f64(GAP_FACTOR).max(GAP_FLOOR);
        self.measure(format!(
            "{what}: failback write gap {:.3}s against the hand-made failover's {:.3}s (limit max({GAP_FACTOR}x, {:.1}s) = {:.3}s)",
            gap.as_secs_f64(),
            reference.as_secs_f64(),
            GAP_FLOOR.as_secs_f64(),
            limit.as_secs_f64()
        ));
        ensure!(
            gap <= limit,
            "{}: {what}: the failback's write gap {:.3}s exceeds {:.3}s (reference {:.3}s)",
            self.name,
            gap.as_secs_f64(),
            limit.as_secs_f64(),
            reference.as_secs_f64()
        );
        Ok(())
    }

    /// Occurrences of events `reason` of type `type_` on the ValkeyCluster (repetitions of one
    /// event counted).
    async fn events(&self, reason: &str, type_: &str) -> anyhow::Result<usize> {
        event_count(self.client(), self.name, reason, type_).await
    }

    /// The end state: every acknowledged write of `writer` reads back, Ready with the exact
    /// topology, a clean `valkey-cli --cluster check`, every primary at node-index 0, one
    /// `FailbackCompleted` per failback and no `FailbackFailed`.
    async fn finish(mut self, writer: Writer) -> anyhow::Result<Vec<String>> {
        let (client, name) = (self.client().clone(), self.name);
        let (acked, gap) = writer
            .stop_and_check(&client, name, PW, "the failovers and failbacks")
            .await?;
        self.measure(format!(
            "continuous writer: {acked} acknowledged writes, 0 lost, longest gap {:.2}s",
            gap.as_secs_f64()
        ));
        wait_ready(&client, name, self.shards, Duration::from_secs(60)).await?;
        check_topology(
            &client,
            name,
            self.shards as usize,
            self.replicas as usize,
            PW,
        )
        .await?;
        matrix::cluster_check(&client, name, &self.op_pw, false).await?;
        self.wait_all_home(Duration::from_secs(5)).await?;
        // Events are written after the pass's status: give the last one a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        let completed = loop {
            let n = self.events("FailbackCompleted", "Normal").await?;
            if n >= self.failbacks || Instant::now() > deadline {
                break n;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let failed = self.events("FailbackFailed", "Warning").await?;
        self.measure(format!(
            "{} failbacks seen, {completed} FailbackCompleted events, {failed} FailbackFailed",
            self.failbacks
        ));
        ensure!(
            completed == self.failbacks && failed == 0,
            "{name}: {} failbacks seen, {completed} FailbackCompleted and {failed} FailbackFailed events",
            self.failbacks
        );
        Ok(std::mem::take(&mut self.measures))
    }
}

fn away_at(shards: i32, index: i32) -> BTreeMap<i32, i32> {
    (0..shards).map(|s| (s, index)).collect()
}

/// The pod uids of cluster `name` (of the pods `filter` keeps).
async fn uids(
    client: &Client,
    name: &str,
    filter: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Vec<String>> {
    Ok(pods_of(client, name)
        .await?
        .iter()
        .filter(|p| filter(p))
        .filter_map(|p| p.metadata.uid.clone())
        .collect())
}

fn node_index(name: &str, p: &Pod) -> Option<i32> {
    shard_and_index(name, p.metadata.name.as_deref()?).map(|(_, i)| i)
}

/// Scenarios 1 and 2: the reference, then a roll, a delete and a kill, each failed back.
async fn main_cluster(fx: &Fixture) -> anyhow::Result<Vec<String>> {
    let extra = serde_json::json!({
        "persistence": {"size": "1Gi"},
        "config": {"save": "3600 1"}
    });
    let (mut c, writer) = Ctx::create_under_writer(fx, MAIN, 2, 1, extra).await?;
    let client = fx.client.clone();

    // The reference, and its own failback.
    let (issued, _) = c.reference_failover(1).await?;
    c.announced_a_quiet_period_after(0, issued).await?;
    c.failback(
        "hand-made failover",
        "fb-hand",
        issued,
        BTreeMap::from([(0, 1)]),
        None,
    )
    .await?;

    // A roll: replicas first, then each primary after a hand-over to node-index 1.
    let old = uids(&client, MAIN, |_| true).await?;
    let t = now();
    patch_spec(
        &client,
        MAIN,
        serde_json::json!({"resources": {"requests": {"cpu": "20m"}}}),
    )
    .await?;
    eprintln!("[{MAIN} {}] rolling every pod", rel(t));
    c.failback_of_both("roll", "fb-roll", t, Some(old), "patch")
        .await?;

    // Both primary pods deleted (the preStop hook holds while the operator hands over).
    let home = |p: &Pod| node_index(MAIN, p) == Some(0);
    let old = uids(&client, MAIN, home).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let t = now();
    for p in pods_of(&client, MAIN).await?.iter().filter(|p| home(p)) {
        pods.delete(&kube::ResourceExt::name_any(p), &DeleteParams::default())
            .await?;
    }
    eprintln!("[{MAIN} {}] deleted both primary pods", rel(t));
    c.failback_of_both("pod delete", "fb-delete", t, Some(old), "delete")
        .await?;

    // Both primaries' servers killed (each container restarts in place).
    let faults = fx.faults()?;
    let t = now();
    for s in 0..2 {
        faults.kill_container(NS, &format!("valkey-{MAIN}-{s}-0-0"), "server")?;
    }
    eprintln!("[{MAIN} {}] killed both primaries' servers", rel(t));
    c.failback_of_both("kill", "fb-kill", t, Some(Vec::new()), "kill")
        .await?;

    c.finish(writer).await
}

/// `INFO replication` of `pod` (as `app`).
async fn pod_info(client: &Client, pod: &str) -> anyhow::Result<String> {
    let p = Api::<Pod>::namespaced(client.clone(), NS).get(pod).await?;
    let ip = pod_ip(&p).context("pod IP")?;
    let info = tokio::time::timeout(Duration::from_secs(1), async {
        let mut c = node_conn(&ip, "app", PW).await?;
        query_cmd::<String>(&mut c, &["INFO", "replication"]).await
    })
    .await
    .context("INFO replication timed out")??;
    Ok(info)
}

/// Whether primary `primary` holds a full sync of `replica` back: it lists the replica in a
/// state other than `online` (`wait_bgsave` while `repl-diskless-sync-delay` runs; the replica
/// itself sits in the `PSYNC` handshake meanwhile, its link down).
async fn full_sync_pending(client: &Client, primary: &str, replica: &str) -> anyhow::Result<bool> {
    let p = Api::<Pod>::namespaced(client.clone(), NS)
        .get(replica)
        .await?;
    let ip = pod_ip(&p).context("pod IP")?;
    let info = pod_info(client, primary).await?;
    Ok(info.lines().any(|l| {
        l.starts_with("slave") && l.contains(&format!("ip={ip},")) && !l.contains("state=online")
    }))
}

/// `CONFIG SET <key> <value>` on `pod` (as `app`).
async fn config_set(client: &Client, pod: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let p = Api::<Pod>::namespaced(client.clone(), NS).get(pod).await?;
    let ip = pod_ip(&p).context("pod IP")?;
    let mut c = node_conn(&ip, "app", PW).await?;
    let () = query_cmd(&mut c, &["CONFIG", "SET", key, value]).await?;
    Ok(())
}

/// Scenario 3 (a) and (c): a second failover inside the quiet period, and node-index 0 in a
/// full sync.
async fn waits_cluster(fx: &Fixture) -> anyhow::Result<Vec<String>> {
    // No snapshots either (Valkey's default `save` would leave an RDB in the pod's emptyDir,
    // from which a restarted replica resumes with a partial resync): a restart is a full sync.
    let (mut c, writer) =
        Ctx::create_under_writer(fx, WAITS, 1, 2, serde_json::json!({"config": {"save": ""}}))
            .await?;
    let client = fx.client.clone();

    // (a) Node-index 1, then, 3 s before its failback is due, node-index 2.
    let (i1, _) = c.reference_failover(1).await?;
    let f1 = c.announced_a_quiet_period_after(0, i1).await?;
    sleep_until(f1 - 3.0).await;
    let (i2, _) = c.hand_failover(0, 2).await?;
    let moved = c
        .log
        .wait_seen(
            "failbackAt after the second failover",
            i2,
            Duration::from_secs(10),
            |s| s.due(0).is_some_and(|d| d > f1),
        )
        .await?;
    let f2 = moved.due(0).unwrap_or_default();
    let cleared = c
        .log
        .snaps()
        .iter()
        .any(|s| s.at >= i2 && s.at < moved.at && s.due(0).is_none());
    c.measure(format!(
        "second failover {:.1}s before the failback was due: failbackAt moved {:.1}s later ({:.1}s after the second failover){}",
        f1 - i2,
        f2 - f1,
        f2 - i2,
        if cleared {
            ", cleared in between"
        } else {
            ""
        }
    ));
    ensure!(
        f2 >= i2 + QUIET - SLACK,
        "failbackAt {} is less than the quiet period after the second failover at {}",
        rel(f2),
        rel(i2)
    );
    c.failback(
        "second failover inside the quiet period",
        "fb-second",
        i2,
        BTreeMap::from([(0, 2)]),
        None,
    )
    .await?;

    // (c) Data to sync, node-index 1 primary again, node-index 0 restarted into a full sync
    // its primary holds back.
    let mut conn = cluster_client(&client, WAITS, PW).await?;
    acked_writes(&mut conn, 10_000, "sync").await?;
    drop(conn);
    let home = format!("valkey-{WAITS}-0-0-0");
    let primary = format!("valkey-{WAITS}-0-1-0");
    config_set(&client, &primary, "repl-diskless-sync-delay", "120").await?;
    let (i3, _) = c.hand_failover(0, 1).await?;
    let killed = now();
    fx.faults()?.kill_container(NS, &home, "server")?;
    eprintln!(
        "[{WAITS} {}] killed the server of {home}: a full sync held by {primary}",
        rel(killed)
    );
    let mut roles = Roles::new(&client, WAITS);
    let hold_until = i3.max(killed) + QUIET + 8.0;
    let mut syncing_since = None;
    let held = async {
        while now() < hold_until {
            let members = roles.get().await?.remove(&0).context("shard 0")?;
            let home_role = members.get(&0).and_then(|m| m.role.clone());
            ensure!(
                home_role.as_deref() != Some("master"),
                "{home} is primary again {:.1}s after its restart, during its full sync (in a full sync since {:?}); status {}",
                now() - killed,
                syncing_since.map(rel),
                c.log.latest().map(|s| s.summary()).unwrap_or_default()
            );
            if full_sync_pending(&client, &primary, &home)
                .await
                .unwrap_or(false)
            {
                syncing_since.get_or_insert_with(now);
            }
            if let Some(s) = c.log.latest().filter(|s| s.at > killed + 5.0) {
                ensure!(
                    s.due(0).is_none(),
                    "failbackAt of shard 0 shown while {home} syncs: {}",
                    s.summary()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        ensure!(
            full_sync_pending(&client, &primary, &home).await?,
            "{home} is not in a full sync at the end of the hold:\n{}",
            pod_info(&client, &primary).await.unwrap_or_default()
        );
        anyhow::Ok(())
    };
    let held = held.await;
    let released = now();
    config_set(&client, &primary, "repl-diskless-sync-delay", "0").await?;
    held?;
    let syncing_since = syncing_since.context("the full sync was never seen")?;
    let late = c
        .log
        .snaps()
        .into_iter()
        .filter(|s| s.at > killed + 5.0 && s.at < released)
        .find(|s| s.due(0).is_some());
    ensure!(
        late.is_none(),
        "failbackAt of shard 0 shown while {home} synced: {late:?}"
    );
    c.measure(format!(
        "node-index 0 in a full sync from {:.1}s to {:.1}s after the failover (the quiet period is {QUIET}s): no failback, no failbackAt",
        syncing_since - i3,
        released - i3,
    ));
    let recovered = c
        .failback(
            "node-index 0 in a full sync",
            "fb-sync",
            released,
            BTreeMap::from([(0, 1)]),
            Some(Vec::new()),
        )
        .await?;
    c.measure(format!(
        "full sync released: Ready again {:.1}s later",
        recovered - released
    ));
    let mut conn = cluster_client(&client, WAITS, PW).await?;
    let during = "the full sync and the failback";
    check_acked(&mut conn, 10_000, "sync", during).await?;
    c.finish(writer).await
}

/// Scenario 3 (b): a scale-out started while a failback waits.
async fn scale_cluster(fx: &Fixture) -> anyhow::Result<Vec<String>> {
    let extra = serde_json::json!({
        "persistence": {"size": "1Gi"},
        "config": {"appendonly": "yes"}
    });
    let (mut c, writer) = Ctx::create_under_writer(fx, SCALE, 2, 1, extra).await?;
    let client = fx.client.clone();

    // Keys for the scale-out to move.
    let mut conn = cluster_client(&client, SCALE, PW).await?;
    acked_writes(&mut conn, 30_000, "scale").await?;
    drop(conn);
    let (i1, _) = c.reference_failover(1).await?;
    let f1 = c.announced(0, i1).await?;
    // Shortly before the failback is due, so the scale-out runs across that time.
    sleep_until(f1 - 1.5).await;
    let patched = now();
    patch_spec(&client, SCALE, serde_json::json!({"shards": 3})).await?;
    let generation = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .get(SCALE)
        .await?
        .metadata
        .generation
        .unwrap_or_default();
    eprintln!(
        "[{SCALE} {}] shards 2 -> 3, {:.1}s before shard 0's failback is due",
        rel(patched),
        f1 - patched
    );
    // No failback until the scale-out is done.
    let mut roles = Roles::new(&client, SCALE);
    let deadline = Instant::now() + Duration::from_secs(240);
    let done = loop {
        let places = roles.places().await?;
        let s = c.log.latest().context("no status")?;
        if !matches!(places.get(&0), Some(Place::Away(1) | Place::Unclear)) {
            let seen = c.log.snaps().iter().any(|s| s.observed == generation);
            bail!(
                "shard 0 failed back during the scale-out ({:.1}s after the patch, {}): {places:?}; status {}",
                now() - patched,
                if seen {
                    "after the operator saw it"
                } else {
                    "before the operator saw the patch: a test timing problem, not the operator's"
                },
                s.summary()
            );
        }
        if s.generation == generation && s.calm() && s.shards == 3 && s.ready_shards == 3 {
            break now();
        }
        ensure!(
            Instant::now() < deadline,
            "scale-out not done: {}",
            s.summary()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    c.shards = 3;
    let snaps: Vec<Snap> = c
        .log
        .snaps()
        .into_iter()
        .filter(|s| s.at > patched && s.at <= done && s.observed == generation)
        .collect();
    let migrating: Vec<&Snap> = snaps
        .iter()
        .filter(|s| {
            s.operation
                .as_ref()
                .is_some_and(|(k, _)| k == "MigrateSlots")
        })
        .collect();
    ensure!(
        !migrating.is_empty(),
        "status.operation never showed the scale-out's slot moves"
    );
    if let Some(s) = migrating.iter().find(|s| !s.failback_at.is_empty()) {
        bail!(
            "failbackAt shown while slots move for the scale-out: {}",
            s.summary()
        );
    }
    c.measure(format!(
        "scale-out 2 -> 3 patched {:.1}s before shard 0's failback was due (30,000 keys), done (Ready) {:.1}s after the patch, {:.1}s past that due time; {} status versions showed the slot moves, none a failbackAt",
        f1 - patched,
        done - patched,
        done - f1,
        migrating.len()
    ));
    ensure!(
        done > f1 + 0.5,
        "the scale-out ended {:.1}s after shard 0's failback was due: too early to show the wait",
        done - f1
    );
    c.failback(
        "scale-out",
        "fb-scale",
        patched,
        BTreeMap::from([(0, 1)]),
        None,
    )
    .await?;
    let mut conn = cluster_client(&client, SCALE, PW).await?;
    let during = "the scale-out and the failback";
    check_acked(&mut conn, 30_000, "scale", during).await?;
    c.finish(writer).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_failback_returns_primaries_home() -> anyhow::Result<()> {
    let started = Instant::now();
    let _ = rel(now());
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let (main, waits, scale) =
        tokio::join!(main_cluster(&fx), waits_cluster(&fx), scale_cluster(&fx));
    let mut failures = Vec::new();
    for (name, r) in [(MAIN, main), (WAITS, waits), (SCALE, scale)] {
        match r {
            Ok(lines) => {
                for l in lines {
                    eprintln!("MEASURE summary failback {name}: {l}");
                }
            }
            Err(e) => {
                eprintln!("FAILED {name}: {e:#}");
                failures.push(format!("{name}: {e:#}"));
            }
        }
    }
    fx.stop().await;
    eprintln!(
        "MEASURE failback test wall time: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    ensure!(failures.is_empty(), "failed: {failures:#?}");
    Ok(())
}
