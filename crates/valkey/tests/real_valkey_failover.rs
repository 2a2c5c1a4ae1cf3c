//! Needs real `valkey-server` binaries (see the `valkey-testkit` crate): automatic failover observed in
//! the model, guarded FORGET, replacement replica, manual failover modes, WAIT.

use std::time::Duration;

use valkey_ops::client::NodePool;
use valkey_ops::commands::{self, CommandError, FailoverMode};
use valkey_testkit::*;

/// A manual failover of `mode` on replica `addr` (waiting up to 20 s): whether it did one.
async fn failover(pool: &NodePool, addr: &str, mode: FailoverMode) -> bool {
    commands::failover(pool, addr, mode, Duration::from_secs(20))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_primary_death_failover_forget_and_replace() {
    init_tracing();
    let mut servers = start_servers(Flavor::V9, 6, None);
    let pool = operator_pool(None);
    let app = app_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    let ids = form_cluster(&pool, &addrs[..3], &addrs[3..]).await;
    write_keys(&app, &addrs[0], 10_000).await;
    for r in &addrs[3..] {
        wait_replica_synced(&pool, r, "replica link up").await;
    }
    // Replicas acknowledge the writes (WAIT on the writer's own connection: WAIT waits for the
    // calling connection's last write, so on any other connection it proves nothing).
    assert!(
        commands::wait_replicas(&app, &addrs[0], 1, Duration::from_secs(2))
            .await
            .unwrap()
            >= 1
    );

    // Guard: a node that a live replica follows is never forgotten.
    let rest_but_1: Vec<String> = addrs.iter().filter(|a| **a != addrs[1]).cloned().collect();
    match commands::forget_everywhere(&pool, &rest_but_1, &ids[1]).await {
        Err(CommandError::Refused(r)) => assert!(r.contains("live replica"), "{r}"),
        other => panic!("forget of a followed node was not refused: {other:?}"),
    }
    match commands::forget_everywhere(&pool, &addrs, &ids[1]).await {
        Err(CommandError::Refused(r)) => assert!(r.contains("alive") || r.contains("live"), "{r}"),
        other => panic!("forget of a live node was not refused: {other:?}"),
    }

    // Kill primary 0: its replica (addrs[3]) takes over automatically.
    servers[0].kill();
    pool.evict(&addrs[0]);
    let dead = ids[0].clone();
    let rest: Vec<String> = addrs[1..].to_vec();
    let promoted_id = commands::node_id(&pool, &addrs[3]).await.unwrap();
    let all = addrs.clone();
    let positions = || -> Vec<commands::Position> {
        (0..)
            .zip(&all)
            .map(|(i, a)| commands::Position {
                shard: i % 3,
                index: i / 3,
                pod: a.clone(),
                addr: a.parse().unwrap(),
            })
            .collect()
    };
    // The clocks the operator's staleness bound reads mean what it assumes: the replica's
    // `server_time_usec` is the wall clock, its link broke when the primary died (it streamed
    // in this life), and that is no earlier than `cluster-node-timeout` (2 s here) before the
    // cluster last heard the primary (`pong_recv`).
    let (down_s, now_ms, heard_ms) = eventually(
        "replica sees its primary's death",
        Duration::from_secs(10),
        || async {
            let view = commands::observe_topology(&pool, positions()).await;
            let v = view
                .members()
                .iter()
                .find(|m| m.addr.to_string() == addrs[3])?
                .view
                .clone()?;
            let down = v.link_down_since.filter(|s| *s >= 0)?;
            Some((down, v.time_ms?, view.last_heard_ms(&dead)?))
        },
    )
    .await;
    let wall_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    assert!(
        wall_ms.abs_diff(now_ms) < 5_000,
        "server clock {now_ms} vs {wall_ms}"
    );
    assert!(
        heard_ms <= now_ms + 1_000,
        "heard {heard_ms} after now {now_ms}"
    );
    let broke_ms = now_ms - u64::try_from(down_s).unwrap() * 1000;
    assert!(
        broke_ms + 2_000 >= heard_ms,
        "link broke at {broke_ms}, primary last heard at {heard_ms}"
    );
    // Observe through the model: the dead node unreachable and failed, its replica promoted
    // and serving its slots, the cluster healthy again.
    eventually(
        "automatic failover in the cluster view",
        Duration::from_secs(30),
        || async {
            let view = commands::observe_topology(&pool, positions()).await;
            let dead_unreachable = view
                .members()
                .iter()
                .any(|m| m.addr.to_string() == addrs[0] && m.view.is_none());
            let failed = view.known(&dead).is_some_and(|n| n.flags.fail);
            let promoted = view
                .members()
                .iter()
                .find(|m| m.id() == Some(promoted_id.as_str()))?;
            let healthy = view
                .reachable()
                .all(|m| m.view.as_ref().is_some_and(|v| v.cluster_ok));
            (dead_unreachable
                && failed
                && promoted.me()?.slot_count() == 5461
                && view.owned_slots().is_full()
                && healthy)
                .then_some(())
        },
    )
    .await;
    let o = commands::observe_node(&pool, &addrs[3]).await.unwrap();
    assert!(o.myself().unwrap().is_primary());
    assert_eq!(
        o.replication.as_ref().unwrap().role,
        valkey_ops::model::ReplicationRole::Primary
    );

    // Forget the dead node everywhere (no live replica follows it any more).
    let forgot = commands::forget_everywhere(&pool, &rest, &dead)
        .await
        .unwrap();
    assert_eq!(forgot, 5);
    assert_eq!(
        commands::forget_everywhere(&pool, &rest, &dead)
            .await
            .unwrap(),
        0
    );
    for a in &rest {
        assert!(
            commands::cluster_nodes(&pool, a)
                .await
                .unwrap()
                .get(&dead)
                .is_none()
        );
    }

    // A fresh node becomes the replica of the promoted primary.
    let fresh = Server::start(Flavor::V9, None);
    join_nodes(&pool, &addrs[1], &[fresh.addr()]).await;
    attach_replica(&pool, &fresh.addr(), &promoted_id).await;
    let mut now: Vec<String> = rest.clone();
    now.push(fresh.addr());
    wait_cluster_ok(&pool, &now, Duration::from_secs(30)).await;
    wait_replica_synced(&pool, &fresh.addr(), "fresh replica synced").await;
    assert_eq!(count_bad_keys(&app, &addrs[1], 10_000).await, 0);

    // Manual failovers: default (coordinated), repeated (no-op), then TAKEOVER back.
    assert!(failover(&pool, &addrs[4], FailoverMode::Default).await);
    assert!(!failover(&pool, &addrs[4], FailoverMode::Default).await);
    eventually("old primary demoted", Duration::from_secs(20), || async {
        commands::myself(&pool, &addrs[1])
            .await
            .ok()?
            .is_replica()
            .then_some(())
    })
    .await;
    assert!(failover(&pool, &addrs[1], FailoverMode::Takeover).await);
    assert!(failover(&pool, &addrs[4], FailoverMode::Force).await);
    wait_cluster_ok(&pool, &now, Duration::from_secs(30)).await;
    assert_eq!(count_bad_keys(&app, &addrs[1], 10_000).await, 0);
}
