//! End-to-end (needs root): pod security, on localkube with real Valkey pods.
//!
//! The suite's namespace enforces the restricted Pod Security Standard (as every suite's does,
//! see `support::enforce_restricted`). A 1×0 cluster with `appendonly yes` on a
//! PersistentVolumeClaim forms there; its server process runs as uid 999 (read from the host's
//! `/proc`, not only the exec user), its root filesystem is read-only, `/data` and `/tmp`
//! are writable, and the exporter reports `redis_up 1`.
//!
//! A cluster with a sidecar that states no security context: the namespace refuses its pod,
//! the ValkeyCluster says so within seconds (Degraded `NodeAddFailed` with the API server's
//! words, one `PodCreationFailed` event), and is Ready once the sidecar states one.
//!
//! The cluster's app user (`+@all`) is warned about (ConfigurationWarning `UserCanChangeACLs`);
//! when it lets the monitoring user read passwords on a server, the operator applies that
//! system user again by itself (one `SystemUsersRestored` event); when it deletes the
//! operator's user on the server, the status names the pod and the remedy (Ready
//! `SystemUsersACLError`), and a restart of the pod restores the system users.
//!
//! Then the upgrade from a version without security contexts: the namespace relaxed to
//! `baseline`, the cluster's pods run as root as theirs did (`podSecurityContext` and
//! `securityContext` set to run as root without restrictions; the image's entrypoint still
//! runs the server as uid 999), and the data files are given to root with private modes (what
//! a server running as root writes). Back to the defaults, the pod rolls once more: the
//! kubelet gives the volume to `fsGroup` 999, the non-root server loads the append-only file
//! and every key written before is there.
//!
//! In a namespace enforcing `baseline` (a second localkube, in parallel): formation, a roll, a
//! scale-out and a primary kill under the writer (the other suites run these under
//! `restricted`).

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use kube::Client;
use kube::api::Api;
use support::*;

const NAME: &str = "sec";
const PW: &str = "sec-app-pw";
const KEYS: usize = 500;

/// The host pid of the pod's server (its `INFO server` `process_id`: localkube runs no PID
/// namespace) and that process's real uid from the host's `/proc`.
async fn server_uid(ip: &str) -> anyhow::Result<u32> {
    let mut c = node_conn(ip, "app", PW).await?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
    let pid: u32 = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .context("no process_id")?
        .trim()
        .parse()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .context("no Uid line")?;
    Ok(uid.parse()?)
}

/// The only pod of the cluster: its name and IP, once its server answers.
async fn the_pod(client: &Client) -> anyhow::Result<(String, String, String)> {
    let pods = pods_of(client, NAME).await?;
    ensure!(pods.len() == 1, "{} pods", pods.len());
    let p = &pods[0];
    Ok((
        p.metadata.name.clone().unwrap_or_default(),
        p.metadata.uid.clone().unwrap_or_default(),
        pod_ip(p).context("pod IP")?,
    ))
}

/// Waits until the cluster is Ready on a pod other than `old_uid`.
async fn wait_rolled(client: &Client, old_uid: &str) -> anyhow::Result<(String, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        wait_ready(client, NAME, 1, Duration::from_secs(240)).await?;
        if let Ok(p) = the_pod(client).await
            && p.1 != old_uid
        {
            return Ok(p);
        }
        ensure!(Instant::now() < deadline, "the pod never rolled");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn count_keys(ip: &str) -> anyhow::Result<usize> {
    let mut c = node_conn(ip, "app", PW).await?;
    let mut n = 0;
    for i in 0..KEYS {
        let v: Option<usize> = redis::cmd("GET")
            .arg(format!("k:{i}"))
            .query_async(&mut c)
            .await?;
        n += usize::from(v == Some(i));
    }
    Ok(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_root_security_restricted_by_default_and_upgrade_from_root() -> anyhow::Result<()>
{
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let faults = fx.faults()?;
    create_user_secret(&client, &format!("{NAME}-app"), PW).await?;
    create_cluster_with(
        &client,
        NAME,
        1,
        0,
        serde_json::json!({"persistence": {"size": "1Gi"}, "config": {"appendonly": "yes"}}),
    )
    .await?;
    wait_ready(&client, NAME, 1, Duration::from_secs(240)).await?;
    let (pod, uid, ip) = the_pod(&client).await?;

    // Restricted: the server runs as 999, the root filesystem is read-only.
    ensure!(server_uid(&ip).await? == 999, "server uid");
    let exec = |argv: &'static [&'static str], pod: String| {
        let faults = faults.clone();
        async move {
            faults
                .exec(NS, &pod, "server", argv, Duration::from_secs(10))
                .await
        }
    };
    let ro = exec(
        &[
            "sh",
            "-c",
            "touch /etc/x 2>&1; touch /data/x /tmp/x && id -u",
        ],
        pod.clone(),
    )
    .await?;
    let out = ro.output.clone();
    ensure!(
        out.contains("Read-only file system") && out.trim_end().ends_with("999"),
        "{out}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !scrape(&ip).await.unwrap_or_default().contains("redis_up 1") {
        ensure!(
            Instant::now() < deadline,
            "exporter never reported redis_up 1"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    {
        let mut c = node_conn(&ip, "app", PW).await?;
        for i in 0..KEYS {
            let _: () = redis::cmd("SET")
                .arg(format!("k:{i}"))
                .arg(i)
                .query_async(&mut c)
                .await?;
        }
    }

    // A sidecar without a security context: the namespace refuses its pod, and the status
    // says so with the API server's words, until the sidecar states one.
    let side = "sidecar";
    create_user_secret(&client, &format!("{side}-app"), PW).await?;
    let sidecar = |sc: serde_json::Value| {
        serde_json::json!({"containers": [{"name": "tick", "image": "busybox:1.36",
            "command": ["sh", "-c", "while true; do sleep 1; done"], "securityContext": sc}]})
    };
    create_cluster_with(&client, side, 1, 0, sidecar(serde_json::Value::Null)).await?;
    let t = Instant::now();
    let vcs = Api::<valkey_api::ValkeyCluster>::namespaced(client.clone(), NS);
    loop {
        let s = vcs.get(side).await?.status.unwrap_or_default();
        let degraded = s.conditions.iter().find(|c| c.type_ == "Degraded");
        if let Some(c) = degraded.filter(|c| c.status == "True" && c.reason == "NodeAddFailed")
            && c.message.contains("violates PodSecurity")
        {
            eprintln!(
                "MEASURE pod refused by Pod Security -> Degraded: {:.1}s ({})",
                t.elapsed().as_secs_f64(),
                c.message
            );
            break;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "the refused pod was not reported: {:?}",
            s.conditions
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NS)
        .list(&kube::api::ListParams::default().fields(&format!(
            "involvedObject.name={side},reason=PodCreationFailed"
        )))
        .await?;
    ensure!(
        events.items.len() == 1,
        "{} PodCreationFailed events",
        events.items.len()
    );
    patch_spec(
        &client,
        side,
        sidecar(serde_json::json!({"allowPrivilegeEscalation": false,
                                   "capabilities": {"drop": ["ALL"]}})),
    )
    .await?;
    wait_ready(&client, side, 1, Duration::from_secs(120)).await?;

    // A user allowed to change ACLs is warned about; when it locks the operator out of a
    // server, the status names the pod and the remedy, and a restart of the pod restores the
    // system users from the ACL file.
    let warned = vcs.get(NAME).await?.status.unwrap_or_default();
    ensure!(
        warned
            .conditions
            .iter()
            .any(|c| c.type_ == "ConfigurationWarning"
                && c.status == "True"
                && c.reason == "UserCanChangeACLs"
                && c.message.contains("users app ")),
        "no UserCanChangeACLs warning: {:?}",
        warned.conditions
    );
    // A system user the operator can still reach is applied again by itself: the app user
    // lets the monitoring user read passwords (`CONFIG GET`).
    let dryrun = |c: &mut redis::aio::MultiplexedConnection| {
        let mut c = c.clone();
        async move {
            redis::cmd("ACL")
                .arg("DRYRUN")
                .arg("_exporter")
                .arg("CONFIG")
                .arg("GET")
                .arg("primaryauth")
                .query_async::<String>(&mut c)
                .await
        }
    };
    let mut app = node_conn(&ip, "app", PW).await?;
    ensure!(dryrun(&mut app).await? != "OK", "_exporter may CONFIG GET");
    let _: () = query_cmd(&mut app, &["ACL", "SETUSER", "_exporter", "+config|get"]).await?;
    ensure!(
        dryrun(&mut app).await? == "OK",
        "the escalation did not take"
    );
    let t = Instant::now();
    while dryrun(&mut app).await? == "OK" {
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "the changed system user was not applied again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "MEASURE system user changed on the server -> applied again: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let restored = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NS)
        .list(&kube::api::ListParams::default().fields(&format!(
            "involvedObject.name={NAME},reason=SystemUsersRestored"
        )))
        .await?;
    ensure!(
        restored.items.len() == 1
            && restored.items[0]
                .message
                .as_deref()
                .is_some_and(|m| m.contains(&pod)),
        "SystemUsersRestored events: {:?}",
        restored
            .items
            .iter()
            .map(|e| &e.message)
            .collect::<Vec<_>>()
    );

    {
        let mut c = node_conn(&ip, "app", PW).await?;
        // Deleting the user also closes the operator's open connections (a password change
        // would only show at its next connection).
        let _: i64 = query_cmd(&mut c, &["ACL", "DELUSER", "_operator"]).await?;
    }
    let t = Instant::now();
    loop {
        let s = vcs.get(NAME).await?.status.unwrap_or_default();
        if let Some(c) = s.conditions.iter().find(|c| {
            c.type_ == "Ready" && c.reason == "SystemUsersACLError" && c.message.contains(&pod)
        }) {
            eprintln!(
                "MEASURE system user changed on the server -> reported: {:.1}s ({})",
                t.elapsed().as_secs_f64(),
                c.message
            );
            break;
        }
        ensure!(
            t.elapsed() < Duration::from_secs(60),
            "the refused credentials were not reported: {:?}",
            s.conditions
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
        .delete(&pod, &Default::default())
        .await?;
    let (_, uid, ip) = wait_rolled(&client, &uid).await?;
    ensure!(count_keys(&ip).await? == KEYS, "keys lost in the restart");

    // As a version without security contexts ran it: root, no restrictions.
    enforce_pod_security(&client, NS, "baseline").await?;
    patch_spec(
        &client,
        NAME,
        serde_json::json!({
            "podSecurityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false},
            "securityContext": {},
            "exporter": {"securityContext": {}},
        }),
    )
    .await?;
    let (pod, uid, ip) = wait_rolled(&client, &uid).await?;
    ensure!(
        count_keys(&ip).await? == KEYS,
        "keys lost in the roll to root"
    );
    // What a server running as root leaves: every file root's, private.
    let r = exec(
        &[
            "sh",
            "-c",
            "id -u; chown -R 0:0 /data && chmod -R go-rwx /data && ls -ln /data",
        ],
        pod.clone(),
    )
    .await?;
    let out = r.output.clone();
    ensure!(out.starts_with("0\n"), "exec not as root: {out}");
    eprintln!("legacy /data:\n{out}");

    // The upgrade: back to the defaults, in a restricted namespace.
    enforce_pod_security(&client, NS, "restricted").await?;
    patch_spec(
        &client,
        NAME,
        serde_json::json!({
            "podSecurityContext": null,
            "securityContext": null,
            "exporter": {"securityContext": null},
        }),
    )
    .await?;
    let (_, _, ip) = wait_rolled(&client, &uid).await?;
    ensure!(
        server_uid(&ip).await? == 999,
        "server uid after the upgrade"
    );
    let kept = count_keys(&ip).await?;
    ensure!(
        kept == KEYS,
        "{kept} of {KEYS} keys after the upgrade to non-root"
    );
    fx.stop().await;
    Ok(())
}

/// A namespace enforcing `baseline` (the other common level): a 2×1 cluster with an
/// append-only file on claims forms, rolls (a resources change), scales out to 3 shards and
/// survives a primary SIGKILL under the `SET` + `WAIT 1` writer; every acknowledged write
/// reads back, the live layout is exact and `valkey-cli --cluster check` is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_root_security_baseline_namespace_roll_scale_out_kill() -> anyhow::Result<()> {
    const B: &str = "base";
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    enforce_pod_security(&client, NS, "baseline").await?;
    create_user_secret(&client, &format!("{B}-app"), PW).await?;
    create_cluster_with(
        &client,
        B,
        2,
        1,
        serde_json::json!({"persistence": {"size": "1Gi"}, "config": {"appendonly": "yes"}}),
    )
    .await?;
    wait_ready(&client, B, 2, Duration::from_secs(240)).await?;
    let writer = tagwriter::TagWriter::start(&client, B, PW, "b", 4, 1).await?;

    // A roll: every pod replaced, one at a time.
    let before: Vec<String> = pod_identities(&client, B)
        .await?
        .into_values()
        .map(|(uid, _)| uid)
        .collect();
    let t = Instant::now();
    patch_spec(
        &client,
        B,
        serde_json::json!({"resources": {"requests": {"cpu": "10m"}}}),
    )
    .await?;
    let took = wait_recovered(&client, B, 2, 1, &before, t, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE baseline: roll of 4 pods {:.1}s",
        took.as_secs_f64()
    );

    // A scale-out.
    let t = Instant::now();
    patch_spec(&client, B, serde_json::json!({"shards": 3})).await?;
    wait_recovered(&client, B, 3, 1, &[], t, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE baseline: 2 -> 3 shards {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // A primary killed.
    let roles = shard_roles(&client, B, 0, PW).await?;
    let (primary, _, _) = roles
        .iter()
        .find(|(_, _, role)| role == "master")
        .context("shard 0 primary")?;
    let t = Instant::now();
    fx.faults()?.kill_container(NS, primary, "server")?;
    // The kill shows in the status before it recovers.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_recovered(&client, B, 3, 1, &[], t, Duration::from_secs(180)).await?;
    eprintln!(
        "MEASURE baseline: primary SIGKILL -> recovered {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let summary = writer.stop_and_check().await?;
    eprintln!(
        "MEASURE baseline writer: {} acknowledged, {} lost, longest write gap {:.2}s",
        summary.acked,
        summary.lost,
        summary.write_gap.as_secs_f64()
    );
    ensure!(summary.acked > 0, "nothing written");
    ensure!(
        summary.lost == 0,
        "{} acknowledged writes lost",
        summary.lost
    );
    check_topology(&client, B, 3, 1, PW).await?;
    let op_pw = system_operator_password(&client, B).await?;
    matrix::cluster_check(&client, B, &op_pw, false).await?;
    Ok(())
}
