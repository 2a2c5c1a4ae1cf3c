//! Needs real `valkey-server` 8.0 with TLS (see the `valkey-testkit` crate): a TLS-only cluster
//! (`port 0`, `tls-port`, `tls-cluster`, `tls-replication`) with certificates generated in
//! the test, reached by IP while verifying the certificate's DNS name.

use std::time::Duration;

use valkey_ops::client::{self, ClientConfig, ClientError};
use valkey_ops::commands;
use valkey_testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_tls_cluster_with_ca_and_server_name() {
    init_tracing();
    let tls = TlsFiles::generate();
    let servers = start_servers(Flavor::V8, 6, Some(&tls));
    let pool = operator_pool(Some(&tls));
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    form_cluster(&pool, &addrs[..3], &addrs[3..]).await;
    for r in &addrs[3..] {
        wait_replica_synced(&pool, r, "TLS replication link up").await;
    }
    let app = app_pool(Some(&tls));
    write_keys(&app, &addrs[0], 5_000).await;
    assert_eq!(count_bad_keys(&app, &addrs[0], 5_000).await, 0);

    let op = |cfg: ClientConfig| cfg;
    let base = || ClientConfig::new("_operator", OPERATOR_PASSWORD);
    // Wrong server name: the certificate does not match → no connection.
    let wrong_name = op(base().with_tls(tls.ca_pem.clone(), Some("other.name.test".into())));
    let e = client::connect(&addrs[0], &wrong_name).await.unwrap_err();
    assert!(matches!(e, ClientError::Connection { .. }), "{e:?}");
    // Verifying against the IP fails too: the certificate has only a DNS SAN.
    let by_ip = base().with_tls(tls.ca_pem.clone(), None);
    assert!(client::connect(&addrs[0], &by_ip).await.is_err());
    // Another CA is not trusted.
    let other = TlsFiles::generate();
    let wrong_ca = base().with_tls(other.ca_pem.clone(), Some(TLS_SERVER_NAME.into()));
    assert!(client::connect(&addrs[0], &wrong_ca).await.is_err());
    // Plain TCP to the TLS port does not work.
    let plain = base().with_timeouts(Duration::from_secs(1), Duration::from_secs(1));
    assert!(client::connect(&addrs[0], &plain).await.is_err());
    // Wrong password over TLS: an authentication error, never an unauthenticated session.
    let bad_pw = ClientConfig::new("_operator", "wrong")
        .with_tls(tls.ca_pem.clone(), Some(TLS_SERVER_NAME.into()));
    let e = client::connect(&addrs[0], &bad_pw).await.unwrap_err();
    assert!(matches!(e, ClientError::Auth { .. }), "{e:?}");
}

/// Certificates as users get them (cert-manager for a headless Service): a wildcard DNS name
/// of the Service, or an IP. The client dials the IP and accepts the first name that the
/// certificate is valid for, then the IP; a CA it does not trust fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_tls_wildcard_or_ip_certificates() {
    init_tracing();
    let names = vec![
        "node.valkey-c.ns.svc".to_owned(),
        "node.valkey-c.ns.svc.cluster.local".to_owned(),
    ];
    for (sans, ok) in [
        (
            &["*.valkey-c.ns.svc", "*.valkey-c.ns.svc.cluster.local"][..],
            true,
        ),
        (&["*.valkey-c.ns.svc.cluster.local"][..], true),
        (&["127.0.0.1"][..], true),
        (&["*.valkey-other.ns.svc"][..], false),
    ] {
        let tls = TlsFiles::generate_for(sans);
        let servers = start_servers(Flavor::V8, 1, Some(&tls));
        let addr = servers[0].addr();
        let cfg = ClientConfig::new("_operator", OPERATOR_PASSWORD)
            .with_tls_names(tls.ca_pem.clone(), names.clone());
        let r = client::connect(&addr, &cfg).await;
        if ok {
            let mut c = r.unwrap_or_else(|e| panic!("{sans:?}: {e}"));
            let pong: String = c.query(&redis::cmd("PING")).await.expect("PING");
            assert_eq!(pong, "PONG");
        } else {
            let Err(e) = r else {
                panic!("{sans:?}: a certificate for another Service must not be accepted");
            };
            assert!(e.is_name_mismatch(), "{sans:?}: {e:?}");
        }
        // Another CA: refused, and not mistaken for a name mismatch.
        let other = TlsFiles::generate_for(sans);
        let wrong_ca = ClientConfig::new("_operator", OPERATOR_PASSWORD)
            .with_tls_names(other.ca_pem.clone(), names.clone());
        let e = client::connect(&addr, &wrong_ca).await.unwrap_err();
        assert!(!e.is_name_mismatch(), "{sans:?}: {e:?}");
    }
}

/// The certificate of a PEM file, as DER.
fn der_of(pem_path: &str) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(pem_path).expect("read PEM");
    CertificateDer::from_pem_slice(&pem)
        .expect("a certificate")
        .to_vec()
}

/// Certificate rotation on a running server: the served certificate is read from a handshake;
/// new files are served only after `CONFIG SET tls-*-file` (same paths); a key that does not
/// match the certificate is refused and the server keeps serving what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_tls_certificate_reload() {
    use valkey_ops::tls::{fingerprint, served_certificate};
    init_tracing();
    let a = TlsFiles::generate();
    let servers = start_servers(Flavor::V8, 1, Some(&a));
    let addr = servers[0].addr();
    let pool = operator_pool(Some(&a));
    let t = Duration::from_secs(3);
    let served = || async { fingerprint(&served_certificate(&addr, t).await.expect("served")) };
    let fa = fingerprint(&der_of(&a.path("tls.crt")));
    assert_eq!(served().await, fa);

    let files = [
        ("tls-cert-file", a.path("tls.crt")),
        ("tls-key-file", a.path("tls.key")),
        ("tls-ca-cert-file", a.path("ca.crt")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let b = TlsFiles::generate();
    let fb = fingerprint(&der_of(&b.path("tls.crt")));
    // Only the key replaced: the pair does not match, the reload is refused, A is still served.
    std::fs::copy(b.path("tls.key"), a.path("tls.key")).expect("copy");
    let e = commands::tls_reload(&pool, &addr, &files)
        .await
        .unwrap_err();
    assert!(!e.to_string().is_empty());
    assert_eq!(served().await, fa);

    // The new pair and a CA bundle with both CAs: served only once reloaded.
    std::fs::copy(b.path("tls.crt"), a.path("tls.crt")).expect("copy");
    let bundle = [a.ca_pem.clone(), b.ca_pem.clone()].concat();
    std::fs::write(a.path("ca.crt"), &bundle).expect("write");
    assert_eq!(served().await, fa);
    commands::tls_reload(&pool, &addr, &files)
        .await
        .expect("reload");
    assert_eq!(served().await, fb);
    // A client trusting only the new CA now connects.
    let cfg = ClientConfig::new("_operator", OPERATOR_PASSWORD)
        .with_tls(b.ca_pem.clone(), Some(TLS_SERVER_NAME.into()));
    let mut c = client::connect(&addr, &cfg).await.expect("new CA");
    let pong: String = c.query(&redis::cmd("PING")).await.expect("PING");
    assert_eq!(pong, "PONG");
    // A plain address is refused by the probe.
    assert!(served_certificate("localhost:1", t).await.is_err());
}
