//! End-to-end scenarios of the operator on localkube with real Valkey pods, in one environment
//! (run one after another to keep CI time low). Needs root.
//!
//! 1. A 2 shards × 2 replicas cluster with `workloadType: Deployment` reaches Ready: two
//!    primaries with two replicas each (seen by `_operator` from every pod), one Deployment and
//!    no StatefulSet per ValkeyNode.
//! 2. Killing the server process of shard 0's primary: one surviving primary of two is no
//!    majority, so Valkey cannot elect a replica; the operator takes over with the most
//!    caught-up replica. All slots are writable again, the cluster returns to Ready with the
//!    full replica count, and writes acknowledged with `WAIT 1` before are all readable.
//! 3. Deleting the pod of shard 1's primary (default grace): same outcome.
//! 4. Live settings (`maxmemory`, `maxmemory-policy`, `maxclients`) changed in `spec.config`
//!    reach every server without restarting a pod; every ValkeyNode reports
//!    `LiveConfigApplied=True`. A user added to `spec.users` can log in on every pod (ACL LOAD
//!    after the mounted file is refreshed), `ACLApplied=True`, still without a restart.
//! 5. A pod-template change rolls every pod one at a time (replicas first, primaries after a
//!    coordinated failover) while a client keeps writing: every acknowledged write survives.
//! 6. Deleting the ValkeyCluster garbage-collects its ValkeyNodes, workloads, Service,
//!    ConfigMap, Secrets and PodDisruptionBudget within 60 s.

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use support::*;
use valkey_api::{ValkeyCluster, ValkeyNode};

/// The pod of shard `shard`'s primary, from the status (itself from the live view).
async fn primary_of(client: &Client, name: &str, shard: usize) -> anyhow::Result<String> {
    let vc = Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .get(name)
        .await?;
    vc.status
        .and_then(|s| s.shard_statuses.get(shard)?.primary_pod.clone())
        .with_context(|| format!("no primary of shard {shard}"))
}

/// Waits (up to 240 s from `since`) until the victim pod is gone or replaced (when its uid is
/// given), the cluster is Ready with every shard ready, no shard's primary is the victim pod
/// unless it was only restarted, and the live topology has the full replica count.
async fn wait_recovered(
    client: &Client,
    name: &str,
    victim: &str,
    victim_uid: Option<String>,
    since: Instant,
) -> anyhow::Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let vcs: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let mut last_err = String::new();
    loop {
        ensure!(
            since.elapsed() < Duration::from_secs(240),
            "not recovered 240 s after losing {victim}: {last_err}"
        );
        let gone = match &victim_uid {
            Some(uid) => pods
                .get_opt(victim)
                .await?
                .is_none_or(|p| p.metadata.uid.as_ref() != Some(uid)),
            None => true,
        };
        let status = vcs.get(name).await?.status.unwrap_or_default();
        let ready = status.state == valkey_api::status::ClusterState::Ready
            && status.ready_shards == 2
            && !status
                .shard_statuses
                .iter()
                .any(|sh| sh.primary_pod.as_deref() == Some(victim));
        if gone && ready {
            match check_topology_as(
                client,
                name,
                2,
                2,
                "_operator",
                &system_operator_password(client, name).await?,
                false,
            )
            .await
            {
                Ok(()) => return Ok(since.elapsed()),
                Err(e) => last_err = e.to_string(),
            }
        } else {
            last_err = format!("gone={gone} {:?} {:?}", status.state, status.message);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// ValkeyNodes of cluster `name` whose condition `type_` is not True.
async fn condition_not_true(
    client: &Client,
    name: &str,
    type_: &str,
) -> anyhow::Result<Vec<String>> {
    Ok(Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&cluster_lp(name))
        .await?
        .into_iter()
        .filter(|vn| {
            !vn.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == type_ && c.status == "True")
            })
        })
        .map(|vn| format!("{}: {type_} not True", vn.name_any()))
        .collect())
}

/// Polls `pending` every 250 ms until it lists nothing; returns the time that took.
async fn wait_settled<F, Fut>(
    what: &str,
    timeout: Duration,
    mut pending: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<String>>>,
{
    let started = Instant::now();
    loop {
        let left = pending().await?;
        if left.is_empty() {
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < timeout,
            "{what} not done within {timeout:?}: {}",
            left.join("; ")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Deletes the system Secret, then its backup: each comes back with the same passwords, and the
/// operator's password still opens every server.
async fn system_secret_survives_deletion(client: &Client, name: &str) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let before = system_operator_password(client, name).await?;
    for which in ["system", "system-backup"] {
        let secret = format!("valkey-{name}-{which}");
        let original = secrets.get(&secret).await?;
        secrets.delete(&secret, &Default::default()).await?;
        let took = wait_settled(
            &format!("{secret} restored"),
            Duration::from_secs(60),
            || async {
                Ok(match secrets.get_opt(&secret).await? {
                    Some(s) if s.metadata.uid != original.metadata.uid => Vec::new(),
                    _ => vec![format!("{secret} not recreated")],
                })
            },
        )
        .await?;
        let restored = secrets.get(&secret).await?;
        ensure!(
            restored.data == original.data,
            "{secret} came back with other contents"
        );
        eprintln!(
            "MEASURE {secret} deleted → restored with the same passwords: {:.1}s",
            took.as_secs_f64()
        );
    }
    ensure!(system_operator_password(client, name).await? == before);
    let op_pw = before;
    for p in pods_of(client, name).await? {
        let ip = pod_ip(&p).context("pod ip")?;
        node_conn(&ip, "_operator", &op_pw).await?;
    }
    wait_ready(client, name, 2, Duration::from_secs(60)).await?;
    Ok(())
}

/// Waits until every pod's server has the `want` settings and every ValkeyNode reports
/// `LiveConfigApplied`; returns how long that took.
async fn wait_live_settings(
    client: &Client,
    name: &str,
    op_pw: &str,
    what: &str,
    want: &[(&str, &str)],
) -> anyhow::Result<Duration> {
    wait_settled(what, Duration::from_secs(60), || async {
        let mut pending = condition_not_true(client, name, "LiveConfigApplied").await?;
        for p in pods_of(client, name).await? {
            let ip = pod_ip(&p).context("pod ip")?;
            let mut c = node_conn(&ip, "_operator", op_pw).await?;
            for (k, v) in want {
                let got: Vec<String> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg(k)
                    .query_async(&mut c)
                    .await?;
                if got.get(1).map(String::as_str) != Some(*v) {
                    pending.push(format!("{ip} {k}={got:?}"));
                }
            }
        }
        Ok(pending)
    })
    .await
}

async fn live_changes_applied_without_restart(client: &Client, name: &str) -> anyhow::Result<()> {
    let before = pod_identities(client, name).await?;
    let op_pw = system_operator_password(client, name).await?;
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let patch = serde_json::json!({"spec": {"config": {
        "maxmemory": "64mb", "maxmemory-policy": "allkeys-lru", "maxclients": "2000"
    }}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let want = [
        ("maxmemory", "67108864"),
        ("maxmemory-policy", "allkeys-lru"),
        ("maxclients", "2000"),
    ];
    let took = wait_live_settings(client, name, &op_pw, "live settings", &want).await?;
    eprintln!(
        "MEASURE live settings changed → on every server, LiveConfigApplied=True: {:.1}s",
        took.as_secs_f64()
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-config"))
        .await?;
    let conf = cm
        .data
        .as_ref()
        .and_then(|d| d.get("valkey.conf"))
        .context("valkey.conf")?;
    ensure!(
        conf.contains("maxmemory 64mb"),
        "restarted pods would not get the setting: {conf}"
    );
    wait_ready(client, name, 2, Duration::from_secs(60)).await?;

    // A live key removed from spec.config returns to Valkey's default on every server (what a
    // restarted pod would have), without a restart; the others stay.
    let patch =
        serde_json::json!({"spec": {"config": {"maxmemory-policy": null, "maxclients": null}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let want = [
        ("maxmemory", "67108864"),
        ("maxmemory-policy", "noeviction"),
        ("maxclients", "10000"),
    ];
    let took = wait_live_settings(client, name, &op_pw, "live settings removed", &want).await?;
    eprintln!(
        "MEASURE live settings removed → Valkey defaults on every server: {:.1}s",
        took.as_secs_f64()
    );
    wait_ready(client, name, 2, Duration::from_secs(60)).await?;

    // A new user: the ACL Secret changes, every pod's mounted file follows, the operator runs
    // ACL LOAD; the user can log in everywhere.
    create_user_secret(client, &format!("{name}-reader"), "reader-password-1").await?;
    let patch = serde_json::json!({"spec": {"users": [
        {"name": "app", "passwordSecret": {"name": format!("{name}-app"), "keys": ["password"]},
         "permissions": "+@all ~* &*"},
        {"name": "reader", "passwordSecret": {"name": format!("{name}-reader"), "keys": ["password"]},
         "permissions": "+get ~*"}
    ]}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let took = wait_settled("new user", Duration::from_secs(120), || async {
        let mut pending = condition_not_true(client, name, "ACLApplied").await?;
        for p in pods_of(client, name).await? {
            let ip = pod_ip(&p).context("pod ip")?;
            if let Err(e) = node_conn(&ip, "reader", "reader-password-1").await {
                pending.push(format!("{ip}: {e}"));
            }
        }
        Ok(pending)
    })
    .await?;
    eprintln!(
        "MEASURE user added → usable on every pod, ACLApplied=True: {:.1}s",
        took.as_secs_f64()
    );

    // Password rotation: the reader's Secret changes; every pod takes the new password and
    // refuses the old one. From an idle Ready cluster (the controller's next requeue is 10 s
    // away), so the time shows how fast the change itself is noticed.
    wait_ready(client, name, 2, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    Api::<Secret>::namespaced(client.clone(), NS)
        .patch(
            &format!("{name}-reader"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"stringData": {"password": "reader-password-2"}})),
        )
        .await?;
    let took = wait_settled("password rotation", Duration::from_secs(120), || async {
        let mut pending = Vec::new();
        for p in pods_of(client, name).await? {
            let ip = pod_ip(&p).context("pod ip")?;
            if let Err(e) = node_conn(&ip, "reader", "reader-password-2").await {
                pending.push(format!("{ip} new password: {e}"));
            }
            if node_conn(&ip, "reader", "reader-password-1").await.is_ok() {
                pending.push(format!("{ip} still accepts the old password"));
            }
        }
        Ok(pending)
    })
    .await?;
    eprintln!(
        "MEASURE password Secret changed → new password on every pod, old refused: {:.1}s",
        took.as_secs_f64()
    );
    // Neither change restarted or replaced a pod.
    let after = pod_identities(client, name).await?;
    ensure!(
        before == after,
        "pods were restarted or replaced by a live change: {before:?} → {after:?}"
    );
    wait_ready(client, name, 2, Duration::from_secs(60)).await?;
    Ok(())
}

async fn rolling_update_keeps_acknowledged_writes(
    client: &Client,
    name: &str,
    pw: &str,
) -> anyhow::Result<()> {
    let before = pod_identities(client, name).await?;
    let writer = Writer::start(client, name, pw, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NS);
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"cpu": "10m"}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    // Every pod replaced (one at a time), then Ready with the full topology.
    let took = wait_settled("rolling update", Duration::from_secs(400), || async {
        let now = pod_identities(client, name).await?;
        let mut pending: Vec<String> = now
            .iter()
            .filter(|(_, (uid, _))| before.values().any(|(u, _)| u == uid))
            .map(|(pod, _)| format!("{pod} not replaced"))
            .collect();
        let status = api.get(name).await?.status.unwrap_or_default();
        if status.state != valkey_api::status::ClusterState::Ready {
            pending.push(format!("{:?} {:?}", status.state, status.message));
        }
        Ok(pending)
    })
    .await?;
    check_topology_as(
        client,
        name,
        2,
        2,
        "_operator",
        &system_operator_password(client, name).await?,
        false,
    )
    .await?;
    let (acked, max_gap) = writer.stop().await?;
    eprintln!(
        "MEASURE rolling update of 6 pods (2x2): {:.1}s; {} writes acknowledged meanwhile, longest gap between acknowledged writes {:.1}s",
        took.as_secs_f64(),
        acked.len(),
        max_gap.as_secs_f64()
    );
    ensure!(
        !acked.is_empty(),
        "no write was acknowledged during the roll"
    );
    let mut conn = cluster_client(client, name, pw).await?;
    for i in &acked {
        let v: Option<usize> = redis::cmd("GET")
            .arg(format!("w:{i}"))
            .query_async(&mut conn)
            .await?;
        ensure!(
            v == Some(*i),
            "write w:{i} acknowledged during the roll is lost: {v:?}"
        );
    }
    check_acked(&mut conn, 2_000, "a", "the rolling update").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_deployment_2x2_failovers_and_gc() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();

    // 1. 2 shards × 2 replicas, workloadType Deployment.
    let name = "dep";
    let pw = "app-password-1";
    create_user_secret(&client, &format!("{name}-app"), pw).await?;
    let started = Instant::now();
    create_cluster_with(
        &client,
        name,
        2,
        2,
        serde_json::json!({"workloadType": "Deployment"}),
    )
    .await?;
    wait_ready(&client, name, 2, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE 2x2 Deployment apply→Ready: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let system = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("valkey-{name}-system"))
        .await?;
    let op_pw = secret_value(&system, "operator-password")?;
    check_topology_as(&client, name, 2, 2, "_operator", &op_pw, false).await?;
    let vns = Api::<ValkeyNode>::namespaced(client.clone(), NS)
        .list(&cluster_lp(name))
        .await?;
    ensure!(vns.items.len() == 6, "ValkeyNodes: {}", vns.items.len());
    let deployments = Api::<Deployment>::namespaced(client.clone(), NS)
        .list(&cluster_lp(name))
        .await?;
    ensure!(
        deployments.items.len() == 6,
        "Deployments: {}",
        deployments.items.len()
    );
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await?;
    ensure!(
        statefulsets.items.is_empty(),
        "StatefulSets exist: {:?}",
        statefulsets
            .items
            .iter()
            .map(|s| s.metadata.name.clone())
            .collect::<Vec<_>>()
    );

    // 2. Kill the server process of shard 0's primary. With two shards the surviving
    //    primaries are no majority, so no replica can win Valkey's election: the operator
    //    takes over with the most caught-up replica.
    acked_writes(&mut cluster_client(&client, name, pw).await?, 2_000, "a").await?;
    let victim = primary_of(&client, name, 0).await?;
    let faults = fx.faults()?;
    let killed = Instant::now();
    faults.kill_container(NS, &victim, "server")?;
    eprintln!("killed the server of {victim}");
    let writable = wait_writable(&client, name, pw, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE 2x2 primary kill → all slots writable: {:.1}s",
        writable.as_secs_f64()
    );
    let recovered = wait_recovered(&client, name, &victim, None, killed).await?;
    eprintln!(
        "MEASURE 2x2 primary kill → Ready with full replica count: {:.1}s",
        recovered.as_secs_f64()
    );
    check_acked(
        &mut cluster_client(&client, name, pw).await?,
        2_000,
        "a",
        "the primary kill",
    )
    .await?;

    // 3. Delete the pod of shard 1's primary (default grace): its preStop hook holds SIGTERM
    //    while the operator hands its slots to a replica with a coordinated failover; the
    //    Deployment's new pod becomes a replica.
    acked_writes(&mut cluster_client(&client, name, pw).await?, 2_000, "b").await?;
    let victim = primary_of(&client, name, 1).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let victim_uid = pods.get(&victim).await?.metadata.uid;
    let deleted = Instant::now();
    pods.delete(&victim, &DeleteParams::default()).await?;
    eprintln!("deleted pod {victim}");
    let writable = wait_writable(&client, name, pw, Duration::from_secs(120)).await?;
    eprintln!(
        "MEASURE 2x2 primary pod delete → all slots writable: {:.1}s",
        writable.as_secs_f64()
    );
    let recovered = wait_recovered(&client, name, &victim, victim_uid, deleted).await?;
    eprintln!(
        "MEASURE 2x2 primary pod delete → Ready with full replica count: {:.1}s",
        recovered.as_secs_f64()
    );
    let handed_over = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={name},reason=FailoverInitiated"
        )))
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .find(|m| m.contains(&format!("before pod {victim} stops")));
    ensure!(
        handed_over.is_some(),
        "no coordinated hand-over before pod {victim} stopped"
    );
    eprintln!("{}", handed_over.unwrap_or_default());
    let mut conn = cluster_client(&client, name, pw).await?;
    check_acked(&mut conn, 2_000, "a", "the primary pod delete").await?;
    check_acked(&mut conn, 2_000, "b", "the primary pod delete").await?;
    drop(conn);

    // 4. The system Secret deleted (then its backup): restored with the same passwords, so the
    //    operator still reaches every server (the live changes below need it).
    system_secret_survives_deletion(&client, name).await?;

    // 5. Live settings: maxmemory, maxmemory-policy and maxclients reach every server with
    //    CONFIG SET; no pod is restarted or replaced; every ValkeyNode reports
    //    LiveConfigApplied=True.
    live_changes_applied_without_restart(&client, name).await?;

    // 5. Rolling update: a pod-template change (resources) replaces every pod one at a time,
    //    replicas first, primaries after a coordinated failover, while a client keeps writing;
    //    every write acknowledged by a replica survives.
    rolling_update_keeps_acknowledged_writes(&client, name, pw).await?;

    // 6. Delete the ValkeyCluster: everything it owns is garbage-collected.
    ensure!(objects_left(&client, name).await?.len() >= 6 + 6 + 5);
    let deleted = Instant::now();
    Api::<ValkeyCluster>::namespaced(client.clone(), NS)
        .delete(name, &DeleteParams::default())
        .await?;
    let gone_after = loop {
        let left = objects_left(&client, name).await?;
        if left.is_empty() {
            break deleted.elapsed();
        }
        ensure!(
            deleted.elapsed() < Duration::from_secs(60),
            "60 s after deleting the ValkeyCluster, still present: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "MEASURE ValkeyCluster delete → owned objects gone: {:.1}s",
        gone_after.as_secs_f64()
    );
    // The user's own Secret is not owned by the cluster and stays.
    Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("{name}-app"))
        .await?;

    // Both controllers report their passes in the operator's metrics.
    let text = fx.metrics();
    for c in ["valkeycluster", "valkeynode"] {
        ensure!(
            text.contains(&format!(
                "valkey_operator_reconciles_total{{controller=\"{c}\"}}"
            )),
            "no reconcile count for {c}: {text}"
        );
    }

    fx.stop().await;
    Ok(())
}
