//! A continuous cluster-aware writer with two workers per hash tag, for measuring what
//! clients see during a failover, each on its own cluster connection (Valkey runs one
//! connection's commands in order, so a blocked `WAIT` would hold up the next `SET`):
//!
//! - the *durable* worker writes `{tN}:<i>` with `SET` + `WAIT <replicas> 500` (one pipeline,
//!   to the tag's primary) and records its longest time without a replica-acknowledged write
//!   (the durable gap); every acknowledged key is read back at the end;
//! - the *probe* worker overwrites `{tN}:probe` with plain `SET`s and records the longest time
//!   from the first attempt that did not succeed to the next success (the write gap): how long
//!   a client without `WAIT` could not write that tag. A `WAIT` that times out while a shard has
//!   no replica in sync therefore does not count as unavailability.
//!
//! A slow shard does not inflate the gaps of the others. The workers and their connections
//! run on the writer's own runtime (own threads), as a client in its own process would: work
//! of the in-process operator or localkube's kubelets on the caller's runtime does not delay
//! them.
//!
//! Every probe stall of at least [`EPISODE`] is kept with its start, and stalls of all tags
//! that start within [`EVENT_WINDOW`] of each other form one *event* (one primary change, or a
//! scheduling hiccup): the per-event gaps, not only the longest, compare a disruption with the
//! floor.

use std::time::{Duration, Instant};

use anyhow::ensure;
use kube::Client;
use redis::cluster_async::ClusterConnection;
use tokio::sync::watch;

use super::writer_cluster_client;

/// The shortest probe stall kept as an episode (a `SET` on localkube takes well under 1 ms).
pub const EPISODE: Duration = Duration::from_millis(5);

/// Episodes of all tags starting within this window of an event's first one belong to it.
pub const EVENT_WINDOW: Duration = Duration::from_millis(1000);

/// What one tag's workers saw.
#[derive(Clone, Debug, Default)]
pub struct TagReport {
    /// Indexes of the writes acknowledged by `replicas` replicas.
    pub acked: Vec<usize>,
    /// Longest time from a `SET` attempt that failed or stalled to the next successful `SET`
    /// (the probe worker).
    pub write_gap: Duration,
    /// Longest time between two replica-acknowledged writes (the durable worker).
    pub durable_gap: Duration,
    /// The last error before the longest write gap ended.
    pub gap_cause: String,
    /// The probe's stalls of at least [`EPISODE`]: start and length.
    pub episodes: Vec<(Instant, Duration)>,
}

/// The writers' summary.
#[derive(Clone, Debug, Default)]
pub struct TagSummary {
    /// Replica-acknowledged writes, all tags.
    pub acked: usize,
    /// Longest write gap of any tag.
    pub write_gap: Duration,
    /// Longest durable gap of any tag.
    pub durable_gap: Duration,
    /// Acknowledged writes that did not read back.
    pub lost: usize,
    /// The tag and cause of the longest write gap.
    pub gap_cause: String,
    /// Per event (stalls of all tags grouped by start, see [`EVENT_WINDOW`]): its start and
    /// its longest stall.
    pub events: Vec<(Instant, Duration)>,
    /// The machine's own stalls: a thread of the writer's priority that sleeps 1 ms in a
    /// loop and overslept by at least [`EPISODE`], grouped like `events`. A probe stall that
    /// overlaps one is the machine's (CPU), not the cluster's.
    pub hiccups: Vec<(Instant, Duration)>,
    /// Probe stalls (all tags) and how many of them overlap a machine stall.
    pub stalls_on_hiccups: (usize, usize),
    /// Every probe stall of at least [`EPISODE`] (all tags): start and length.
    pub episodes: Vec<(Instant, Duration)>,
}

/// Whether `a` and `b` (start, length) overlap in time.
pub fn overlap(a: (Instant, Duration), b: (Instant, Duration)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// A thread that sleeps 1 ms at a time until the workers' stop signal and keeps every
/// oversleep of at least [`EPISODE`] (start, length): when a runnable thread of this machine
/// waited for a CPU.
fn hiccup_probe(stop: watch::Receiver<bool>) -> std::thread::JoinHandle<Vec<(Instant, Duration)>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let tick = Duration::from_millis(1);
        while !*stop.borrow() {
            let t = Instant::now();
            std::thread::sleep(tick);
            let late = t.elapsed().saturating_sub(tick);
            if late >= EPISODE {
                out.push((t, late));
            }
        }
        out
    })
}

/// Groups the episodes of all tags into events: (start, longest stall), in order.
pub fn events(mut episodes: Vec<(Instant, Duration)>) -> Vec<(Instant, Duration)> {
    episodes.sort();
    let mut out: Vec<(Instant, Duration)> = Vec::new();
    for (start, len) in episodes {
        match out.last_mut() {
            Some((first, longest)) if start.duration_since(*first) < EVENT_WINDOW => {
                *longest = (*longest).max(len);
            }
            _ => out.push((start, len)),
        }
    }
    out
}

fn trace(tag: usize, what: &str, e: &redis::RedisError, since: Instant) {
    if std::env::var_os("TAGWRITER_TRACE").is_some() {
        eprintln!(
            "tagwriter {:?} tag {tag} {what}: {e} (gap so far {:.2}s)",
            std::time::SystemTime::now(),
            since.elapsed().as_secs_f64()
        );
    }
}

/// The durable worker: `SET` + `WAIT` until `stop`; returns its acknowledged writes and
/// durable gap.
async fn durable_worker(
    mut c: ClusterConnection,
    rx: watch::Receiver<bool>,
    prefix: String,
    tag: usize,
    replicas: i64,
) -> (TagReport, ClusterConnection) {
    let mut r = TagReport::default();
    let mut last_durable = Instant::now();
    let mut i = 0usize;
    while !*rx.borrow() {
        let res: redis::RedisResult<(i64,)> = redis::pipe()
            .cmd("SET")
            .arg(key(&prefix, tag, i))
            .arg(i)
            .ignore()
            .cmd("WAIT")
            .arg(replicas)
            .arg(500)
            .query_async(&mut c)
            .await;
        match res {
            Ok((n,)) if n >= replicas => {
                r.durable_gap = r.durable_gap.max(last_durable.elapsed());
                last_durable = Instant::now();
                r.acked.push(i);
            }
            Ok(_) => {}
            Err(e) => {
                trace(tag, &format!("durable write {i}"), &e, last_durable);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    r.durable_gap = r.durable_gap.max(last_durable.elapsed());
    (r, c)
}

/// The probe worker: plain `SET`s until `stop`; returns its write gap and the error that
/// preceded it.
async fn probe_worker(
    mut c: ClusterConnection,
    rx: watch::Receiver<bool>,
    prefix: String,
    tag: usize,
) -> ProbeReport {
    let (mut gap, mut gap_cause, mut cause) = (Duration::ZERO, String::new(), String::new());
    let mut episodes = Vec::new();
    // Issue time of the first attempt of the current run without success.
    let mut trying_since: Option<Instant> = None;
    let probe_key = format!("{{{prefix}{tag}}}:probe");
    let mut i = 0usize;
    while !*rx.borrow() {
        let since = *trying_since.get_or_insert_with(Instant::now);
        let res: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&probe_key)
            .arg(i)
            .query_async(&mut c)
            .await;
        match res {
            Ok(()) => {
                if since.elapsed() > Duration::from_millis(200)
                    && std::env::var_os("TAGWRITER_TRACE").is_some()
                {
                    eprintln!(
                        "tagwriter {:?} tag {tag} probe write {i}: succeeded after {:.2}s",
                        std::time::SystemTime::now(),
                        since.elapsed().as_secs_f64()
                    );
                }
                let took = since.elapsed();
                if took >= EPISODE {
                    episodes.push((since, took));
                }
                if took > gap {
                    gap = took;
                    gap_cause = std::mem::take(&mut cause);
                }
                trying_since = None;
            }
            Err(e) => {
                trace(tag, &format!("probe write {i}"), &e, since);
                cause = e.to_string();
            }
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(since) = trying_since
        && since.elapsed() > gap
    {
        gap = since.elapsed();
        gap_cause = cause;
        episodes.push((since, gap));
    }
    (gap, gap_cause, episodes)
}

/// A probe worker's write gap, the error before it, and its episodes.
type ProbeReport = (Duration, String, Vec<(Instant, Duration)>);

/// A tag's durable worker (its report and connection) and probe worker.
type TagTasks = (
    tokio::task::JoinHandle<(TagReport, ClusterConnection)>,
    tokio::task::JoinHandle<ProbeReport>,
);

/// The running workers.
pub struct TagWriter {
    stop: watch::Sender<bool>,
    hiccups: Option<std::thread::JoinHandle<Vec<(Instant, Duration)>>>,
    tasks: Vec<TagTasks>,
    prefix: String,
    /// A client for fresh connections to read back with when a worker's connection fails.
    cc: redis::cluster::ClusterClient,
    /// The workers' runtime (its threads drive their connections).
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for TagWriter {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which an async caller must not do.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The key of worker `tag`'s write `i`.
fn key(prefix: &str, tag: usize, i: usize) -> String {
    format!("{{{prefix}{tag}}}:{i}")
}

impl TagWriter {
    /// Starts a durable and a probe worker per tag (`tags` of each) writing to cluster `name`
    /// as user `app`, keys `{<prefix>N}:<i>` and `{<prefix>N}:probe`, each durable write
    /// confirmed with `WAIT <replicas> 500`.
    pub async fn start(
        client: &Client,
        name: &str,
        pw: &str,
        prefix: &str,
        tags: usize,
        replicas: i64,
    ) -> anyhow::Result<Self> {
        let (stop, rx) = watch::channel(false);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("tagwriter")
            .enable_all()
            .build()?;
        let mut tasks = Vec::with_capacity(tags);
        let reader = writer_cluster_client(client, name, pw).await?;
        for tag in 0..tags {
            let cc = writer_cluster_client(client, name, pw).await?;
            // Connected on the writer's runtime, so their drivers run there.
            let connect = |cc: redis::cluster::ClusterClient| {
                rt.spawn(async move { cc.get_async_connection().await })
            };
            let durable = connect(cc.clone()).await??;
            let probe = connect(cc).await??;
            tasks.push((
                rt.spawn(durable_worker(
                    durable,
                    rx.clone(),
                    prefix.to_owned(),
                    tag,
                    replicas,
                )),
                rt.spawn(probe_worker(probe, rx.clone(), prefix.to_owned(), tag)),
            ));
        }
        Ok(Self {
            stop,
            hiccups: Some(hiccup_probe(rx)),
            tasks,
            prefix: prefix.to_owned(),
            cc: reader,
            rt: Some(rt),
        })
    }

    /// Stops the workers and reads back every acknowledged write.
    pub async fn stop_and_check(mut self) -> anyhow::Result<TagSummary> {
        let _ = self.stop.send(true);
        let hiccups = match self.hiccups.take() {
            Some(h) => h.join().unwrap_or_default(),
            None => Vec::new(),
        };
        let mut out = TagSummary::default();
        let mut episodes = Vec::new();
        for (tag, (durable, probe)) in std::mem::take(&mut self.tasks).into_iter().enumerate() {
            // Read back on the worker's own connection (in use until now, so it knows the
            // current topology).
            let (mut r, mut conn) = durable.await?;
            (r.write_gap, r.gap_cause, r.episodes) = probe.await?;
            episodes.append(&mut r.episodes);
            if r.write_gap > out.write_gap {
                out.write_gap = r.write_gap;
                out.gap_cause = format!("tag {tag}: {}", r.gap_cause);
            }
            out.durable_gap = out.durable_gap.max(r.durable_gap);
            out.acked += r.acked.len();
            for i in r.acked {
                let k = key(&self.prefix, tag, i);
                let mut tries = 0;
                let v: Option<usize> = loop {
                    match redis::cmd("GET").arg(&k).query_async(&mut conn).await {
                        Ok(v) => break v,
                        // A connection left broken by the disruption (a node cut off and
                        // back): read on a fresh one.
                        Err(e) if tries < 5 => {
                            tries += 1;
                            eprintln!("read-back of {k}: {e}; reconnecting");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            if let Ok(c) = self.cc.get_async_connection().await {
                                conn = c;
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                };
                if v != Some(i) {
                    out.lost += 1;
                }
            }
        }
        out.stalls_on_hiccups = (
            episodes.len(),
            episodes
                .iter()
                .filter(|e| hiccups.iter().any(|h| overlap(**e, *h)))
                .count(),
        );
        out.events = events(episodes.clone());
        out.episodes = episodes;
        out.hiccups = events(hiccups);
        ensure!(out.acked > 0, "no write was acknowledged");
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_of_all_tags_group_into_events() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // Two tags stalled by one primary change, a hiccup 3 s later, out of order.
        let got = events(vec![
            (t0 + ms(3000), ms(6)),
            (t0 + ms(10), ms(20)),
            (t0, ms(30)),
            (t0 + ms(900), ms(8)),
        ]);
        assert_eq!(got, vec![(t0, ms(30)), (t0 + ms(3000), ms(6))]);
        assert!(events(Vec::new()).is_empty());
    }
}
