//! End-to-end (needs root): what a user can get wrong does not break a running cluster, on
//! localkube with real Valkey pods, four clusters at once in one environment.
//!
//! 1. Config poison (`poison`, 1 × 1 on `valkey/valkey:8.0.1`, under a `SET` + `WAIT 1`
//!    writer): an unknown key, a bad value and a key only Valkey 9 knows are each refused by
//!    the dry run: ConfigurationWarning and Degraded say `InvalidConfig` and name the line, a
//!    Warning event is published, no pod is restarted and the ValkeyNodes keep their rendered
//!    settings. The fixed config then rolls, every server runs it, and no acknowledged write is
//!    lost.
//! 2. A new cluster with a refused setting (`poison-new`, 1 × 0) creates no ValkeyNode; once
//!    fixed it becomes Ready.
//! 3. PVC growth on a StorageClass without `allowVolumeExpansion` (`fixed`, 1 × 1): the
//!    ValkeyNodes report `PersistentVolumeClaimResizeInfeasible`, the cluster
//!    ConfigurationWarning/Degraded `ResizeInfeasible`, and a pod-template change made in the
//!    same edit still rolls.
//! 5. Users that cannot break the cluster (`users`, 1 × 1 on the default Valkey 9 image): a
//!    user whose rules Valkey refuses (`+nosuchcommand`, checked by a server of the cluster on
//!    a disabled scratch user) and a user whose password Secret does not exist are held out of
//!    the ACL file, named in Ready=False `UsersACLError` and one Warning event, while a third
//!    new user is created in the same edit; a restarted pod loads the file; a user whose Secret
//!    goes missing keeps its previous password; once fixed the cluster is Ready.
//! 4. No log spam: while `fixed` and `poison-new` are stuck, each logs at most one line in a
//!    minute after its first ones (lines counted per cluster by the operator's log filter).
//!
//! Measured times are printed as `MEASURE …` lines. `RUST_LOG=info` prints the operator's logs.

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use support::*;
use valkey_api::ValkeyCluster;
use valkey_api::status::{condition, node_condition, node_reason, reason};

const PW: &str = "robust-pw";

/// The rendered config hash of every ValkeyNode of the cluster.
async fn config_hashes(client: &Client, name: &str) -> anyhow::Result<Vec<Option<String>>> {
    Ok(valkey_nodes_of(client, name)
        .await?
        .iter()
        .map(|n| n.spec.config.hash.clone())
        .collect())
}

/// Config-check pods still present for cluster `name`.
async fn check_pods(client: &Client, name: &str) -> anyhow::Result<Vec<String>> {
    Ok(Api::<Pod>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={name},app.kubernetes.io/component=config-check"
        )))
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// Waits until ConfigurationWarning is True with `reason` and a message containing `needle`.
async fn wait_warning(
    client: &Client,
    name: &str,
    reason: &str,
    needle: &str,
) -> anyhow::Result<ValkeyCluster> {
    wait_cluster(
        client,
        name,
        &format!("{reason} naming {needle:?}"),
        Duration::from_secs(120),
        |vc| {
            condition_true(vc, condition::CONFIGURATION_WARNING)
                .is_some_and(|(r, m)| r == reason && m.contains(needle))
        },
    )
    .await
}

/// Scenario 1.
async fn config_poison(client: &Client, name: &str) -> anyhow::Result<()> {
    let ready = wait_ready(client, name, 1, Duration::from_secs(300)).await?;
    ensure!(
        ready
            .status
            .as_ref()
            .and_then(|s| s.accepted_config.as_ref())
            .is_some(),
        "{name}: no acceptedConfig once Ready"
    );
    let pods0 = pod_identities(client, name).await?;
    let hashes0 = config_hashes(client, name).await?;
    let writer = Writer::start(client, name, PW, 1);
    let mut previous: Vec<String> = vec!["hz".into()];
    for (config, needle) in [
        (
            serde_json::json!({"hz": "10", "no-such-setting": "yes"}),
            "no-such-setting",
        ),
        (
            serde_json::json!({"hz": "10", "maxmemory": "lots"}),
            "maxmemory lots",
        ),
        (
            serde_json::json!({"hz": "10", "cluster-databases": "2"}),
            "cluster-databases",
        ),
    ] {
        // A merge patch keeps keys it does not name: remove the previous bad key explicitly.
        let mut patch = config.clone();
        for k in &previous {
            patch
                .as_object_mut()
                .context("object")?
                .entry(k.clone())
                .or_insert(serde_json::Value::Null);
        }
        previous = config
            .as_object()
            .context("object")?
            .keys()
            .cloned()
            .collect();
        let t = Instant::now();
        patch_spec(client, name, serde_json::json!({ "config": patch })).await?;
        let vc = wait_warning(client, name, reason::INVALID_CONFIG, needle).await?;
        eprintln!(
            "MEASURE {name}: {needle:?} refused in {:.1}s",
            t.elapsed().as_secs_f64()
        );
        let degraded = condition_true(&vc, condition::DEGRADED);
        ensure!(
            degraded
                .as_ref()
                .is_some_and(|(r, _)| r == reason::INVALID_CONFIG),
            "{name}: Degraded {degraded:?}"
        );
        ensure!(
            vc.status
                .as_ref()
                .and_then(|s| s.rejected_config.as_ref())
                .is_some(),
            "{name}: no rejectedConfig"
        );
        // Nothing rolled, nothing rendered with the refused line.
        ensure!(
            pod_identities(client, name).await? == pods0,
            "{name}: pods changed after {needle:?}"
        );
        ensure!(
            config_hashes(client, name).await? == hashes0,
            "{name}: ValkeyNodes re-rendered after {needle:?}"
        );
        wait_settled_list("check pods deleted", || check_pods(client, name)).await?;
    }
    // Events are published right after the status is written.
    wait_settled_list("an InvalidConfig event per refusal", || async {
        let n = event_count(client, name, reason::INVALID_CONFIG, "Warning").await?;
        Ok(if n >= 3 {
            vec![]
        } else {
            vec![format!("{n} events")]
        })
    })
    .await?;

    // The fix rolls and every server runs it.
    let t = Instant::now();
    let mut fixed = serde_json::json!({"hz": "20"});
    for k in previous.iter().filter(|k| *k != "hz") {
        fixed[k.as_str()] = serde_json::Value::Null;
    }
    patch_spec(client, name, serde_json::json!({ "config": fixed })).await?;
    let vc = wait_cluster(
        client,
        name,
        "Ready with hz 20",
        Duration::from_secs(300),
        |vc| {
            vc.status.as_ref().is_some_and(|s| {
                s.state == valkey_api::status::ClusterState::Ready
                    && s.accepted_config
                        .as_ref()
                        .and_then(|a| a.config.as_ref())
                        .and_then(|c| c.get("hz"))
                        == Some(&"20".to_owned())
            })
        },
    )
    .await?;
    eprintln!(
        "MEASURE {name}: fixed config rolled to Ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    // The only warning left is the one about the app user's rules (`+@all` may change ACLs).
    let left = condition_true(&vc, condition::CONFIGURATION_WARNING);
    ensure!(
        left.as_ref()
            .is_none_or(|(r, _)| r == valkey_api::status::reason::USER_CAN_CHANGE_ACLS),
        "{name}: warning left: {left:?}"
    );
    ensure!(
        vc.status
            .as_ref()
            .and_then(|s| s.rejected_config.as_ref())
            .is_none(),
        "{name}: rejectedConfig left"
    );
    ensure!(
        pod_identities(client, name).await? != pods0,
        "{name}: the fixed config did not roll"
    );
    // The servers' pods: the fix's config-check pod may still be on its way out (no IP).
    let servers = pods_of(client, name).await?.into_iter().filter(|p| {
        p.labels()
            .get(valkey_api::labels::APP_COMPONENT)
            .map(String::as_str)
            != Some(valkey_api::labels::COMPONENT_CONFIG_CHECK)
    });
    for p in servers {
        let ip = pod_ip(&p).context("pod IP")?;
        let mut c = node_conn(&ip, "app", PW).await?;
        let hz: Vec<String> = query_cmd(&mut c, &["CONFIG", "GET", "hz"]).await?;
        ensure!(
            hz.get(1).map(String::as_str) == Some("20"),
            "{}: hz {hz:?}",
            p.name_any()
        );
    }
    let (acked, gap) = writer
        .stop_and_check(client, name, PW, "refused configs and the fixed roll")
        .await?;
    eprintln!(
        "MEASURE {name}: {acked} acknowledged writes, none lost; longest write gap {:.2}s",
        gap.as_secs_f64()
    );
    Ok(())
}

/// Polls `pending` until it is empty (30 s at most).
async fn wait_settled_list<F, Fut>(what: &str, mut pending: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<String>>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = pending().await?;
        if left.is_empty() {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{what}: still {left:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Log lines of cluster `name` during one minute of being stuck (after its first ones).
async fn lines_in_a_minute(name: &str) -> u64 {
    let key = format!("{NS}/{name}");
    // Let the transition's lines be written first.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = valkey_operator::telemetry::lines_logged(&key);
    tokio::time::sleep(Duration::from_secs(60)).await;
    valkey_operator::telemetry::lines_logged(&key) - before
}

/// Scenario 2 (+ its part of 4).
async fn new_cluster_refused(client: &Client, name: &str) -> anyhow::Result<()> {
    wait_warning(client, name, reason::INVALID_CONFIG, "no-such-setting").await?;
    ensure!(
        valkey_nodes_of(client, name).await?.is_empty(),
        "{name}: ValkeyNodes created for a refused config"
    );
    let lines = lines_in_a_minute(name).await;
    eprintln!("MEASURE {name}: {lines} log lines in a minute while refused");
    ensure!(
        lines <= 1,
        "{name}: {lines} log lines in a minute while stuck"
    );
    ensure!(
        valkey_nodes_of(client, name).await?.is_empty(),
        "{name}: ValkeyNodes created later"
    );
    patch_spec(
        client,
        name,
        serde_json::json!({"config": {"no-such-setting": null, "hz": "15"}}),
    )
    .await?;
    let t = Instant::now();
    wait_ready(client, name, 1, Duration::from_secs(300)).await?;
    eprintln!(
        "MEASURE {name}: fixed -> Ready in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Scenario 3 (+ its part of 4).
/// Whether `user` authenticates with `password` on every pod of cluster `name`.
async fn authenticates_as(
    client: &Client,
    name: &str,
    user: &str,
    password: &str,
) -> anyhow::Result<Vec<bool>> {
    authenticates(
        client,
        name,
        &valkey_ops::client::ClientConfig::new(user, password),
    )
    .await
}

/// Whether Ready is False with `UsersACLError` and a message containing every one of `needles`.
fn users_held(vc: &ValkeyCluster, needles: &[&str]) -> bool {
    vc.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == condition::READY
                && c.status == "False"
                && c.reason == reason::USERS_ACL_ERROR
                && needles.iter().all(|n| c.message.contains(n))
        })
    })
}

/// Scenario 5.
async fn users_cannot_break(client: &Client, name: &str) -> anyhow::Result<()> {
    wait_ready(client, name, 1, Duration::from_secs(300)).await?;
    let pods = pod_identities(client, name).await?;
    let secret = format!("{name}-app");
    let user = |n: &str, extra: serde_json::Value| {
        let mut u = serde_json::json!({"name": n});
        if let (Some(u), Some(e)) = (u.as_object_mut(), extra.as_object()) {
            u.extend(e.clone());
        }
        u
    };
    let app = user(
        "app",
        serde_json::json!({"passwordSecret": {"name": secret, "keys": ["password"]}, "permissions": "+@all ~* &*"}),
    );
    let reader = user(
        "reader",
        serde_json::json!({"passwordSecret": {"name": secret, "keys": ["password"]},
                           "commands": {"allow": ["@read", "@connection"]}, "keys": {"readOnly": ["*"]}}),
    );
    let bad = user(
        "bad",
        serde_json::json!({"passwordSecret": {"name": secret, "keys": ["password"]}, "permissions": "+nosuchcommand ~*"}),
    );
    let ghost = user(
        "ghost",
        serde_json::json!({"passwordSecret": {"name": "no-such-secret", "keys": ["password"]}, "permissions": "+get"}),
    );
    let started = Instant::now();
    patch_spec(
        client,
        name,
        serde_json::json!({"users": [app.clone(), reader, bad, ghost]}),
    )
    .await?;
    let vc = wait_cluster(
        client,
        name,
        "UsersACLError naming bad and ghost",
        Duration::from_secs(60),
        |vc| users_held(vc, &["\"bad\"", "nosuchcommand", "no-such-secret"]),
    )
    .await?;
    eprintln!(
        "MEASURE users: a refused rule and a missing Secret reported in {:.1}s: {:?}",
        started.elapsed().as_secs_f64(),
        vc.status.as_ref().and_then(|s| s.message.clone())
    );
    // The good new user is created meanwhile; the held ones are not.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !authenticates_as(client, name, "reader", PW)
        .await?
        .iter()
        .all(|ok| *ok)
    {
        ensure!(Instant::now() < deadline, "user reader was not created");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!(
        "MEASURE users: the valid new user works on every pod after {:.1}s",
        started.elapsed().as_secs_f64()
    );
    for held in ["bad", "ghost"] {
        ensure!(
            authenticates_as(client, name, held, PW)
                .await?
                .iter()
                .all(|ok| !*ok),
            "held user {held} authenticates"
        );
    }
    ensure!(
        pod_identities(client, name).await? == pods,
        "pods restarted"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        event_count(client, name, reason::USERS_ACL_ERROR, "Warning").await? == 1,
        "not exactly one UsersACLError event"
    );
    // A restarted pod loads the ACL file (Valkey refuses to start on a file it rejects).
    let replica = pods
        .keys()
        .find(|p| p.ends_with("-0-1-0") || p.contains("-0-1"))
        .context("the replica pod")?
        .clone();
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete(&replica, &Default::default())
        .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = pod_identities(client, name).await?;
        if now.get(&replica).is_some_and(|n| n.0 != pods[&replica].0)
            && authenticates_as(client, name, "reader", PW)
                .await
                .is_ok_and(|v| v.len() == 2 && v.iter().all(|ok| *ok))
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the restarted pod did not serve the users"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // app's Secret goes missing: app keeps its previous password.
    let mut moved = app.clone();
    moved["passwordSecret"]["name"] = serde_json::json!("gone-secret");
    patch_spec(client, name, serde_json::json!({"users": [moved]})).await?;
    wait_cluster(
        client,
        name,
        "app keeps its previous rules",
        Duration::from_secs(60),
        |vc| users_held(vc, &["gone-secret", "keeps its previous rules"]),
    )
    .await?;
    ensure!(
        authenticates_as(client, name, "app", PW)
            .await?
            .iter()
            .all(|ok| *ok),
        "app lost its password"
    );
    patch_spec(client, name, serde_json::json!({"users": [app]})).await?;
    wait_ready(client, name, 1, Duration::from_secs(60)).await?;
    ensure!(
        authenticates_as(client, name, "reader", PW)
            .await?
            .iter()
            .all(|ok| !*ok),
        "the removed user reader still authenticates"
    );
    Ok(())
}

async fn resize_infeasible(client: &Client, name: &str) -> anyhow::Result<()> {
    wait_ready(client, name, 1, Duration::from_secs(300)).await?;
    let pods0 = pod_identities(client, name).await?;
    patch_spec(
        client,
        name,
        serde_json::json!({
            "persistence": {"size": "2Gi"},
            "resources": {"requests": {"cpu": "50m"}}
        }),
    )
    .await?;
    let t = Instant::now();
    let vc = wait_warning(client, name, reason::RESIZE_INFEASIBLE, "cannot grow").await?;
    eprintln!(
        "MEASURE {name}: ResizeInfeasible reported in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    ensure!(
        condition_true(&vc, condition::DEGRADED)
            .is_some_and(|(r, _)| r == reason::RESIZE_INFEASIBLE),
        "{name}: not Degraded ResizeInfeasible"
    );
    for vn in valkey_nodes_of(client, name).await? {
        let c = vn
            .status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == node_condition::PVC_SIZE_READY)
            })
            .with_context(|| format!("{}: no size condition", vn.name_any()))?;
        ensure!(
            c.status == "False" && c.reason == node_reason::PVC_RESIZE_INFEASIBLE,
            "{}: {} {} {}",
            vn.name_any(),
            c.status,
            c.reason,
            c.message
        );
        let node = vn.name_any();
        wait_settled_list("a ResizeInfeasible event", || async {
            let n = event_count(client, &node, reason::RESIZE_INFEASIBLE, "Warning").await?;
            Ok(if n == 1 {
                vec![]
            } else {
                vec![format!("{n} events")]
            })
        })
        .await?;
    }
    // The template change of the same edit still rolls.
    wait_cluster(
        client,
        name,
        "the roll with cpu 50m",
        Duration::from_secs(300),
        |vc| vc.status.as_ref().is_some_and(|s| s.ready_shards == 1),
    )
    .await?;
    wait_settled_list("pods with cpu 50m", || async {
        let pods = pods_of(client, name).await?;
        Ok(pods
            .iter()
            .filter(|p| {
                let cpu = p.spec.as_ref().and_then(|s| {
                    s.containers
                        .iter()
                        .find(|c| c.name == valkey_api::defaults::SERVER_CONTAINER)?
                        .resources
                        .as_ref()?
                        .requests
                        .as_ref()?
                        .get("cpu")
                        .cloned()
                });
                cpu.map(|q| q.0) != Some("50m".into()) || p.metadata.deletion_timestamp.is_some()
            })
            .map(ResourceExt::name_any)
            .collect())
    })
    .await?;
    wait_cluster(
        client,
        name,
        "Ready shards after the roll",
        Duration::from_secs(300),
        |vc| {
            vc.status.as_ref().is_some_and(|s| {
                s.ready_shards == 1 && s.state == valkey_api::status::ClusterState::Degraded
            })
        },
    )
    .await?;
    ensure!(
        pod_identities(client, name).await? != pods0,
        "{name}: the template change did not roll"
    );
    for pvc in pvcs_of(client, name).await? {
        let req = pvc.spec.as_ref().and_then(|s| {
            s.resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")
                .cloned()
        });
        ensure!(
            req.map(|q| q.0) == Some("1Gi".into()),
            "{}: request changed",
            pvc.name_any()
        );
    }
    let lines = lines_in_a_minute(name).await;
    eprintln!("MEASURE {name}: {lines} log lines in a minute while the resize is infeasible");
    ensure!(
        lines <= 1,
        "{name}: {lines} log lines in a minute while stuck"
    );
    Ok(())
}

/// A StorageClass like localkube's default one, without `allowVolumeExpansion`.
async fn fixed_size_class(client: &Client) -> anyhow::Result<String> {
    let api: Api<StorageClass> = Api::all(client.clone());
    let default = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .next()
        .context("no StorageClass")?;
    let fixed = StorageClass {
        metadata: kube::api::ObjectMeta {
            name: Some("fixed-size".into()),
            ..Default::default()
        },
        provisioner: default.provisioner.clone(),
        volume_binding_mode: default.volume_binding_mode.clone(),
        reclaim_policy: Some("Delete".into()),
        allow_volume_expansion: None,
        ..Default::default()
    };
    api.create(&PostParams::default(), &fixed).await?;
    Ok("fixed-size".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_config_poison_resize_infeasible_and_log_volume() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = fx.client.clone();
    let class = fixed_size_class(&client).await?;
    let (poison, fresh, fixed, users) = ("poison", "poison-new", "fixed", "users");
    for n in [poison, fresh, fixed, users] {
        create_user_secret(&client, &format!("{n}-app"), PW).await?;
    }
    create_cluster_with(
        &client,
        poison,
        1,
        1,
        serde_json::json!({"image": "valkey/valkey:8.0.1", "config": {"hz": "10"}}),
    )
    .await?;
    create_cluster_with(
        &client,
        fresh,
        1,
        0,
        serde_json::json!({"config": {"no-such-setting": "1"}}),
    )
    .await?;
    create_cluster_with(
        &client,
        fixed,
        1,
        1,
        serde_json::json!({"persistence": {"size": "1Gi", "storageClassName": class}}),
    )
    .await?;
    create_cluster(&client, users, 1, 1).await?;
    let (r1, r2, r3, r4) = tokio::join!(
        config_poison(&client, poison),
        new_cluster_refused(&client, fresh),
        resize_infeasible(&client, fixed),
        users_cannot_break(&client, users),
    );
    r1.context("config poison")?;
    r2.context("new cluster with a refused setting")?;
    r3.context("resize infeasible")?;
    r4.context("users that cannot break the cluster")?;
    fx.stop().await;
    eprintln!("MEASURE test wall time: {:.1}s", t0.elapsed().as_secs_f64());
    Ok(())
}
