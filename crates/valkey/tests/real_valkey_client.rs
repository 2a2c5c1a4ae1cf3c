//! Needs real `valkey-server` binaries (see the `valkey-testkit` crate): pool reuse and reconnection,
//! response and connect timeouts.

use std::time::{Duration, Instant};

use valkey_ops::client::{self, ClientConfig, ClientError, NodePool};
use valkey_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_pool_reuses_and_reconnects() {
    let server = Server::start(Flavor::V9, None);
    let a = server.addr();
    let pool = app_pool(None);
    let id1: i64 = pool
        .query(&a, &redis::cmd("CLIENT").arg("ID").to_owned())
        .await
        .unwrap();
    let id2: i64 = pool
        .query(&a, &redis::cmd("CLIENT").arg("ID").to_owned())
        .await
        .unwrap();
    assert_eq!(id1, id2, "the pool must reuse its connection");
    assert_eq!(pool.cached_addrs(), vec![a.clone()]);
    // The server drops the pooled connection: the next call reconnects transparently.
    let other = NodePool::new(ClientConfig::new(APP_USER, APP_PASSWORD));
    let () = other
        .query(&a, redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id1))
        .await
        .unwrap();
    let id3: i64 = pool
        .query(&a, &redis::cmd("CLIENT").arg("ID").to_owned())
        .await
        .unwrap();
    assert_ne!(id3, id1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_response_timeout_is_configurable() {
    let server = Server::start(Flavor::V9, None);
    let a = server.addr();
    let cfg = ClientConfig::new(APP_USER, APP_PASSWORD)
        .with_timeouts(Duration::from_secs(1), Duration::from_millis(300));
    let pool = NodePool::new(cfg);
    // WAIT for a replica that does not exist blocks for 2 s on the server.
    let t = Instant::now();
    let e = pool
        .query::<i64>(&a, redis::cmd("WAIT").arg(1).arg(2000))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Timeout { .. } | ClientError::Connection { .. }
        ),
        "{e:?}"
    );
    assert!(t.elapsed() < Duration::from_millis(1500));
    // The default response timeout is seconds, not redis-rs' 500 ms.
    let pool = app_pool(None);
    let n: i64 = pool
        .query(&a, redis::cmd("WAIT").arg(1).arg(1000))
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn connect_times_out_on_a_silent_peer() {
    // A socket that accepts TCP but never answers the handshake.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let cfg = ClientConfig::new("_operator", "x")
        .with_timeouts(Duration::from_millis(300), Duration::from_millis(300));
    let t = Instant::now();
    let e = client::connect(&addr, &cfg).await.unwrap_err();
    assert!(e.is_unreachable(), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(3));
    drop(listener);
}
