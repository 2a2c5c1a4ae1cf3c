//! The topology loop of the ValkeyCluster controller (observe → plan → act) driven against
//! real `valkey-server` 9 processes on loopback (the `valkey-testkit` harness): a 3×1 cluster
//! forms from six fresh nodes; after its shard-0 primary dies, Valkey fails over and a
//! replacement node (new id) in the dead position is attached as a replica while the dead id
//! is forgotten.

use std::time::{Duration, Instant};

use valkey_operator::cluster::plan::shards::analyze;
use valkey_operator::cluster::plan::{self, FailoverTiming};
use valkey_operator::cluster::steps::Step;
use valkey_operator::cluster::steps::{self, Actor};
use valkey_ops::client::NodePool;
use valkey_ops::commands::{Position, observe_topology};
use valkey_ops::{Layout, Topology};
use valkey_testkit::{Flavor, Server, operator_pool};

/// A server at a position of the layout.
struct Placed {
    shard: i32,
    index: i32,
    server: Server,
}

fn start(shard: i32, index: i32) -> Placed {
    Placed {
        shard,
        index,
        server: Server::start(Flavor::V9, None),
    }
}

/// The step of the production planner for the live view `m` (every server on loopback, so
/// the pods' IPs are one: a dead primary waits for Valkey's own failure detection).
fn next_step(d: Layout, m: &Topology) -> Option<Step> {
    let pod_ips = std::collections::BTreeSet::from([std::net::IpAddr::from([127, 0, 0, 1])]);
    plan::plan(&plan::Input {
        layout: d,
        topology: m,
        pod_ips: &pod_ips,
        terminating: &Default::default(),
        nodes: &[],
        desired_nodes: &[],
        timing: FailoverTiming::default(),
        now: k8s_openapi::jiff::Timestamp::now(),
        failback: None,
        previous_shards: &[],
    })
    .step
}

async fn observe(pool: &NodePool, servers: &[Placed]) -> Topology {
    let positions = servers
        .iter()
        .map(|p| Position {
            shard: p.shard,
            index: p.index,
            pod: format!("pod-{}-{}", p.shard, p.index),
            addr: p.server.addr().parse().expect("address"),
        })
        .collect();
    observe_topology(pool, positions).await
}

/// Runs passes until the topology is complete and healthy; returns the number of steps.
async fn converge(pool: &NodePool, servers: &[Placed], d: Layout, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    let actor = Actor { pool, nodes: None };
    let mut steps = 0;
    loop {
        let m = observe(pool, servers).await;
        if let Some(step) = next_step(d, &m) {
            let out = steps::execute(&actor, &step).await;
            assert!(out.failure.is_none(), "{step:?} failed: {:?}", out.failure);
            if out.acted {
                steps += 1;
                eprintln!("step {}: {:?}", step.kind(), out.events);
            }
        } else {
            let (facts, _) = analyze(d, &m);
            if facts.ready_shards == d.shards && facts.cluster_ok && facts.slots_assigned == 16384 {
                return steps;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no convergence: {:?}",
            analyze(d, &m).0
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_3x1_and_replaces_a_dead_primary() {
    if Flavor::V9.installed().is_none() {
        eprintln!(
            "skipped: {} missing (run hack/install-deps.sh)",
            Flavor::V9.binary().display()
        );
        return;
    }
    let d = Layout {
        shards: 3,
        replicas: 1,
    };
    let mut servers: Vec<Placed> = (0..3)
        .flat_map(|s| (0..2).map(move |i| (s, i)))
        .map(|(s, i)| start(s, i))
        .collect();
    let pool = operator_pool(None);
    let t = Instant::now();
    let steps = converge(&pool, &servers, d, Duration::from_secs(60)).await;
    eprintln!(
        "formed 3x1 in {:.1}s with {steps} steps",
        t.elapsed().as_secs_f64()
    );
    let formed = observe(&pool, &servers).await;
    let (_, shards) = analyze(d, &formed);
    assert_eq!(shards[0].primary_pod.as_deref(), Some("pod-0-0"));
    assert_eq!(shards[0].slots, ["0-5460"]);
    // Formed as `valkey-cli --cluster create` does: the fresh primaries claimed their slots
    // and distinct config epochs, then met (one step), then the replicas attached (one step;
    // a replica whose handshake outlasts the step's wait attaches in the next).
    assert!(steps <= 3, "claims and MEET, then replicas: {steps} steps");
    let epochs: std::collections::BTreeSet<u64> = formed
        .members()
        .iter()
        .filter_map(|m| m.me().filter(|me| me.owns_slots()))
        .map(|me| me.config_epoch)
        .collect();
    assert_eq!(
        epochs,
        [1, 2, 3].into(),
        "each primary has an epoch of its own"
    );

    // Kill shard 0's primary; Valkey promotes its replica (node timeout 2 s).
    let dead = servers.remove(0);
    let dead_addr = dead.server.addr();
    drop(dead);
    pool.evict(&dead_addr);
    let t = Instant::now();
    loop {
        let (_, shards) = analyze(d, &observe(&pool, &servers).await);
        if shards[0].primary_pod.as_deref() == Some("pod-0-1") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("failover observed after {:.1}s", t.elapsed().as_secs_f64());

    // Replacement node (new id) at the dead position.
    servers.insert(0, start(0, 0));
    let steps = converge(&pool, &servers, d, Duration::from_secs(90)).await;
    let m = observe(&pool, &servers).await;
    let (facts, shards) = analyze(d, &m);
    assert_eq!(facts.ready_shards, 3);
    assert_eq!(shards[0].primary_pod.as_deref(), Some("pod-0-1"));
    assert!(steps >= 2, "meet + replicate expected, got {steps}");
    // The dead id is forgotten everywhere eventually (after the FAIL flag propagates).
    let actor = Actor {
        pool: &pool,
        nodes: None,
    };
    let t = Instant::now();
    loop {
        let m = observe(&pool, &servers).await;
        if let Some(step) = next_step(d, &m) {
            steps::execute(&actor, &step).await;
        }
        let known = m
            .reachable()
            .filter_map(|x| x.view.as_ref())
            .map(|v| v.nodes.len())
            .max()
            .unwrap_or(0);
        if known == 6 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "dead node still known"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
