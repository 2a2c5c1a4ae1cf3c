//! Slot migration: atomic (`CLUSTER MIGRATESLOTS`, Valkey ≥ 9) and key-by-key
//! (`SETSLOT IMPORTING/MIGRATING` + `GETKEYSINSLOT`/`MIGRATE` + `SETSLOT NODE`, Valkey 8),
//! both resumable after an interruption.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use redis::Value;
use tracing::{debug, info};

use super::{CommandError, Result, cluster_nodes, exec, poll_until, reply_contains};
use crate::client::{self, NodeConnection, NodePool};
use crate::model::{
    ClusterNodes, MigrationOperation, MigrationState, SlotMigration, parse_slot_migrations,
};
use crate::slots::{Slot, SlotRange, SlotSet};

const POLL_INTERVAL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// Atomic slot migration (Valkey >= 9)
// ---------------------------------------------------------------------------------------------

/// Slots to move from one source primary to one target primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtomicMove {
    /// Slot ranges to move.
    pub ranges: Vec<SlotRange>,
    /// Node id of the target primary.
    pub target_id: String,
}

/// `CLUSTER GETSLOTMIGRATIONS` of the node at `addr` (Valkey >= 9).
pub async fn get_slot_migrations(pool: &NodePool, addr: &str) -> Result<Vec<SlotMigration>> {
    let v: Value = pool
        .query(addr, redis::cmd("CLUSTER").arg("GETSLOTMIGRATIONS"))
        .await?;
    parse_slot_migrations(&v).map_err(|source| CommandError::Parse {
        addr: addr.to_owned(),
        source,
    })
}

fn is_export(j: &SlotMigration) -> bool {
    j.operation == MigrationOperation::Export
}

/// Slots of `moves` still owned by the source in its own view, per target.
fn remaining_moves(view: &ClusterNodes, moves: &[AtomicMove]) -> Result<Vec<(String, SlotSet)>> {
    let me = view
        .myself()
        .ok_or_else(|| CommandError::Failed("source view has no myself".into()))?;
    let mine = me.slot_set();
    let mut out = Vec::new();
    for m in moves {
        let target = view.get(&m.target_id).ok_or_else(|| {
            CommandError::NotReady(format!("source does not know target {}", m.target_id))
        })?;
        let wanted = SlotSet::from_ranges(&m.ranges);
        let elsewhere = wanted.difference(&mine).difference(&target.slot_set());
        if !elsewhere.is_empty() {
            return Err(CommandError::Refused(format!(
                "slots {elsewhere} are owned by neither the source nor {}",
                m.target_id
            )));
        }
        let rest = wanted.intersection(&mine);
        if !rest.is_empty() {
            out.push((m.target_id.clone(), rest));
        }
    }
    Ok(out)
}

/// Keys `addr` holds in `slots` (one pipelined `CLUSTER COUNTKEYSINSLOT` per slot).
pub async fn count_keys_in_slots(pool: &NodePool, addr: &str, slots: &[u16]) -> Result<u64> {
    if slots.is_empty() {
        return Ok(0);
    }
    let mut pipe = redis::pipe();
    for s in slots {
        pipe.cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(*s);
    }
    let counts: Vec<u64> = pool.pipeline(addr, &pipe).await?;
    Ok(counts.iter().sum())
}

/// Moves slot ranges from the primary at `source_addr` to target primaries with atomic slot
/// migration (`CLUSTER MIGRATESLOTS SLOTSRANGE s e ... NODE id ...`) and waits until the
/// source no longer owns them. Resumable: slots already moved are skipped, and running export
/// jobs for the slots are awaited instead of started again. A job that failed or was
/// cancelled is reported as [`CommandError::Failed`]; calling again restarts it.
/// Returns the number of slots that were still to move.
pub async fn migrate_slots_atomic(
    pool: &NodePool,
    source_addr: &str,
    moves: &[AtomicMove],
    timeout: Duration,
) -> Result<usize> {
    let view = cluster_nodes(pool, source_addr).await?;
    let remaining = remaining_moves(&view, moves)?;
    let total: usize = remaining.iter().map(|(_, s)| s.len()).sum();
    if total == 0 {
        return Ok(0);
    }
    let before = get_slot_migrations(pool, source_addr).await?;
    let active: Vec<&SlotMigration> = before
        .iter()
        .filter(|j| is_export(j) && !j.state.is_finished())
        .collect();
    let mut watched: BTreeSet<String> = BTreeSet::new();
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("MIGRATESLOTS");
    let mut to_start = 0usize;
    for (target, slots) in &remaining {
        let mut rest = slots.clone();
        for j in active.iter().filter(|j| &j.target_node == target) {
            let js = j.slot_set();
            if !js.is_disjoint(&rest) {
                watched.insert(j.name.clone());
                rest = rest.difference(&js);
            }
        }
        if rest.is_empty() {
            continue;
        }
        cmd.arg("SLOTSRANGE");
        for r in rest.ranges() {
            cmd.arg(r.start).arg(r.end);
        }
        cmd.arg("NODE").arg(target);
        to_start += rest.len();
    }
    if to_start > 0 {
        match exec(pool, source_addr, &cmd).await {
            Ok(()) => {}
            Err(CommandError::Client(e)) if reply_contains(&e, "already") => {
                debug!(error = %e, "migration already in progress; awaiting it");
            }
            Err(e) => return Err(e),
        }
        info!(
            source = source_addr,
            slots = to_start,
            "atomic slot migration started"
        );
    }
    let known: BTreeSet<String> = before
        .iter()
        .filter(|j| !watched.contains(&j.name))
        .map(|j| j.name.clone())
        .collect();
    poll_until(
        &format!("slot migration from {source_addr}"),
        timeout,
        POLL_INTERVAL,
        || async {
            let view = cluster_nodes(pool, source_addr).await?;
            if remaining_moves(&view, moves)?.is_empty() {
                return Ok(Some(()));
            }
            let jobs = get_slot_migrations(pool, source_addr).await?;
            let ours: Vec<&SlotMigration> = jobs
                .iter()
                .filter(|j| is_export(j) && !known.contains(&j.name))
                .collect();
            if !ours.is_empty()
                && ours.iter().all(|j| j.state.is_finished())
                && let Some(f) = ours.iter().find(|j| j.state != MigrationState::Success)
            {
                let detail = target_side_message(pool, &view, f).await;
                return Err(CommandError::Failed(format!(
                    "slot migration {} ({}) to {} {:?}: {}{detail}",
                    f.name,
                    f.slot_set(),
                    f.target_node,
                    f.state,
                    f.message
                )));
            }
            Ok(None)
        },
    )
    .await?;
    Ok(total)
}

/// The target's view of a failed job (its message usually names the cause).
async fn target_side_message(pool: &NodePool, view: &ClusterNodes, job: &SlotMigration) -> String {
    let Some(t) = view.get(&job.target_node) else {
        return String::new();
    };
    match get_slot_migrations(pool, &t.addr.host_port()).await {
        Ok(jobs) => jobs
            .into_iter()
            .find(|j| j.name == job.name)
            .map(|j| format!(" (target: {:?} {})", j.state, j.message))
            .unwrap_or_default(),
        Err(e) => format!(" (target unreadable: {e})"),
    }
}

/// Cancels all slot migrations running on the node at `addr` (`CLUSTER CANCELSLOTMIGRATIONS`;
/// Valkey 9.1 takes no argument despite its help text). No-op when none is running.
pub async fn cancel_slot_migrations(pool: &NodePool, addr: &str) -> Result<()> {
    match exec(
        pool,
        addr,
        redis::cmd("CLUSTER").arg("CANCELSLOTMIGRATIONS"),
    )
    .await
    {
        Err(CommandError::Client(e)) if reply_contains(&e, "no migrations") => Ok(()),
        r => r,
    }
}

// ---------------------------------------------------------------------------------------------
// Key-by-key migration (Valkey 8 fallback)
// ---------------------------------------------------------------------------------------------

/// Tuning of key-by-key migration.
#[derive(Debug, Clone)]
pub struct KeyMigrationOptions {
    /// Keys per `GETKEYSINSLOT`/`MIGRATE` batch.
    pub batch_keys: usize,
    /// `MIGRATE` I/O timeout on the server.
    pub migrate_timeout: Duration,
    /// Slots migrated concurrently (each worker opens its own connections).
    pub parallel_slots: usize,
}

impl Default for KeyMigrationOptions {
    fn default() -> Self {
        Self {
            batch_keys: 1000,
            migrate_timeout: Duration::from_secs(10),
            parallel_slots: 16,
        }
    }
}

/// A slot left half-migrated (`[slot->-target]` on the source and/or `[slot-<-source]` on
/// the target).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct OpenSlot {
    /// The slot.
    pub slot: Slot,
    /// Node id of the source (owner) primary.
    pub source_id: String,
    /// Node id of the target primary.
    pub target_id: String,
}

/// Half-open slots found in the nodes' own views (`myself` lines), merged per slot.
pub fn open_slots(views: &[ClusterNodes]) -> Vec<OpenSlot> {
    let mut out: BTreeMap<Slot, OpenSlot> = BTreeMap::new();
    for v in views {
        let Some(me) = v.myself() else { continue };
        for (slot, target) in &me.migrating {
            out.entry(*slot).or_insert_with(|| OpenSlot {
                slot: *slot,
                source_id: me.id.clone(),
                target_id: target.clone(),
            });
        }
        for (slot, source) in &me.importing {
            out.entry(*slot).or_insert_with(|| OpenSlot {
                slot: *slot,
                source_id: source.clone(),
                target_id: me.id.clone(),
            });
        }
    }
    out.into_values().collect()
}

/// Moves the keys of `slots` from the primary at `source_addr` to the primary at
/// `target_addr` key by key, then assigns the slots to the target on the target, the source
/// and every address in `other_addrs` (best effort for those). Resumable: detects existing
/// `IMPORTING`/`MIGRATING` markers and slots already owned by the target and finishes them.
/// Returns the number of keys moved.
pub async fn migrate_slot_keys(
    pool: &NodePool,
    source_addr: &str,
    target_addr: &str,
    slots: &[Slot],
    other_addrs: &[String],
    opts: &KeyMigrationOptions,
) -> Result<u64> {
    let src_view = cluster_nodes(pool, source_addr).await?;
    let tgt_view = cluster_nodes(pool, target_addr).await?;
    let src = src_view
        .myself()
        .ok_or_else(|| CommandError::Failed(format!("{source_addr}: no myself")))?
        .clone();
    let tgt = tgt_view
        .myself()
        .ok_or_else(|| CommandError::Failed(format!("{target_addr}: no myself")))?
        .clone();
    // Address the *source* uses to reach the target (its announced ip:port).
    let tgt_seen = src_view.get(&tgt.id).ok_or_else(|| {
        CommandError::NotReady(format!("{source_addr} does not know target {}", tgt.id))
    })?;
    if tgt_seen.addr.is_unknown() {
        return Err(CommandError::NotReady(format!(
            "{source_addr} has no address for target {}",
            tgt.id
        )));
    }
    let ctx = SlotCtx {
        pool,
        source_addr,
        target_addr,
        src_id: &src.id,
        tgt_id: &tgt.id,
        tgt_ip: &tgt_seen.addr.ip,
        tgt_port: tgt_seen.addr.port,
        src_slots: src.slot_set(),
        tgt_slots: tgt.slot_set(),
        src_migrating: src.migrating.iter().cloned().collect(),
        tgt_importing: tgt.importing.iter().cloned().collect(),
        opts,
    };
    let ctx = &ctx;
    // Each worker has its own connections: on Valkey 8 `SETSLOT` blocks its client until the
    // node's replicas acknowledge, so slots sharing one connection would run one at a time.
    let workers = opts.parallel_slots.clamp(1, slots.len().max(1));
    let others: Vec<&str> = other_addrs
        .iter()
        .map(String::as_str)
        .filter(|a| *a != source_addr && *a != target_addr)
        .collect();
    let others = &others;
    let moved: Vec<u64> = futures::future::try_join_all((0..workers).map(|w| async move {
        let chunk: Vec<Slot> = slots.iter().copied().skip(w).step_by(workers).collect();
        let cfg = pool.config();
        let mut src_conn = client::connect(source_addr, cfg).await?;
        let mut tgt_conn = client::connect(target_addr, cfg).await?;
        let mut other_conns = Vec::new();
        for a in others {
            match client::connect(a, cfg).await {
                Ok(c) => other_conns.push(c),
                Err(e) => debug!(addr = a, error = %e, "other primary unreachable (gossip will fix)"),
            }
        }
        let mut n = 0;
        for slot in chunk {
            n += ctx.migrate_one(slot, &mut src_conn, &mut tgt_conn).await?;
            // Tell the other primaries (gossip would too, but this fixes redirects at once).
            for o in &mut other_conns {
                if let Err(e) = setslot(o, slot, "NODE", ctx.tgt_id).await {
                    debug!(addr = o.addr(), slot, error = %e, "SETSLOT NODE on other primary failed (gossip will fix)");
                }
            }
        }
        Ok::<u64, CommandError>(n)
    }))
    .await?;
    let keys = moved.iter().sum();
    info!(
        source = source_addr,
        target = target_addr,
        slots = slots.len(),
        keys,
        "key-by-key slot migration done"
    );
    Ok(keys)
}

struct SlotCtx<'a> {
    pool: &'a NodePool,
    source_addr: &'a str,
    target_addr: &'a str,
    src_id: &'a str,
    tgt_id: &'a str,
    tgt_ip: &'a str,
    tgt_port: u16,
    src_slots: SlotSet,
    tgt_slots: SlotSet,
    src_migrating: HashMap<Slot, String>,
    tgt_importing: HashMap<Slot, String>,
    opts: &'a KeyMigrationOptions,
}

async fn setslot(conn: &mut NodeConnection, slot: Slot, state: &str, id: &str) -> Result<()> {
    let _: Value = conn
        .query(
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id),
        )
        .await?;
    Ok(())
}

impl SlotCtx<'_> {
    async fn migrate_one(
        &self,
        slot: Slot,
        src_conn: &mut NodeConnection,
        tgt_conn: &mut NodeConnection,
    ) -> Result<u64> {
        let src_owns = self.src_slots.contains(slot);
        let tgt_owns = self.tgt_slots.contains(slot);
        let src_migrating = self.src_migrating.get(&slot).map(String::as_str);
        let tgt_importing = self.tgt_importing.get(&slot).map(String::as_str);
        if !src_owns && !tgt_owns {
            return Err(CommandError::Refused(format!(
                "slot {slot} is owned by neither {} nor {}",
                self.source_addr, self.target_addr
            )));
        }
        if tgt_owns && !src_owns && src_migrating.is_none() && tgt_importing.is_none() {
            return Ok(0); // already done
        }
        if !tgt_owns && tgt_importing != Some(self.src_id) {
            setslot(tgt_conn, slot, "IMPORTING", self.src_id).await?;
        }
        if src_owns && src_migrating != Some(self.tgt_id) {
            setslot(src_conn, slot, "MIGRATING", self.tgt_id).await?;
        }
        let moved = if src_owns || src_migrating.is_some() {
            self.move_keys(slot, src_conn).await?
        } else {
            0
        };
        if !tgt_owns || tgt_importing.is_some() {
            setslot(tgt_conn, slot, "NODE", self.tgt_id).await?;
        }
        if src_owns || src_migrating.is_some() {
            setslot(src_conn, slot, "NODE", self.tgt_id).await?;
        }
        debug!(slot, moved, "slot migrated");
        Ok(moved)
    }

    async fn move_keys(&self, slot: Slot, src_conn: &NodeConnection) -> Result<u64> {
        let cfg = self.pool.config();
        let mut conn =
            src_conn.with_response_timeout(self.opts.migrate_timeout + cfg.response_timeout);
        let timeout_ms = u64::try_from(self.opts.migrate_timeout.as_millis()).unwrap_or(u64::MAX);
        let mut moved = 0u64;
        loop {
            let keys: Vec<Vec<u8>> = conn
                .query(
                    redis::cmd("CLUSTER")
                        .arg("GETKEYSINSLOT")
                        .arg(slot)
                        .arg(self.opts.batch_keys),
                )
                .await?;
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut cmd = redis::cmd("MIGRATE");
            cmd.arg(self.tgt_ip)
                .arg(self.tgt_port)
                .arg("")
                .arg(0)
                .arg(timeout_ms)
                .arg("REPLACE")
                .arg("AUTH2")
                .arg(&cfg.username)
                .arg(&cfg.password)
                .arg("KEYS")
                .arg(&keys);
            // `NOKEY` (keys expired meanwhile) is fine: the next batch moves on.
            let _: Value = conn.query(&cmd).await?;
            moved += keys.len() as u64;
        }
    }
}

/// Finds half-open slots on the primaries at `addrs` and completes each toward its target
/// (after an interrupted key-by-key migration). Returns the slots finished.
pub async fn finish_open_slots(
    pool: &NodePool,
    addrs: &[String],
    opts: &KeyMigrationOptions,
) -> Result<Vec<OpenSlot>> {
    let mut views = Vec::new();
    let mut addr_of: HashMap<String, String> = HashMap::new();
    for addr in addrs {
        let v = cluster_nodes(pool, addr).await?;
        if let Some(me) = v.myself() {
            addr_of.insert(me.id.clone(), addr.clone());
        }
        views.push(v);
    }
    let open = open_slots(&views);
    let mut groups: BTreeMap<(String, String), Vec<Slot>> = BTreeMap::new();
    for o in &open {
        groups
            .entry((o.source_id.clone(), o.target_id.clone()))
            .or_default()
            .push(o.slot);
    }
    for ((src, tgt), slots) in groups {
        let (Some(sa), Some(ta)) = (addr_of.get(&src), addr_of.get(&tgt)) else {
            return Err(CommandError::NotReady(format!(
                "open slots {slots:?} between {src} and {tgt}: node not among the given addresses"
            )));
        };
        info!(source = %sa, target = %ta, slots = slots.len(), "finishing half-open slots");
        migrate_slot_keys(pool, sa, ta, &slots, addrs, opts).await?;
    }
    Ok(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_open_slots_from_both_sides() {
        let a = ClusterNodes::parse(
            "aaaa000000000000000000000000000000000000 127.0.0.1:1@2 myself,master - 0 0 1 connected 0-99 [5->-bbbb000000000000000000000000000000000000]\n",
        )
        .unwrap();
        let b = ClusterNodes::parse(
            "bbbb000000000000000000000000000000000000 127.0.0.1:3@4 myself,master - 0 0 2 connected 100-200 [5-<-aaaa000000000000000000000000000000000000] [7-<-aaaa000000000000000000000000000000000000]\n",
        )
        .unwrap();
        let open = open_slots(&[a, b]);
        assert_eq!(open.len(), 2);
        assert_eq!(open[0].slot, 5);
        assert!(open[0].source_id.starts_with("aaaa"));
        assert!(open[1].target_id.starts_with("bbbb"));
    }
}
