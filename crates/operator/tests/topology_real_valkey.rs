//! The topology loop of the ValkeyCluster controller (observe → `next_step` → execute) driven
//! against real `valkey-server` 9 processes on loopback: a 3×1 cluster forms from six fresh
//! nodes; after its shard-0 primary dies, Valkey fails over and a replacement node (new id) in
//! the dead position is attached as a replica while the dead id is forgotten.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use valkey_operator::cluster::topology::{self, Desired, Member};
use valkey_operator::cluster::{act, observe};
use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::commands::{SystemUsers, observe_node, system_acl_rules};

const OPERATOR_PW: &str = "op-secret";
const REPLICATION_PW: &str = "repl-secret";

fn server_binary() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    PathBuf::from(
        std::env::var("VALKEY9_SERVER")
            .unwrap_or_else(|_| format!("{home}/.cache/valkey-operator/bin/valkey-server-9")),
    )
}

fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 50000 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
}

struct Server {
    shard: i32,
    index: i32,
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(shard: i32, index: i32) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let acl = system_acl_rules(
        &SystemUsers {
            operator_password: OPERATOR_PW,
            replication_password: REPLICATION_PW,
            exporter_password: "exp-secret",
        },
        9,
    );
    std::fs::write(dir.path().join("users.acl"), acl.join("\n") + "\n").unwrap();
    let conf = format!(
        "port {port}\nbind 127.0.0.1\ncluster-enabled yes\ncluster-config-file nodes.conf\n\
         cluster-node-timeout 2000\ncluster-allow-replica-migration no\ndir {d}\n\
         aclfile {d}/users.acl\nprimaryuser _replication\nprimaryauth {REPLICATION_PW}\n\
         save \"\"\nappendonly no\n",
        d = dir.path().display()
    );
    let conf_path = dir.path().join("valkey.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let child = Command::new(server_binary())
        .arg(&conf_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("valkey-server-9 (run hack/install-deps.sh)");
    Server {
        shard,
        index,
        port,
        child,
        _dir: dir,
    }
}

async fn members(pool: &NodePool, servers: &[Server]) -> Vec<Member> {
    let mut out = Vec::new();
    for s in servers {
        let addr = format!("127.0.0.1:{}", s.port);
        let view = observe_node(pool, &addr).await.ok().map(observe::node_view);
        out.push(Member {
            shard: s.shard,
            index: s.index,
            pod: format!("pod-{}-{}", s.shard, s.index),
            addr,
            view,
            refused: false,
        });
    }
    out
}

/// Runs passes until the topology is complete and healthy; returns the number of steps.
async fn converge(pool: &NodePool, servers: &[Server], d: Desired, timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    let mut steps = 0;
    loop {
        let m = members(pool, servers).await;
        if let Some(step) = topology::next_step(d, &m, None) {
            let out = act::execute(pool, &step).await;
            assert!(out.failure.is_none(), "{step:?} failed: {:?}", out.failure);
            if out.acted {
                steps += 1;
                eprintln!("step {}: {:?}", step.kind(), out.events);
            }
        } else {
            let (facts, _) = topology::analyze(d, &m);
            if facts.ready_shards == d.shards && facts.cluster_ok && facts.slots_assigned == 16384 {
                return steps;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no convergence: {:?}",
            topology::analyze(d, &m).0
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_3x1_and_replaces_a_dead_primary() {
    if !server_binary().exists() {
        eprintln!(
            "skipped: {} missing (run hack/install-deps.sh)",
            server_binary().display()
        );
        return;
    }
    let d = Desired {
        shards: 3,
        replicas: 1,
    };
    let mut servers: Vec<Server> = (0..3)
        .flat_map(|s| (0..2).map(move |i| (s, i)))
        .map(|(s, i)| start(s, i))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pool = NodePool::new(ClientConfig::new("_operator", OPERATOR_PW));
    let t = Instant::now();
    let steps = converge(&pool, &servers, d, Duration::from_secs(60)).await;
    eprintln!(
        "formed 3x1 in {:.1}s with {steps} steps",
        t.elapsed().as_secs_f64()
    );
    let (_, shards) = topology::analyze(d, &members(&pool, &servers).await);
    assert_eq!(shards[0].primary_pod.as_deref(), Some("pod-0-0"));
    assert_eq!(shards[0].slots, ["0-5460"]);

    // Kill shard 0's primary; Valkey promotes its replica (node timeout 2 s).
    let dead = servers.remove(0);
    let dead_addr = format!("127.0.0.1:{}", dead.port);
    drop(dead);
    pool.evict(&dead_addr);
    let t = Instant::now();
    loop {
        let (_, shards) = topology::analyze(d, &members(&pool, &servers).await);
        if shards[0].primary_pod.as_deref() == Some("pod-0-1") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no failover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("failover observed after {:.1}s", t.elapsed().as_secs_f64());

    // Replacement node (new id) at the dead position.
    servers.insert(0, start(0, 0));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let steps = converge(&pool, &servers, d, Duration::from_secs(90)).await;
    let m = members(&pool, &servers).await;
    let (facts, shards) = topology::analyze(d, &m);
    assert_eq!(facts.ready_shards, 3);
    assert_eq!(shards[0].primary_pod.as_deref(), Some("pod-0-1"));
    assert!(steps >= 2, "meet + replicate expected, got {steps}");
    // The dead id is forgotten everywhere eventually (after the FAIL flag propagates).
    let t = Instant::now();
    loop {
        let m = members(&pool, &servers).await;
        if let Some(step) = topology::next_step(d, &m, None) {
            act::execute(&pool, &step).await;
        }
        let known = m
            .iter()
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
