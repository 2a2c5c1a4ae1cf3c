//! Benchmark (needs real `valkey-server` binaries, see the `valkey-testkit` crate): time from fresh
//! servers to a formed 3×1 cluster, and slot migration throughput moving 1 000 000 small keys
//! from 3 to 4 shards, atomic (Valkey 9.1) versus key-by-key (Valkey 8.0).
//!
//! `cargo run --release -p valkey-ops --example bench_migration [-- KEYS]`

use std::collections::HashMap;
use std::time::{Duration, Instant};

use valkey_ops::commands::{self, AtomicMove, migrate};
use valkey_ops::slots::Slot;
use valkey_testkit::*;

async fn formation(flavor: Flavor) -> (Duration, Duration) {
    let t = Instant::now();
    let servers = start_servers(flavor, 6, None);
    let started = t.elapsed();
    let pool = operator_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    let t = Instant::now();
    form_cluster(&pool, &addrs[..3], &addrs[3..]).await;
    (started, t.elapsed())
}

async fn migration(flavor: Flavor, keys: u64) -> (u64, Duration) {
    let servers = start_servers(flavor, 4, None);
    let pool = operator_pool(None);
    let app = app_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    let ids = form_cluster(&pool, &addrs[..3], &[]).await;
    write_keys(&app, &addrs[0], keys).await;
    join_nodes(&pool, &addrs[0], &addrs[3..4]).await;
    wait_cluster_ok(&pool, &addrs, Duration::from_secs(30)).await;
    let new_id = commands::node_id(&pool, &addrs[3]).await.unwrap();
    let mut targets = ids.clone();
    targets.push(new_id);
    let moves = plan_moves(&owned_slots(&pool, &addrs[0]).await, &targets);
    let mut addr_of = HashMap::new();
    for a in &addrs {
        addr_of.insert(commands::node_id(&pool, a).await.unwrap(), a.clone());
    }
    let t = Instant::now();
    match flavor {
        Flavor::V9 => {
            futures::future::try_join_all(moves.iter().map(|(s, d, set)| {
                let mv = vec![AtomicMove {
                    ranges: set.ranges().collect(),
                    target_id: d.clone(),
                }];
                let src = addr_of[s].clone();
                let pool = &pool;
                async move {
                    commands::migrate_slots_atomic(pool, &src, &mv, Duration::from_secs(600)).await
                }
            }))
            .await
            .unwrap();
        }
        Flavor::V8 => {
            let opts = migrate::KeyMigrationOptions::default();
            futures::future::try_join_all(moves.iter().map(|(s, d, set)| {
                let slots: Vec<Slot> = set.iter().collect();
                let (pool, opts, addrs, addr_of) = (&pool, &opts, &addrs, &addr_of);
                async move {
                    commands::migrate_slot_keys(pool, &addr_of[s], &addr_of[d], &slots, addrs, opts)
                        .await
                }
            }))
            .await
            .unwrap();
        }
    }
    let took = t.elapsed();
    let moved: u64 = pool.query(&addrs[3], &redis::cmd("DBSIZE")).await.unwrap();
    assert_eq!(count_bad_keys(&app, &addrs[0], keys).await, 0, "keys lost");
    (moved, took)
}

#[tokio::main]
async fn main() {
    let keys: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    for flavor in [Flavor::V9, Flavor::V8] {
        let (start, form) = formation(flavor).await;
        println!(
            "{flavor:?}: 6 fresh servers started in {start:.2?}; formed 3x1 cluster (cluster_state:ok everywhere) in {form:.2?}"
        );
    }
    for flavor in [Flavor::V9, Flavor::V8] {
        let (moved, took) = migration(flavor, keys).await;
        let mode = if flavor == Flavor::V9 {
            "atomic"
        } else {
            "key-by-key"
        };
        println!(
            "{flavor:?} {mode}: moved {moved} of {keys} keys (4096 slots, 3 -> 4 shards) in {took:.2?} = {:.0} keys/s",
            moved as f64 / took.as_secs_f64()
        );
    }
}
