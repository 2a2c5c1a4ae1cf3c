//! Needs real `valkey-server` 8.0 with TLS (see the `valkey-testkit` crate). The operator's
//! TLS Secret check (`cluster::tls_secret::problem`) against real servers: a certificate it
//! accepts forms a TLS cluster bus, and one it names (extended key usage `serverAuth` alone,
//! what cert-manager issues when a Certificate sets no `usages`) keeps real servers' cluster
//! bus from connecting: Valkey nodes present their certificate to each other as TLS clients.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use rustls::pki_types::UnixTime;
use valkey_operator::cluster::tls_secret;
use valkey_ops::commands;
use valkey_ops::model::nodes::{ClusterNodes, LinkState};
use valkey_testkit::*;

fn secret_of(tls: &TlsFiles) -> Secret {
    let data = ["ca.crt", "tls.crt", "tls.key"]
        .into_iter()
        .map(|k| {
            let bytes = std::fs::read(tls.path(k)).expect("read");
            (k.to_owned(), ByteString(bytes))
        })
        .collect::<BTreeMap<_, _>>();
    Secret {
        data: Some(data),
        ..Default::default()
    }
}

/// Whether two TLS servers with this certificate see each other as connected within `wait`
/// after a MEET.
async fn bus_connects(tls: &TlsFiles, wait: Duration) -> bool {
    let servers = start_servers(Flavor::V8, 2, Some(tls));
    let pool = operator_pool(Some(tls));
    let (a, b) = (servers[0].addr(), servers[1].addr());
    commands::topology::meet(&pool, &a, b.parse().expect("addr"))
        .await
        .expect("MEET");
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        let connected = |nodes: &ClusterNodes| {
            nodes.nodes.len() == 2
                && nodes
                    .nodes
                    .iter()
                    .all(|n| n.link_state == LinkState::Connected && !n.flags.handshake)
        };
        let (na, nb) = (
            commands::cluster_nodes(&pool, &a).await.expect("nodes"),
            commands::cluster_nodes(&pool, &b).await.expect("nodes"),
        );
        if connected(&na) && connected(&nb) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_tls_secret_check_agrees_with_the_cluster_bus() {
    init_tracing();
    let names = vec![TLS_SERVER_NAME.to_owned()];
    for (usages, label) in [
        (vec![], "no extended key usage"),
        (vec![ServerAuth, ClientAuth], "serverAuth + clientAuth"),
        (vec![ServerAuth], "serverAuth only"),
    ] {
        let tls = TlsFiles::generate_with_usages(&[TLS_SERVER_NAME], &usages);
        let problem = tls_secret::problem("certs", Some(&secret_of(&tls)), &names, UnixTime::now());
        let started = Instant::now();
        // A connecting bus takes well under a second on loopback; 8 s is the negative's wait.
        let connects = bus_connects(&tls, Duration::from_secs(8)).await;
        eprintln!(
            "{label}: check {problem:?}, bus connected {connects} ({:.1}s)",
            started.elapsed().as_secs_f64()
        );
        assert_eq!(
            problem.is_none(),
            connects,
            "{label}: the check says {problem:?} but the real bus connected: {connects}"
        );
        if let Some(p) = problem {
            assert!(p.contains("client auth"), "{p}");
        }
    }
}
