//! A continuous cluster-aware writer with one worker per hash tag, for measuring what clients
//! see during a failover: each worker writes `{tN}:<i>` with `SET` + `WAIT <replicas>` (one
//! pipeline, to the tag's primary) on the same cluster connection, and records its own longest
//! time without a successful `SET` (the write gap) and without a replica-acknowledged one (the
//! durable gap). A slow shard therefore does not inflate the gaps of the others.

use std::time::{Duration, Instant};

use anyhow::ensure;
use kube::Client;
use tokio::sync::watch;

use super::writer_client;

/// What one worker saw.
#[derive(Clone, Debug, Default)]
pub struct TagReport {
    /// Indexes of the writes acknowledged by `replicas` replicas.
    pub acked: Vec<usize>,
    /// Longest time between two successful `SET`s.
    pub write_gap: Duration,
    /// Longest time between two replica-acknowledged writes.
    pub durable_gap: Duration,
    /// The last error (or short `WAIT` reply) before the longest write gap ended.
    pub gap_cause: String,
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
}

/// The running workers.
pub struct TagWriter {
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<(TagReport, redis::cluster_async::ClusterConnection)>>,
    prefix: String,
}

/// The key of worker `tag`'s write `i`.
fn key(prefix: &str, tag: usize, i: usize) -> String {
    format!("{{{prefix}{tag}}}:{i}")
}

impl TagWriter {
    /// Starts `tags` workers writing to cluster `name` as user `app`, keys `{<prefix>N}:<i>`,
    /// each write confirmed with `WAIT <replicas> 500`.
    pub async fn start(
        client: &Client,
        name: &str,
        pw: &str,
        prefix: &str,
        tags: usize,
        replicas: i64,
    ) -> anyhow::Result<Self> {
        // One cluster connection per worker: Valkey runs one connection's commands in order,
        // so on a shared connection every worker's `WAIT` (up to 500 ms while a shard has no
        // replica in sync) would hold up the next worker's `SET` and inflate its write gap.
        let mut conns = Vec::with_capacity(tags);
        for _ in 0..tags {
            conns.push(writer_client(client, name, pw).await?);
        }
        let (stop, rx) = watch::channel(false);
        let tasks = conns
            .into_iter()
            .enumerate()
            .map(|(tag, c)| {
                let (mut c, rx, prefix) = (c, rx.clone(), prefix.to_owned());
                tokio::spawn(async move {
                    let mut r = TagReport::default();
                    let (mut last_write, mut last_durable) = (Instant::now(), Instant::now());
                    let mut i = 0usize;
                    let mut cause = String::new();
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
                        if let Ok((n,)) = res {
                            if last_write.elapsed() > r.write_gap {
                                r.write_gap = last_write.elapsed();
                                r.gap_cause = std::mem::take(&mut cause);
                            }
                            last_write = Instant::now();
                            if n >= replicas {
                                r.durable_gap = r.durable_gap.max(last_durable.elapsed());
                                last_durable = Instant::now();
                                r.acked.push(i);
                            }
                        } else if let Err(e) = res {
                            cause = e.to_string();
                            if std::env::var_os("TAGWRITER_TRACE").is_some() {
                                eprintln!(
                                    "tagwriter {:?} tag {tag} write {i}: {e} (gap so far {:.2}s)",
                                    std::time::SystemTime::now(),
                                    last_write.elapsed().as_secs_f64()
                                );
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        i += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    r.write_gap = r.write_gap.max(last_write.elapsed());
                    r.durable_gap = r.durable_gap.max(last_durable.elapsed());
                    (r, c)
                })
            })
            .collect();
        Ok(Self {
            stop,
            tasks,
            prefix: prefix.to_owned(),
        })
    }

    /// Stops the workers and reads back every acknowledged write.
    pub async fn stop_and_check(mut self) -> anyhow::Result<TagSummary> {
        let _ = self.stop.send(true);
        let mut out = TagSummary::default();
        for (tag, task) in std::mem::take(&mut self.tasks).into_iter().enumerate() {
            // Read back on the worker's own connection (in use until now, so it knows the
            // current topology).
            let (r, mut conn) = task.await?;
            if r.write_gap > out.write_gap {
                out.write_gap = r.write_gap;
                out.gap_cause = format!("tag {tag}: {}", r.gap_cause);
            }
            out.durable_gap = out.durable_gap.max(r.durable_gap);
            out.acked += r.acked.len();
            for i in r.acked {
                let v: Option<usize> = redis::cmd("GET")
                    .arg(key(&self.prefix, tag, i))
                    .query_async(&mut conn)
                    .await?;
                if v != Some(i) {
                    out.lost += 1;
                }
            }
        }
        ensure!(out.acked > 0, "no write was acknowledged");
        Ok(out)
    }
}
