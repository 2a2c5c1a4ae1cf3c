//! A small test world for the planners and the status analysis: nodes numbered 1.., each at a
//! position, with a role, slots and a failure flag, and who knows whom.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use valkey_ops::model::{ClusterNodes, Version};
use valkey_ops::{Layout, Member, NodeView, Topology};

/// Builds a `CLUSTER NODES` line.
fn line(id: &str, ip: &str, flags: &str, primary: &str, slots: &str) -> String {
    format!("{id} {ip}:6379@16379 {flags} {primary} 0 0 1 connected {slots}")
}

/// Node id of node `n`.
pub fn id(n: u32) -> String {
    format!("{n:040x}")
}

/// Pod IP of node `n`.
pub fn ip(n: u32) -> String {
    format!("10.0.0.{n}")
}

/// Address of node `n`.
pub fn addr(n: u32) -> SocketAddr {
    format!("10.0.0.{n}:6379").parse().expect("address")
}

/// A node of the test world: number, shard, index, role (primary id or none), slots.
#[derive(Clone)]
pub struct N {
    pub n: u32,
    pub shard: i32,
    pub index: i32,
    pub primary_of: Option<u32>,
    pub slots: &'static str,
    pub fail: bool,
}

/// Node `n` at (`shard`, `index`), a primary without slots.
pub fn node(n: u32, shard: i32, index: i32) -> N {
    N {
        n,
        shard,
        index,
        primary_of: None,
        slots: "",
        fail: false,
    }
}

/// Node `n`'s pod at (`shard`, `index`) that the operator cannot reach; `refused`: its port
/// refuses connections (no server process).
pub fn unreachable(n: u32, shard: i32, index: i32, refused: bool) -> Member {
    Member {
        shard,
        index,
        pod: format!("pod-{shard}-{index}"),
        addr: addr(n),
        view: None,
        refused,
        auth_refused: None,
        error: Some(if refused {
            format!("connection to {} refused", addr(n))
        } else {
            format!("timeout talking to {}", addr(n))
        }),
    }
}

/// 2 shards × 2 replicas, formed: nodes 1 and 4 own half the slots each, 2, 3 replicate 1 and
/// 5, 6 replicate 4.
pub fn formed22() -> Vec<N> {
    let mut n = unjoined(2, 3);
    n[0].slots = "0-8191";
    n[3].slots = "8192-16383";
    for (r, p) in [(1, 1), (2, 1), (4, 4), (5, 4)] {
        n[r].primary_of = Some(p);
    }
    n
}

/// The members of a world, to modify.
pub fn members(t: &Topology) -> Vec<Member> {
    t.members().to_vec()
}

/// Every node knows the nodes listed in `known` (plus itself). Failed nodes are not members.
pub fn world(nodes: &[N], known: &[u32]) -> Topology {
    Topology::new(
        nodes
            .iter()
            .filter(|x| !x.fail)
            .map(|x| {
                let mut text = String::new();
                for y in nodes {
                    let me = y.n == x.n;
                    let linked = known.contains(&y.n) && known.contains(&x.n);
                    if !me && !linked {
                        continue;
                    }
                    let role = if y.primary_of.is_some() {
                        "slave"
                    } else {
                        "master"
                    };
                    let mut flags = if me {
                        format!("myself,{role}")
                    } else {
                        role.to_owned()
                    };
                    if y.fail {
                        flags.push_str(",fail");
                    }
                    let primary = y.primary_of.map_or("-".to_owned(), id);
                    text.push_str(&line(&id(y.n), &ip(y.n), &flags, &primary, y.slots));
                    text.push('\n');
                }
                let mut view = NodeView::from_nodes(ClusterNodes::parse(&text).expect("nodes"));
                view.cluster_ok = true;
                view.primary_link_up = x
                    .primary_of
                    .is_some_and(|p| nodes.iter().any(|y| y.n == p && !y.fail));
                view.repl_offset = i64::from(x.n) * 10;
                view.link_down_since = x.primary_of.map(|_| 1);
                view.version = Some(Version::new(9, 1, 0));
                Member {
                    shard: x.shard,
                    index: x.index,
                    pod: format!("pod-{}-{}", x.shard, x.index),
                    addr: addr(x.n),
                    refused: false,
                    auth_refused: None,
                    error: None,
                    view: Some(view),
                }
            })
            .collect(),
    )
}

/// 3 shards × 1 replica.
pub const D31: Layout = Layout {
    shards: 3,
    replicas: 1,
};

/// 3 × 1, nothing joined: node 2k+1 at (k, 0), 2k+2 at (k, 1).
pub fn fresh31() -> Vec<N> {
    unjoined(3, 2)
}

/// `shards` × `per_shard` nodes, nothing joined, numbered from 1 in shard and index order.
fn unjoined(shards: i32, per_shard: i32) -> Vec<N> {
    (0..shards)
        .flat_map(|s| (0..per_shard).map(move |i| (s, i)))
        .zip(1..)
        .map(|((s, i), n)| node(n, s, i))
        .collect()
}

/// 3 × 1, formed: the index-0 nodes own the initial plan, the index-1 nodes replicate them.
pub fn formed31() -> Vec<N> {
    let mut n = fresh31();
    n[0].slots = "0-5460";
    n[2].slots = "5461-10922";
    n[4].slots = "10923-16383";
    n[1].primary_of = Some(1);
    n[3].primary_of = Some(3);
    n[5].primary_of = Some(5);
    n
}

/// 3 × 1 after a coordinated failover in shard 0: node 2 (index 1) owns the slots, node 1
/// replicates it.
pub fn failed_over31() -> Vec<N> {
    let mut n = formed31();
    n[0].slots = "";
    n[0].primary_of = Some(2);
    n[1].slots = "0-5460";
    n[1].primary_of = None;
    n
}

/// 3 × 1 after shard 0's primary (node 1) died and its replica (node 2) took over.
pub fn taken_over31() -> Vec<N> {
    let mut n = formed31();
    n[0].fail = true;
    n[0].slots = "";
    n[1].slots = "0-5460";
    n[1].primary_of = None;
    n
}

/// The IPs of nodes 1..=`upto` but `except`.
pub fn ips(except: u32, upto: u32) -> BTreeSet<IpAddr> {
    (1..=upto)
        .filter(|n| *n != except)
        .map(|n| ip(n).parse().expect("ip"))
        .collect()
}
