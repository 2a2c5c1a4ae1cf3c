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
//!
//! Measured times are printed as `MEASURE …` lines.

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use support::*;
use valkey_ops::client::{self, ClientConfig};

const PW: &str = "tls-app-pw";
const NAME: &str = "tls";

/// The TLS Secret `name` from the generated files.
async fn create_tls_secret(
    client: &Client,
    name: &str,
    tls: &valkey_testkit::TlsFiles,
) -> anyhow::Result<()> {
    let mut data = std::collections::BTreeMap::new();
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        data.insert(f.to_owned(), ByteString(std::fs::read(tls.path(f))?));
    }
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    Ok(())
}

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

    fx.stop().await;
    eprintln!("MEASURE test wall time: {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}
