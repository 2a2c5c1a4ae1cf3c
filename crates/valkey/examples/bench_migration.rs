//! Benchmark (needs real `valkey-server` binaries, see the `valkey-testkit` crate): time from fresh
//! servers to a formed 3×1 cluster, and slot migration throughput moving 1 000 000 small keys
//! from 3 to 4 shards, atomic (Valkey 9.1) versus key-by-key (Valkey 8.0).
//!
//! `cargo run --release -p valkey-ops --example bench_migration [-- KEYS]`

use std::time::{Duration, Instant};

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
    let (_servers, pool, app, addrs, moves, addr_of) = rig_with_new_primary(flavor, keys).await;
    let t = Instant::now();
    let atomic_timeout = Duration::from_secs(600);
    execute_moves(flavor, &pool, &moves, &addr_of, &addrs, atomic_timeout).await;
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
