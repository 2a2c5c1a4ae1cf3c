//! Needs real `valkey-server` binaries (see the `valkey-testkit` crate): 100 000 keys survive scaling
//! 3 → 4 → 3 shards with atomic slot migration (Valkey 9.1) and the key-by-key fallback
//! (Valkey 8.0), and interrupted migrations resume without losing keys.

use std::collections::HashMap;
use std::time::Duration;

use valkey_ops::client::NodePool;
use valkey_ops::commands::{self, AtomicMove, migrate};
use valkey_ops::slots::Slot;
use valkey_testkit::*;

const KEYS: u64 = 100_000;

type Moves = Vec<Move>;

/// Runs the moves, sources in parallel (atomic migrations waited for up to 60 s).
async fn execute(
    flavor: Flavor,
    pool: &NodePool,
    moves: &Moves,
    addr_of: &HashMap<String, String>,
    primaries: &[String],
) {
    let timeout = Duration::from_secs(60);
    execute_moves(flavor, pool, moves, addr_of, primaries, timeout).await;
}

/// Runs `batches` one after the other and prints how long the `what` migration took.
async fn execute_batches(
    flavor: Flavor,
    pool: &NodePool,
    batches: &[Moves],
    addr_of: &HashMap<String, String>,
    primaries: &[String],
    what: &str,
) {
    let t = std::time::Instant::now();
    for batch in batches {
        execute(flavor, pool, batch, addr_of, primaries).await;
    }
    eprintln!(
        "{flavor:?}: {what} migration of 4096 slots took {:?}",
        t.elapsed()
    );
}

async fn scale_out_and_in(flavor: Flavor) {
    init_tracing();
    let mut servers = start_servers(flavor, 8, None);
    let pool = operator_pool(None);
    let app = app_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    let ids = form_cluster(&pool, &addrs[..3], &addrs[3..6]).await;
    write_keys(&app, &addrs[0], KEYS).await;
    assert_eq!(total_keys(&pool, &addrs[..3]).await, KEYS);

    // Scale out: a fourth shard (primary + replica).
    join_nodes(&pool, &addrs[0], &addrs[6..8]).await;
    let new_id = commands::node_id(&pool, &addrs[6]).await.unwrap();
    attach_replica(&pool, &addrs[7], &new_id).await;
    wait_cluster_ok(&pool, &addrs, Duration::from_secs(30)).await;
    let addr_of = addrs_by_id(&pool, &addrs).await;
    let mut targets = ids.clone();
    targets.push(new_id.clone());
    let primaries: Vec<String> = vec![
        addrs[0].clone(),
        addrs[1].clone(),
        addrs[2].clone(),
        addrs[6].clone(),
    ];
    let batches = plan_batches(&owned_slots(&pool, &addrs[0]).await, &targets, 1024);
    let moves = batches.concat();
    assert_eq!(moves.iter().map(|m| m.2.len()).sum::<usize>(), 4096);
    execute_batches(flavor, &pool, &batches, &addr_of, &primaries, "scale-out").await;
    wait_cluster_ok(&pool, &addrs, Duration::from_secs(30)).await;
    let owned = owned_slots(&pool, &addrs[6]).await;
    let mine = owned.iter().find(|(i, _)| *i == new_id).unwrap();
    assert_eq!(mine.1.len(), 4096);
    assert_eq!(count_bad_keys(&app, &addrs[0], KEYS).await, 0);
    assert_eq!(total_keys(&pool, &primaries).await, KEYS);

    // Scale in: drain the fourth shard straight to the remaining owners.
    let batches = plan_batches(&owned_slots(&pool, &addrs[0]).await, &ids, 1024);
    assert!(batches.concat().iter().all(|(s, _, _)| *s == new_id));
    execute_batches(flavor, &pool, &batches, &addr_of, &primaries, "scale-in").await;
    assert_eq!(count_bad_keys(&app, &addrs[0], KEYS).await, 0);
    let dbsize: u64 = pool.query(&addrs[6], &redis::cmd("DBSIZE")).await.unwrap();
    assert_eq!(dbsize, 0);

    // Remove the drained shard: stop it, forget replica then primary on every node.
    let replica_id = commands::node_id(&pool, &addrs[7]).await.unwrap();
    servers[7].kill();
    servers[6].kill();
    pool.evict(&addrs[6]);
    pool.evict(&addrs[7]);
    let rest: Vec<String> = addrs[..6].to_vec();
    commands::forget_everywhere(&pool, &rest, &replica_id)
        .await
        .unwrap();
    commands::forget_everywhere(&pool, &rest, &new_id)
        .await
        .unwrap();
    wait_cluster_ok(&pool, &rest, Duration::from_secs(30)).await;
    for a in &rest {
        let v = commands::cluster_nodes(&pool, a).await.unwrap();
        assert_eq!(v.len(), 6, "{a} still knows removed nodes");
    }
    assert_eq!(count_bad_keys(&app, &addrs[0], KEYS).await, 0);
    assert_eq!(total_keys(&pool, &addrs[..3]).await, KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_atomic_migration_scale_out_and_in_keeps_100k_keys() {
    scale_out_and_in(Flavor::V9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_key_by_key_migration_scale_out_and_in_keeps_100k_keys() {
    scale_out_and_in(Flavor::V8).await;
}

/// [`rig_with_new_primary`] with [`KEYS`] keys.
async fn rig(flavor: Flavor) -> NewPrimaryRig {
    init_tracing();
    rig_with_new_primary(flavor, KEYS).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_interrupted_atomic_migration_resumes() {
    let (_servers, pool, app, addrs, moves, addr_of) = rig(Flavor::V9).await;
    // Start the migration from the first source, "crash" the operator (drop the future)
    // and cancel the server-side job: an aborted operation.
    let (src, dst, set) = &moves[0];
    let mv = vec![AtomicMove {
        ranges: set.ranges().collect(),
        target_id: dst.clone(),
    }];
    let r = tokio::time::timeout(
        Duration::from_millis(30),
        commands::migrate_slots_atomic(&pool, &addr_of[src], &mv, Duration::from_secs(60)),
    )
    .await;
    assert!(r.is_err(), "migration finished before the interruption");
    migrate::cancel_slot_migrations(&pool, &addr_of[src])
        .await
        .unwrap();
    let jobs = migrate::get_slot_migrations(&pool, &addr_of[src])
        .await
        .unwrap();
    assert!(!jobs.is_empty());
    // A second interruption that leaves the server-side job running.
    let _ = tokio::time::timeout(
        Duration::from_millis(30),
        commands::migrate_slots_atomic(&pool, &addr_of[src], &mv, Duration::from_secs(60)),
    )
    .await;
    // Resume everything (the operator's next pass).
    execute(Flavor::V9, &pool, &moves, &addr_of, &addrs).await;
    wait_cluster_ok(&pool, &addrs, Duration::from_secs(30)).await;
    assert_eq!(count_bad_keys(&app, &addrs[0], KEYS).await, 0);
    assert_eq!(total_keys(&pool, &addrs).await, KEYS);
    // Repeating a finished migration is a no-op.
    let again = commands::migrate_slots_atomic(&pool, &addr_of[src], &mv, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(again, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_interrupted_key_migration_resumes() {
    let (_servers, pool, app, addrs, moves, addr_of) = rig(Flavor::V8).await;
    let (src, dst, set) = &moves[0];
    let slots: Vec<Slot> = set.iter().collect();
    let opts = migrate::KeyMigrationOptions {
        batch_keys: 5,
        ..Default::default()
    };
    let r = tokio::time::timeout(
        Duration::from_millis(300),
        commands::migrate_slot_keys(&pool, &addr_of[src], &addr_of[dst], &slots, &addrs, &opts),
    )
    .await;
    assert!(r.is_err(), "migration finished before the interruption");
    // The crash left half-open slots behind.
    let mut views = Vec::new();
    for a in &addrs {
        views.push(commands::cluster_nodes(&pool, a).await.unwrap());
    }
    let open = migrate::open_slots(&views);
    assert!(!open.is_empty(), "no half-open slot after interruption");
    assert!(
        open.iter()
            .all(|o| o.source_id == *src && o.target_id == *dst)
    );
    // Detect and finish them, then run the whole plan again (idempotent).
    // (Gossip may already have closed some: a source that learns the target's newer epoch
    // for a slot drops its MIGRATING marker.)
    let finished = migrate::finish_open_slots(&pool, &addrs, &opts)
        .await
        .unwrap();
    assert!(finished.len() <= open.len());
    let mut views = Vec::new();
    for a in &addrs {
        views.push(commands::cluster_nodes(&pool, a).await.unwrap());
    }
    assert!(migrate::open_slots(&views).is_empty());
    execute(Flavor::V8, &pool, &moves, &addr_of, &addrs).await;
    wait_cluster_ok(&pool, &addrs, Duration::from_secs(30)).await;
    assert_eq!(count_bad_keys(&app, &addrs[0], KEYS).await, 0);
    assert_eq!(total_keys(&pool, &addrs).await, KEYS);
}
