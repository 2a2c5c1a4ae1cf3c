//! Needs real `valkey-server` binaries (see the `valkey-testkit` crate): forms 3×1 clusters.

use valkey_ops::commands;
use valkey_testkit::*;

async fn form_3x1(flavor: Flavor) {
    init_tracing();
    let servers = start_servers(flavor, 6, None);
    let pool = operator_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    let ids = form_cluster(&pool, &addrs[..3], &addrs[3..]).await;
    assert_eq!(ids.len(), 3);
    for a in &addrs {
        let o = commands::observe_node(&pool, a).await.unwrap();
        assert!(cluster_healthy(&o), "{a}: {:?}", o.cluster_info);
        assert_eq!(o.nodes.len(), 6);
        assert_eq!(o.nodes.primaries().count(), 3);
    }
    // Replicas are linked and follow the intended primaries.
    for (i, r) in addrs[3..].iter().enumerate() {
        let o = commands::observe_node(&pool, r).await.unwrap();
        assert_eq!(
            o.myself().unwrap().primary_id.as_deref(),
            Some(ids[i].as_str())
        );
        wait_replica_synced(&pool, r, "replica link up").await;
    }
    // Forming again is a no-op (idempotent).
    let again = form_cluster(&pool, &addrs[..3], &addrs[3..]).await;
    assert_eq!(again, ids);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_forms_3x1_cluster() {
    form_3x1(Flavor::V9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_forms_3x1_cluster() {
    form_3x1(Flavor::V8).await;
}
