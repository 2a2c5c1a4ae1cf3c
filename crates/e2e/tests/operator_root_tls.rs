//! End-to-end (needs root): a TLS cluster with an ordinary certificate, on localkube with real
//! Valkey 8.0 pods (the Debian build, with TLS).
//!
//! The certificate is what cert-manager issues for a headless Service: DNS SANs
//! `*.valkey-tls.default.svc` and `*.valkey-tls.default.svc.cluster.local`, no IP. The 3 × 1
//! cluster forms and becomes Ready (the operator dials pod IPs and verifies the certificate by
//! the Service name; the bus and replication use TLS with the same certificate); each server
//! refuses plain TCP and serves a client that verifies the certificate by that name; every
//! exporter reports `redis_up 1` over TLS. Then, under a continuous `SET` + `WAIT 1` writer
//! over TLS: a rolling update, and a SIGKILL of a primary; no acknowledged write is lost.
//! A certificate from another CA is reported. Then, under a new writer: a certificate rotation
//! to a new CA (reloaded on every pod, no restart) and a password rotation (a second key valid
//! together with the first; then the first removed); a replica pod deleted after the
//! certificate rotation rejoins with the new files.
//!
//! Measured times are printed as `MEASURE …` lines.

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use support::*;
use valkey_ops::client::{self, ClientConfig};

const PW: &str = "tls-app-pw";
const NAME: &str = "tls";

/// A connection config verifying the certificate by the Service name, as user `app`.
fn app_tls(ca: &[u8]) -> ClientConfig {
    ClientConfig::new("app", PW)
        .with_tls_names(ca.to_vec(), vec![format!("check.valkey-{NAME}.{NS}.svc")])
}

/// (pod, is primary) of every pod, from its live `INFO replication` over TLS.
async fn tls_roles(client: &Client, ca: &[u8]) -> anyhow::Result<Vec<(String, bool)>> {
    let mut out = Vec::new();
    for p in pods_of(client, NAME).await? {
        let addr = format!("{}:6379", pod_ip(&p).context("pod IP")?);
        let mut c = client::connect(&addr, &app_tls(ca)).await?;
        let repl: String = c.query(redis::cmd("INFO").arg("replication")).await?;
        out.push((p.name_any(), repl.contains("role:master")));
    }
    Ok(out)
}

/// Checks every pod over TLS (verified by the Service name, as user `app`): cluster state ok,
/// `shards` primaries and as many replicas; plain TCP is refused.
async fn check_tls_topology(client: &Client, ca: &[u8], shards: usize) -> anyhow::Result<()> {
    let cfg = app_tls(ca);
    let (mut primaries, mut replicas) = (0, 0);
    for p in pods_of(client, NAME).await? {
        let addr = format!("{}:6379", pod_ip(&p).context("pod IP")?);
        let mut c = client::connect(&addr, &cfg).await?;
        let info: String = c.query(redis::cmd("CLUSTER").arg("INFO")).await?;
        ensure!(info.contains("cluster_state:ok"), "{addr}: {info}");
        let repl: String = c.query(redis::cmd("INFO").arg("replication")).await?;
        if repl.contains("role:master") {
            primaries += 1;
        } else {
            replicas += 1;
        }
        let plain = ClientConfig::new("app", PW)
            .with_timeouts(Duration::from_secs(1), Duration::from_secs(1));
        ensure!(
            client::connect(&addr, &plain).await.is_err(),
            "{addr} answers plain TCP"
        );
    }
    ensure!(
        (primaries, replicas) == (shards, shards),
        "{primaries} primaries, {replicas} replicas"
    );
    Ok(())
}

/// Waits until `status.tls` shows certificate `sha256` served by all 6 pods; on timeout the
/// error shows `status.tls` and every ValkeyNode's `TLSCertificateApplied` condition.
async fn wait_tls(client: &Client, sha256: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let clusters: Api<valkey_api::ValkeyCluster> = Api::namespaced(client.clone(), NS);
    loop {
        let tls = clusters.get(NAME).await?.status.and_then(|s| s.tls);
        if tls
            .as_ref()
            .is_some_and(|t| t.certificate_sha256 == sha256 && (t.serving_pods, t.pods) == (6, 6))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            let nodes: Api<valkey_api::ValkeyNode> = Api::namespaced(client.clone(), NS);
            let conditions: Vec<String> = nodes
                .list(&Default::default())
                .await?
                .items
                .iter()
                .flat_map(|n| {
                    let name = n.name_any();
                    n.status
                        .iter()
                        .flat_map(|s| s.conditions.iter())
                        .filter(|c| c.type_ == "TLSCertificateApplied")
                        .map(move |c| format!("{name}: {} {} {}", c.status, c.reason, c.message))
                        .collect::<Vec<_>>()
                })
                .collect();
            anyhow::bail!(
                "not every pod serves certificate {sha256}: status.tls {tls:?}; {conditions:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_tls_cluster_with_a_service_certificate() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let svc = format!("valkey-{NAME}.{NS}.svc");
    let tls = valkey_testkit::TlsFiles::generate_for(&[
        &format!("*.{svc}"),
        &format!("*.{svc}.cluster.local"),
    ]);
    create_tls_secret(&client, "tls-certs", &tls).await?;
    create_user_secret(&client, &format!("{NAME}-app"), PW).await?;
    create_cluster_with(
        &client,
        NAME,
        3,
        1,
        serde_json::json!({
            "image": "valkey/valkey:8.0.1",
            "networking": {"tls": {"certificate": {"secretName": "tls-certs"}}}
        }),
    )
    .await?;
    let started = Instant::now();
    wait_ready(&client, NAME, 3, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE tls 3x1 apply -> Ready: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    check_tls_topology(&client, &tls.ca_pem, 3).await?;
    for p in pods_of(&client, NAME).await? {
        let ip = pod_ip(&p).context("pod IP")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let m = scrape(&ip).await.unwrap_or_default();
            if m.lines().any(|l| l == "redis_up 1") {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "exporter of {ip} never reported redis_up 1 over TLS"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    // A rolling update under a TLS writer.
    let writer = Writer::start(&client, NAME, PW, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = pod_identities(&client, NAME).await?;
    let rolled = Instant::now();
    patch_spec(
        &client,
        NAME,
        serde_json::json!({"resources": {"requests": {"cpu": "20m"}}}),
    )
    .await?;
    // Every pod replaced, then Ready.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let now = pod_identities(&client, NAME).await?;
        if now.len() == before.len() && now.values().all(|v| !before.values().any(|b| b.0 == v.0)) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "not every pod was rolled: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_ready(&client, NAME, 3, Duration::from_secs(180)).await?;
    eprintln!(
        "MEASURE tls roll -> Ready: {:.1}s",
        rolled.elapsed().as_secs_f64()
    );
    check_tls_topology(&client, &tls.ca_pem, 3).await?;

    // A primary SIGKILL under the same writer (the primary found from the live role).
    wait_ready(&client, NAME, 3, Duration::from_secs(60)).await?;
    let roles = tls_roles(&client, &tls.ca_pem).await?;
    let victim = roles
        .iter()
        .find(|(_, primary)| *primary)
        .map(|(pod, _)| pod.clone())
        .context("no primary")?;
    let killed = Instant::now();
    fx.faults()?.kill_container(NS, &victim, "server")?;
    let writable = wait_writable(&client, NAME, PW, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE tls primary kill: all slots writable after {:.1}s",
        writable.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_ready(&client, NAME, 3, Duration::from_secs(180)).await?;
    eprintln!(
        "MEASURE tls primary kill: Ready after {:.1}s",
        killed.elapsed().as_secs_f64()
    );
    check_tls_topology(&client, &tls.ca_pem, 3).await?;
    let roles = tls_roles(&client, &tls.ca_pem).await?;
    ensure!(
        roles
            .iter()
            .any(|(pod, primary)| *pod == victim && !primary),
        "the killed primary {victim} is not a replica now: {roles:?}"
    );
    let (acked, gap) = writer
        .stop_and_check(&client, NAME, PW, "the TLS roll and primary kill")
        .await?;
    eprintln!(
        "MEASURE tls: {acked} acknowledged writes, none lost; longest write gap {:.2}s",
        gap.as_secs_f64()
    );

    // A certificate from another CA in the Secret: said at once, nothing restarted, the
    // cluster keeps serving with the certificate its servers loaded; fixed, it clears.
    let pods = pod_identities(&client, NAME).await?;
    let stranger = valkey_testkit::TlsFiles::generate_for(&[&format!("*.{svc}")]);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let swap = |files: &valkey_testkit::TlsFiles| -> anyhow::Result<serde_json::Value> {
        let b64 = |f: &str| -> anyhow::Result<ByteString> {
            Ok(ByteString(std::fs::read(files.path(f))?))
        };
        Ok(serde_json::json!({"data": {"tls.crt": b64("tls.crt")?, "tls.key": b64("tls.key")?}}))
    };
    let swapped = Instant::now();
    secrets
        .patch(
            "tls-certs",
            &PatchParams::default(),
            &Patch::Merge(swap(&stranger)?),
        )
        .await?;
    let vc = wait_cluster(
        &client,
        NAME,
        "InvalidTLSSecret",
        Duration::from_secs(60),
        |vc| {
            condition_true(vc, "Degraded").is_some_and(|(r, m)| {
                r == "InvalidTLSSecret" && m.contains("tls-certs") && m.contains("CA mismatch")
            })
        },
    )
    .await?;
    eprintln!(
        "MEASURE tls: a certificate from another CA reported in {:.1}s: {:?}",
        swapped.elapsed().as_secs_f64(),
        vc.status.as_ref().and_then(|s| s.message.clone())
    );
    check_tls_topology(&client, &tls.ca_pem, 3).await?;
    ensure!(
        pod_identities(&client, NAME).await? == pods,
        "pods restarted after the bad Secret"
    );
    secrets
        .patch(
            "tls-certs",
            &PatchParams::default(),
            &Patch::Merge(swap(&tls)?),
        )
        .await?;
    wait_cluster(
        &client,
        NAME,
        "the warning cleared",
        Duration::from_secs(60),
        |vc| condition_true(vc, "Degraded").is_none(),
    )
    .await?;

    // Certificate rotation under a TLS writer: a certificate from a new CA, with ca.crt a
    // bundle of the old and the new CA, is reloaded on every pod (no restart, no lost write);
    // status.tls says when every pod serves it; a client trusting only the new CA then works.
    let writer = Writer::start(&client, NAME, PW, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods = pod_identities(&client, NAME).await?;
    let next = valkey_testkit::TlsFiles::generate_for(&[
        &format!("*.{svc}"),
        &format!("*.{svc}.cluster.local"),
    ]);
    let leaf = |files: &valkey_testkit::TlsFiles| -> anyhow::Result<String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let der = CertificateDer::from_pem_slice(&std::fs::read(files.path("tls.crt"))?)?;
        Ok(valkey_ops::tls::fingerprint(&der))
    };
    let want = leaf(&next)?;
    let first = leaf(&tls)?;
    wait_tls(&client, &first, Duration::from_secs(30)).await?;
    let mut rotated = swap(&next)?;
    rotated["data"]["ca.crt"] = serde_json::to_value(ByteString(
        [tls.ca_pem.clone(), next.ca_pem.clone()].concat(),
    ))?;
    let started = Instant::now();
    secrets
        .patch("tls-certs", &PatchParams::default(), &Patch::Merge(rotated))
        .await?;
    wait_tls(&client, &want, Duration::from_secs(90)).await?;
    eprintln!(
        "MEASURE tls certificate rotation: every pod serves the new certificate after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    for p in pods_of(&client, NAME).await? {
        let addr = format!("{}:6379", pod_ip(&p).context("pod IP")?);
        let der = valkey_ops::tls::served_certificate(&addr, Duration::from_secs(3)).await?;
        ensure!(
            valkey_ops::tls::fingerprint(&der) == want,
            "{} serves another certificate",
            p.name_any()
        );
    }
    ensure!(
        pod_identities(&client, NAME).await? == pods,
        "pods restarted for the certificate rotation"
    );
    check_tls_topology(&client, &next.ca_pem, 3).await?;
    wait_ready(&client, NAME, 3, Duration::from_secs(60)).await?;

    // A pod started after the rotation (it loads the new files) rejoins over TLS: its
    // replication and bus connections verify the peers with the CA bundle.
    let replica = tls_roles(&client, &next.ca_pem)
        .await?
        .into_iter()
        .find(|(_, primary)| !primary)
        .map(|(pod, _)| pod)
        .context("no replica")?;
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
        .delete(&replica, &Default::default())
        .await?;
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_ready(&client, NAME, 3, Duration::from_secs(180)).await?;
    check_tls_topology(&client, &next.ca_pem, 3).await?;
    eprintln!(
        "MEASURE tls: a replica pod deleted after the rotation is back in {:.1}s",
        restarted.elapsed().as_secs_f64()
    );

    // Password rotation under the same writer: a second key is valid together with the first,
    // then the first is removed.
    const PW2: &str = "tls-app-pw-2";
    let users = |keys: &[&str]| {
        serde_json::json!({"users": [{
            "name": "app",
            "passwordSecret": {"name": format!("{NAME}-app"), "keys": keys},
            "permissions": "+@all ~* &*"
        }]})
    };
    let accepts = |password: &'static str| {
        let cfg = ClientConfig::new("app", password).with_tls_names(
            next.ca_pem.clone(),
            vec![format!("check.valkey-{NAME}.{NS}.svc")],
        );
        let client = client.clone();
        async move { authenticates(&client, NAME, &cfg).await }
    };
    // Waits until every pod accepts `password` (or refuses it, `accepted` false) while `other`
    // keeps working; returns the seconds it took.
    let switch = |password: &'static str, accepted: bool, other: &'static str| async move {
        let started = Instant::now();
        loop {
            let (mine, others) = (accepts(password).await?, accepts(other).await?);
            if mine.iter().all(|ok| *ok == accepted) {
                ensure!(
                    others.iter().all(|ok| *ok),
                    "{other} stopped working: {others:?}"
                );
                return anyhow::Ok(started.elapsed().as_secs_f64());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(60),
                "{password} accepted={accepted} not reached everywhere: {mine:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    secrets
        .patch(
            &format!("{NAME}-app"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"password2": PW2}})),
        )
        .await?;
    patch_spec(&client, NAME, users(&["password", "password2"])).await?;
    let took = switch(PW2, true, PW).await?;
    eprintln!(
        "MEASURE password rotation: a second key valid on every pod after {took:.1}s (the first still valid)"
    );
    let (acked, gap) = writer
        .stop_and_check(&client, NAME, PW, "certificate and password rotation")
        .await?;
    eprintln!(
        "MEASURE tls rotation: {acked} acknowledged writes, none lost; longest write gap {:.2}s",
        gap.as_secs_f64()
    );
    patch_spec(&client, NAME, users(&["password2"])).await?;
    let took = switch(PW, false, PW2).await?;
    eprintln!("MEASURE password rotation: the first key refused on every pod after {took:.1}s");

    fx.stop().await;
    eprintln!("MEASURE test wall time: {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}
