//! End-to-end failover safety under a network partition (needs root: localkube runs pods as
//! processes in network namespaces; the partition takes a pod's veth down).
//!
//! A 3×1 cluster under a continuous writer (`SET` + `WAIT 1`): shard 0's primary is cut off
//! from everything, the operator included. The operator cannot reach it, its pod still exists
//! and does not refuse connections, so by the failover rule it is not known down: the operator
//! drives no failover and leaves the election to Valkey's majority. Once the partition heals,
//! the cut-off node rejoins as a replica (exactly one primary per shard), the cluster is Ready
//! with the full topology, and no acknowledged write is lost (the cut-off primary could not
//! have acknowledged any: its replica was unreachable). While partitioned, the status stops
//! saying Ready and names the pod it cannot reach (`PodsUnreachable`, with the timeout). The same is tried a second time from the state the first left (the primary of
//! shard 0 now at node index 1).
//!
//! A third test freezes one cluster and kills a primary of another: the other fails over as
//! fast as alone (the operator reconciles clusters concurrently, each pass bounded).
//!
//! A fourth test recycles pod IPs across clusters: on a pod network of 13 addresses, two 1×1
//! clusters (one under the writer) replace their replicas round after round until addresses
//! one cluster's pods held serve the other's, while the old pods' peers still know their node
//! ids at those addresses. Neither cluster ever lists a node of the other, both end Ready with
//! a clean `valkey-cli --cluster check`, and no acknowledged write is lost.
//!
//! A second test, two scenarios in one environment: a stale replica (its replication link down
//! for 30 s) is not promoted when its primary dies, and the status says why; a primary that
//! fails its readiness probe while its only replica is in a full sync is not rolled.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use support::*;

/// Shard 0's pod that is a primary in the live topology (not the status: the test checks the
/// status against it).
async fn live_primary_of_shard0(
    client: &kube::Client,
    name: &str,
    pw: &str,
) -> anyhow::Result<String> {
    shard_roles(client, name, 0, pw)
        .await?
        .into_iter()
        .find(|(_, _, role)| role == "master")
        .map(|(pod, _, _)| pod)
        .context("shard 0 has no live primary")
}

/// Cuts shard 0's current primary off, waits until Valkey promotes its replica while the
/// status shows the disruption, heals, waits for the full topology, and returns the cut-off pod.
async fn partition_shard0_primary(
    fx: &Fixture,
    name: &str,
    pw: &str,
    round: usize,
) -> anyhow::Result<String> {
    let client = &fx.client;
    wait_ready(client, name, 3, Duration::from_secs(180)).await?;
    let victim = live_primary_of_shard0(client, name, pw).await?;
    let faults = fx.faults()?;
    let writer = Writer::start(client, name, pw, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cut = Instant::now();
    faults.cut_network(NS, &victim)?;
    eprintln!("[round {round}] cut the network of {victim} (primary of shard 0)");
    let during = async {
        let writable = wait_writable(client, name, pw, Duration::from_secs(120)).await?;
        eprintln!(
            "MEASURE partition round {round}: all slots writable again after {:.1}s (Valkey's election)",
            writable.as_secs_f64()
        );
        // Stay partitioned until the operator's status shows the lost replica (a Ready
        // cluster is observed every 10 s): the status tells the truth.
        let api: kube::Api<valkey_api::ValkeyCluster> = kube::Api::namespaced(client.clone(), NS);
        // The operator names the pod it cannot reach while Kubernetes still reports it Ready
        // (until its readiness probe sees the cluster fail around it), with the error.
        let mut named = None;
        loop {
            let s = api.get(name).await?.status.unwrap_or_default();
            let ready = s.conditions.iter().find(|c| c.type_ == "Ready");
            if let Some(c) = ready.filter(|c| c.reason == "PodsUnreachable") {
                ensure!(
                    c.message.contains(&format!("{victim} (timeout talking to")),
                    "PodsUnreachable does not name {victim} with a timeout: {}",
                    c.message
                );
                named = Some(cut.elapsed());
                break;
            }
            if cut.elapsed() > Duration::from_secs(30) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let named = named.with_context(|| {
            format!("the status never named the unreachable {victim} (PodsUnreachable)")
        })?;
        eprintln!(
            "MEASURE partition round {round}: Ready=False PodsUnreachable naming {victim} {:.1}s after the cut",
            named.as_secs_f64()
        );
        loop {
            let s = api.get(name).await?.status.unwrap_or_default();
            if s.state != valkey_api::status::ClusterState::Ready {
                eprintln!(
                    "[round {round}] status after {:.1}s: {:?} {:?} {:?}",
                    cut.elapsed().as_secs_f64(),
                    s.state,
                    s.reason,
                    s.message
                );
                break;
            }
            ensure!(
                cut.elapsed() < Duration::from_secs(40),
                "the status still says Ready {:.0}s into the partition of {victim}",
                cut.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::Ok(())
    };
    let result = during.await;
    faults.restore_network(NS, &victim)?;
    result?;
    let healed = Instant::now();
    eprintln!("[round {round}] restored the network of {victim}");
    let recovered =
        wait_recovered(client, name, 3, 1, &[], healed, Duration::from_secs(180)).await?;
    eprintln!(
        "MEASURE partition round {round}: Ready with the full topology {:.1}s after healing ({:.1}s after the cut)",
        recovered.as_secs_f64(),
        cut.elapsed().as_secs_f64()
    );
    let (acked, gap) = writer
        .stop_and_check(client, name, pw, "the partition")
        .await?;
    eprintln!(
        "MEASURE partition round {round}: {acked} acknowledged writes kept, longest gap {:.1}s",
        gap.as_secs_f64()
    );
    check_topology(client, name, 3, 1, pw).await?;
    let now_primary = live_primary_of_shard0(client, name, pw).await?;
    ensure!(
        now_primary != victim,
        "the cut-off former primary {victim} is shard 0's primary again after healing"
    );
    Ok(victim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_partitioned_primary_is_left_to_valkeys_election() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let name = "part";
    let pw = "app-password-1";
    create_ready_cluster(&fx.client, name, pw, 3, 1).await?;

    let first = partition_shard0_primary(&fx, name, pw, 1).await?;
    let second = partition_shard0_primary(&fx, name, pw, 2).await?;
    ensure!(
        first != second,
        "round 2 cut the same pod ({first}): shard 0's primary did not move in round 1"
    );
    eprintln!("rounds: cut {first}, then {second}");
    ensure_no_forced_failover(&fx, "of a primary that was only partitioned")?;
    fx.stop().await;
    Ok(())
}

/// `INFO replication` of the pod at `ip` as user `app`.
async fn replication_info(ip: &str, pw: &str) -> anyhow::Result<String> {
    let mut c = node_conn(ip, "app", pw).await?;
    Ok(redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut c)
        .await?)
}

/// A stale replica is not promoted. Shard 0's replica stays reachable but its replication link
/// is broken (a wrong primary password, then its link dropped) while writes go on; Valkey's
/// own election is held back for such a replica too (`cluster-replica-validity-factor 1`).
/// Once the link has been down for 30 s, well past the operator's staleness bound
/// (`cluster-node-timeout`, 5 s), the primary's server is killed: for 30 s the replica is not
/// promoted, the operator drives no failover, and the status says why ("no failover for
/// shard 0: ... every replica lost its link more than the staleness bound ...").
async fn stale_replica_is_not_promoted(fx: &Fixture) -> anyhow::Result<()> {
    let client = &fx.client;
    let name = "stale";
    let pw = "app-password-2";
    let extra = serde_json::json!({"config": {"cluster-replica-validity-factor": "1"}});
    create_ready_cluster_with(client, name, pw, 3, 1, extra).await?;
    let roles = shard_roles(client, name, 0, pw).await?;
    let primary = live_primary_of_shard0(client, name, pw).await?;
    let (replica, replica_ip) = roles
        .iter()
        .find(|(_, _, role)| role == "slave")
        .map(|(pod, ip, _)| (pod.clone(), ip.clone()))
        .context("shard 0 has no replica")?;

    // Break the replica's link: it cannot authenticate to its primary any more.
    let mut r = node_conn(&replica_ip, "app", pw).await?;
    let _: () = query_cmd(
        &mut r,
        &["CONFIG", "SET", "primaryauth", "not-the-password"],
    )
    .await?;
    let _: i64 = query_cmd(&mut r, &["CLIENT", "KILL", "TYPE", "master"]).await?;
    write_read(&mut cluster_client(client, name, pw).await?, 500, "missed").await?;
    let broken = Instant::now();
    loop {
        let info = replication_info(&replica_ip, pw).await?;
        let down_for: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("master_link_down_since_seconds:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if info.contains("master_link_status:down") && down_for >= 30 {
            break;
        }
        ensure!(
            broken.elapsed() < Duration::from_secs(60),
            "the replica's link is not down for 30 s: {info}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    let killed = Instant::now();
    fx.faults()?.kill_container(NS, &primary, "server")?;
    eprintln!("killed the server of {primary}; {replica} has been stale for 30 s");
    let api: kube::Api<valkey_api::ValkeyCluster> = kube::Api::namespaced(client.clone(), NS);
    let mut said_why = None;
    while killed.elapsed() < Duration::from_secs(30) {
        let info = replication_info(&replica_ip, pw).await?;
        ensure!(
            info.contains("role:slave"),
            "the stale replica {replica} was promoted {:.1}s after the kill",
            killed.elapsed().as_secs_f64()
        );
        let status = api.get(name).await?.status.unwrap_or_default();
        let formed = status
            .conditions
            .iter()
            .find(|c| c.type_ == "ClusterFormed")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        if said_why.is_none()
            && formed.starts_with("no failover for shard 0")
            && formed.contains("staleness bound")
        {
            eprintln!(
                "MEASURE stale replica: status says why {:.1}s after the kill: {formed}",
                killed.elapsed().as_secs_f64()
            );
            said_why = Some(formed);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(
        said_why.is_some(),
        "the status never said why shard 0 has no writer"
    );
    Ok(())
}

/// A primary that fails its readiness probe while its only replica is in a full sync is not
/// rolled: a 1 × 0 cluster is scaled to 1 replica and given a new pod template in one edit,
/// while the primary holds the new replica's full sync back (`repl-diskless-sync-delay`) and
/// its readiness probe fails (its probe user switched off). For 30 s the primary's pod stays
/// and its roll is not authorized; once the probe passes and the sync completes, the roll
/// hands the primary over and finishes, with every acknowledged write kept.
async fn unready_primary_is_not_rolled_during_a_full_sync(fx: &Fixture) -> anyhow::Result<()> {
    let client = &fx.client;
    let name = "unready";
    let pw = "app-password-3";
    create_ready_cluster(client, name, pw, 1, 0).await?;
    let mut conn = cluster_client(client, name, pw).await?;
    write_read(&mut conn, 2_000, "u").await?;
    let pod = pods_of(client, name).await?.pop().context("no pod")?;
    let (primary, ip) = (
        pod.metadata.name.clone().unwrap_or_default(),
        pod_ip(&pod).context("pod IP")?,
    );
    let uid = pod.metadata.uid.clone();
    let mut p = node_conn(&ip, "app", pw).await?;
    let _: () = query_cmd(
        &mut p,
        &["CONFIG", "SET", "repl-diskless-sync-delay", "600"],
    )
    .await?;
    let _: () = query_cmd(&mut p, &["ACL", "SETUSER", "_exporter", "off"]).await?;
    let nodes: kube::Api<valkey_api::ValkeyNode> = kube::Api::namespaced(client.clone(), NS);
    let node = format!("{name}-0-0");
    let deadline = Instant::now() + Duration::from_secs(60);
    while nodes.get(&node).await?.status.is_some_and(|s| s.ready) {
        ensure!(
            Instant::now() < deadline,
            "{node} stays ready with its probe user off"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    patch_spec(
        client,
        name,
        serde_json::json!({"replicas": 1, "resources": {"requests": {"cpu": "30m"}}}),
    )
    .await?;
    let held = Instant::now();
    let mut syncing_seen = false;
    let revision = nodes.get(&node).await?.spec.workload_revision;
    while held.elapsed() < Duration::from_secs(30) {
        let now = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
            .get_opt(&primary)
            .await?;
        ensure!(
            now.as_ref()
                .is_some_and(|p| p.metadata.uid == uid && p.metadata.deletion_timestamp.is_none()),
            "the not-ready primary {primary} was rolled {:.1}s into its replica's full sync",
            held.elapsed().as_secs_f64()
        );
        ensure!(
            nodes.get(&node).await?.spec.workload_revision == revision,
            "the roll of the not-ready primary was authorized during the full sync"
        );
        let info: String = query_cmd(&mut p, &["INFO", "replication"]).await?;
        syncing_seen |= info.contains("state=wait_bgsave");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(
        syncing_seen,
        "the new replica never waited for its full sync"
    );
    eprintln!(
        "the not-ready primary {primary} stayed for 30 s while its replica waited for a full sync"
    );

    let _: () = query_cmd(&mut p, &["ACL", "SETUSER", "_exporter", "on"]).await?;
    let _: () = query_cmd(&mut p, &["CONFIG", "SET", "repl-diskless-sync-delay", "0"]).await?;
    let released = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let gone = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
            .get_opt(&primary)
            .await?
            .is_none_or(|p| p.metadata.uid != uid);
        if gone {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the primary {primary} was never rolled"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_ready(client, name, 1, Duration::from_secs(240)).await?;
    eprintln!(
        "MEASURE unready primary: rolled and Ready {:.1}s after the probe and the sync were released",
        released.elapsed().as_secs_f64()
    );
    check_topology(client, name, 1, 1, pw).await?;
    check_acked(
        &mut cluster_client(client, name, pw).await?,
        2_000,
        "u",
        "the held roll",
    )
    .await?;
    Ok(())
}

/// Both scenarios share one environment (different clusters).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_stale_replica_and_unready_primary() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let (stale, unready) = tokio::join!(
        stale_replica_is_not_promoted(&fx),
        unready_primary_is_not_rolled_during_a_full_sync(&fx)
    );
    stale.context("stale replica")?;
    unready.context("not-ready primary during a full sync")?;
    ensure_no_forced_failover(&fx, "(to a stale replica)")?;
    fx.stop().await;
    Ok(())
}

/// Fails when the operator's metrics count a failover it drove; `what` completes the message
/// ("the operator forced a failover <what>").
fn ensure_no_forced_failover(fx: &Fixture, what: &str) -> anyhow::Result<()> {
    let metrics = fx.metrics();
    ensure!(
        !metrics.contains("kind=\"Failover\""),
        "the operator forced a failover {what}:\n{metrics}"
    );
    Ok(())
}

/// Clusters do not wait for each other: every pod of cluster `slow` is frozen (each of its
/// passes waits for timeouts) and the primary of cluster `fast`'s shard 0 is killed at the
/// same moment. `fast` fails over and is Ready with its full topology as quickly as alone,
/// with no acknowledged write lost; `slow` recovers once its pods run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_a_stuck_cluster_does_not_delay_anothers_failover() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start().await? else {
        return Ok(());
    };
    let client = &fx.client;
    let pw = "app-password-3";
    let (slow, fast) = tokio::join!(
        create_ready_cluster(client, "slow", pw, 3, 1),
        create_ready_cluster(client, "fast", pw, 3, 1)
    );
    slow?;
    fast?;
    let faults = fx.faults()?;
    let frozen: Vec<String> = pods_of(client, "slow")
        .await?
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect();
    let victim = live_primary_of_shard0(client, "fast", pw).await?;
    let writer = Writer::start(client, "fast", pw, 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for pod in &frozen {
        faults.pause(NS, pod, "server")?;
    }
    let killed = Instant::now();
    faults.kill_container(NS, &victim, "server")?;
    eprintln!(
        "froze the {} servers of cluster slow, killed the server of {victim} (fast, shard 0)",
        frozen.len()
    );
    let result = async {
        let writable = wait_writable(client, "fast", pw, Duration::from_secs(60)).await?;
        let recovered =
            wait_recovered(client, "fast", 3, 1, &[], killed, Duration::from_secs(60)).await?;
        eprintln!(
            "MEASURE while another cluster is frozen: writable again {:.1}s, Ready with the full topology {:.1}s after the kill",
            writable.as_secs_f64(),
            recovered.as_secs_f64()
        );
        ensure!(
            recovered < Duration::from_secs(30),
            "fast took {:.1}s to recover next to a frozen cluster",
            recovered.as_secs_f64()
        );
        anyhow::Ok(())
    }
    .await;
    for pod in &frozen {
        faults.resume(NS, pod, "server")?;
    }
    result?;
    let (acked, gap) = writer
        .stop_and_check(client, "fast", pw, "the kill")
        .await?;
    eprintln!(
        "MEASURE next to a frozen cluster: {acked} acknowledged writes kept, longest gap {:.1}s",
        gap.as_secs_f64()
    );
    check_topology(client, "fast", 3, 1, pw).await?;
    wait_ready(client, "slow", 3, Duration::from_secs(120)).await?;
    check_topology(client, "slow", 3, 1, pw).await?;
    fx.stop().await;
    Ok(())
}

/// Node ids in the `CLUSTER NODES` of every pod of `name`, and each pod's own id.
async fn node_ids(
    client: &kube::Client,
    name: &str,
    op_pw: &str,
) -> anyhow::Result<(BTreeSet<String>, BTreeSet<String>)> {
    let (mut listed, mut own) = (BTreeSet::new(), BTreeSet::new());
    for p in pods_of(client, name).await? {
        let Some(ip) = pod_ip(&p) else { continue };
        let Ok(mut c) = node_conn(&ip, "_operator", op_pw).await else {
            continue;
        };
        let nodes: String = query_cmd(&mut c, &["CLUSTER", "NODES"]).await?;
        for l in nodes.lines() {
            let mut words = l.split(' ');
            let id = words.next().unwrap_or_default().to_owned();
            if words.nth(1).is_some_and(|f| f.contains("myself")) {
                own.insert(id.clone());
            }
            listed.insert(id);
        }
    }
    Ok((listed, own))
}

/// Pod IPs are recycled: a deleted pod's address soon serves another pod, maybe of another
/// cluster, while the old pod's peers still know its node id there. See the module docs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn operator_root_recycled_pod_ips_never_join_two_clusters() -> anyhow::Result<()> {
    let opts = localkube::Options {
        pod_cidr_prefix: Some(28),
        ..localkube::Options::default()
    };
    let Some(fx) = Fixture::start_with(opts, true).await? else {
        return Ok(());
    };
    let client = &fx.client;
    let names = ["reuse-a", "reuse-b"];
    let pw = "reuse-pw";
    tokio::try_join!(
        create_ready_cluster(client, names[0], pw, 1, 1),
        create_ready_cluster(client, names[1], pw, 1, 1),
    )?;
    let op_pw = [
        system_operator_password(client, names[0]).await?,
        system_operator_password(client, names[1]).await?,
    ];
    let writer = Writer::start(client, names[0], pw, 1);
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), NS);
    // IP -> the clusters whose pods held it; node ids each cluster's pods ever had.
    let mut held: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    let mut ids: [BTreeSet<String>; 2] = Default::default();
    let mut round = 0;
    let recycled = loop {
        for (c, name) in names.iter().enumerate() {
            for p in pods_of(client, name).await? {
                if let Some(ip) = pod_ip(&p) {
                    held.entry(ip).or_default().insert(c);
                }
            }
            let (listed, own) = node_ids(client, name, &op_pw[c]).await?;
            ids[c].extend(own);
            let other = &ids[1 - c];
            let foreign: Vec<&String> = listed.intersection(other).collect();
            ensure!(
                foreign.is_empty(),
                "round {round}: {name} lists nodes of the other cluster: {foreign:?}"
            );
        }
        let recycled = held.values().filter(|c| c.len() == 2).count();
        if recycled >= 3 || round == 14 {
            break recycled;
        }
        round += 1;
        // Replace each cluster's replica: its StatefulSet recreates the pod at the next
        // free address.
        let t = Instant::now();
        let mut old = Vec::new();
        for (c, name) in names.iter().enumerate() {
            let replica = shard_roles(client, name, 0, pw)
                .await?
                .into_iter()
                .find(|(_, _, role)| role == "slave")
                .map(|(pod, _, _)| pod)
                .with_context(|| format!("{name} has no live replica"))?;
            let uid = pods.get(&replica).await?.metadata.uid.unwrap_or_default();
            pods.delete(&replica, &Default::default()).await?;
            old.push((c, uid));
        }
        for (c, uid) in old {
            wait_recovered(client, names[c], 1, 1, &[uid], t, Duration::from_secs(120)).await?;
        }
    };
    eprintln!(
        "MEASURE recycled pod IPs: {round} rounds, {recycled} addresses served both clusters"
    );
    ensure!(
        recycled >= 3,
        "only {recycled} addresses served both clusters in {round} rounds"
    );
    let (acked, gap) = writer
        .stop_and_check(client, names[0], pw, "the recycled addresses")
        .await?;
    eprintln!(
        "MEASURE recycled pod IPs: {acked} acknowledged writes kept, longest gap {:.1}s",
        gap.as_secs_f64()
    );
    for (c, name) in names.iter().enumerate() {
        check_topology(client, name, 1, 1, pw).await?;
        matrix::cluster_check(client, name, &op_pw[c], false).await?;
    }
    Ok(())
}
