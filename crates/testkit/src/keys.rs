//! Keys: hash slots, routing by a node's view, bulk writes and read-backs, slot-move plans.

use std::collections::{BTreeMap, HashMap};

use valkey_ops::client::NodePool;
use valkey_ops::commands;
use valkey_ops::model::ClusterNodes;
use valkey_ops::slots::{SLOT_COUNT, Slot};

/// CRC16/XMODEM hash slot of a key (honouring `{hash tags}`).
pub fn key_slot(key: &[u8]) -> Slot {
    let k = match key.iter().position(|&b| b == b'{') {
        Some(s) => match key[s + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[s + 1..s + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in k {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOT_COUNT
}

/// Slot owner addresses (`ip:port`) from one node's view.
pub fn slot_owners(view: &ClusterNodes) -> HashMap<Slot, String> {
    let mut m = HashMap::new();
    for n in view.primaries() {
        for r in &n.slots {
            for s in r.iter() {
                m.insert(s, n.addr.host_port());
            }
        }
    }
    m
}

pub fn key(i: u64) -> String {
    format!("key:{i}")
}

fn value(i: u64) -> String {
    format!("value-{i}")
}

/// Groups key indices by the node owning their slot.
fn by_owner(view: &ClusterNodes, range: std::ops::Range<u64>) -> BTreeMap<String, Vec<u64>> {
    let owners = slot_owners(view);
    let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for i in range {
        let s = key_slot(key(i).as_bytes());
        m.entry(owners[&s].clone()).or_default().push(i);
    }
    m
}

/// Writes keys `0..n` (pipelined, routed by slot from `view_addr`'s view).
pub async fn write_keys(pool: &NodePool, view_addr: &str, n: u64) {
    let view = commands::cluster_nodes(pool, view_addr).await.unwrap();
    let groups = by_owner(&view, 0..n);
    futures::future::join_all(groups.into_iter().map(|(addr, idx)| async move {
        for chunk in idx.chunks(2000) {
            let mut p = redis::pipe();
            for &i in chunk {
                p.cmd("SET").arg(key(i)).arg(value(i)).ignore();
            }
            let () = pool.pipeline(&addr, &p).await.unwrap();
        }
    }))
    .await;
}

/// Reads keys `0..n` back (routed by the current view) and returns how many are missing or
/// wrong.
pub async fn count_bad_keys(pool: &NodePool, view_addr: &str, n: u64) -> u64 {
    let view = commands::cluster_nodes(pool, view_addr).await.unwrap();
    let groups = by_owner(&view, 0..n);
    let bad = futures::future::join_all(groups.into_iter().map(|(addr, idx)| async move {
        let mut bad = 0u64;
        for chunk in idx.chunks(2000) {
            let mut p = redis::pipe();
            for &i in chunk {
                p.cmd("GET").arg(key(i));
            }
            let vals: Vec<Option<String>> = pool.pipeline(&addr, &p).await.unwrap();
            bad += chunk
                .iter()
                .zip(vals)
                .filter(|(i, v)| v.as_deref() != Some(value(**i).as_str()))
                .count() as u64;
        }
        bad
    }))
    .await;
    bad.iter().sum()
}

/// Total keys over the given primaries (`DBSIZE`).
pub async fn total_keys(pool: &NodePool, primaries: &[String]) -> u64 {
    let mut t = 0;
    for p in primaries {
        let n: u64 = pool.query(p, &redis::cmd("DBSIZE")).await.unwrap();
        t += n;
    }
    t
}

/// A slot move `(source id, target id, slots)`.
pub type Move = (String, String, valkey_ops::slots::SlotSet);

/// Batches of independent moves from the crate's rebalance planner that balance `owned`
/// (id → slots) onto `targets`.
pub fn plan_batches(
    owned: &[(String, valkey_ops::slots::SlotSet)],
    targets: &[String],
    max_slots_per_batch: usize,
) -> Vec<Vec<Move>> {
    let current: std::collections::BTreeMap<String, valkey_ops::slots::SlotSet> =
        owned.iter().cloned().collect();
    let targets: std::collections::BTreeSet<String> = targets.iter().cloned().collect();
    let plan = valkey_ops::slot_plan::plan_rebalance(
        &current,
        &targets,
        max_slots_per_batch,
        valkey_ops::slot_plan::Batching::Independent,
    )
    .unwrap();
    plan.batches
        .into_iter()
        .map(|b| {
            b.into_iter()
                .map(|m| (m.source, m.target, m.slots))
                .collect()
        })
        .collect()
}

/// All moves of the planner's plan (one per source/target pair).
pub fn plan_moves(owned: &[(String, valkey_ops::slots::SlotSet)], targets: &[String]) -> Vec<Move> {
    plan_batches(owned, targets, 16384).concat()
}

/// Slots owned per primary id, from one node's view.
pub async fn owned_slots(pool: &NodePool, addr: &str) -> Vec<(String, valkey_ops::slots::SlotSet)> {
    let v = commands::cluster_nodes(pool, addr).await.unwrap();
    v.primaries()
        .filter(|n| !n.flags.failing())
        .map(|n| (n.id.clone(), n.slot_set()))
        .collect()
}
