//! Observation: one node's `CLUSTER NODES`, `CLUSTER INFO`, `INFO replication server memory` (one
//! pipelined round trip) and, on Valkey >= 9, `CLUSTER GETSLOTMIGRATIONS`, parsed into the
//! model's [`NodeObservation`]; and the [`Topology`] of many positions observed concurrently.

use std::net::SocketAddr;

use super::{CommandError, Result};
use crate::client::NodePool;
use crate::model::{
    ClusterInfo, ClusterNodes, MemoryInfo, NodeObservation, ReplicationInfo, ReplicationRole,
    ServerInfo,
};
use crate::topology::{Member, Topology};

fn parse_err(addr: &str) -> impl Fn(crate::error::ParseError) -> CommandError + '_ {
    move |source| CommandError::Parse {
        addr: addr.to_owned(),
        source,
    }
}

/// The node's replication offset: on a primary `master_repl_offset`, on a replica how much
/// of its primary's stream it has applied (`slave_repl_offset`).
pub async fn repl_offset(pool: &NodePool, addr: &str) -> Result<i64> {
    let info: String = pool
        .query(addr, redis::cmd("INFO").arg("replication"))
        .await?;
    let r = ReplicationInfo::parse(&info).map_err(parse_err(addr))?;
    Ok(r.replica_repl_offset.unwrap_or(r.master_repl_offset))
}

/// How far a replica got towards its primary's offset ([`wait_replica_offset`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    /// The primary's offset when the wait began.
    pub target: i64,
    /// The replica's offset when the wait ended (`None`: it never answered in time).
    pub reached: Option<i64>,
    /// How long the wait took.
    pub waited: std::time::Duration,
}

impl CatchUp {
    /// Whether the replica applied everything the primary had when the wait began.
    pub fn caught_up(&self) -> bool {
        self.reached.is_some_and(|r| r >= self.target)
    }

    /// Bytes of the primary's stream the replica had not applied when the wait ended
    /// (`None`: unknown, the replica never answered).
    pub fn lag(&self) -> Option<u64> {
        self.reached
            .map(|r| u64::try_from(self.target - r).unwrap_or(0))
    }
}

/// Waits until the replica at `replica` has applied its primary's stream up to the offset the
/// primary at `primary` shows now, polling every 10 ms for at most `timeout` (each query
/// bounded by what is left of it). So every write the primary had applied when this began is
/// in what the replica serves afterwards. An error only when the primary cannot be read.
pub async fn wait_replica_offset(
    pool: &NodePool,
    primary: &str,
    replica: &str,
    timeout: std::time::Duration,
) -> Result<CatchUp> {
    let start = tokio::time::Instant::now();
    let deadline = start + timeout;
    let target = repl_offset(pool, primary).await?;
    let mut reached = None;
    loop {
        if let Ok(Ok(r)) = tokio::time::timeout_at(deadline, repl_offset(pool, replica)).await {
            reached = Some(r);
        }
        let done = reached.is_some_and(|r| r >= target);
        if done || tokio::time::Instant::now() + std::time::Duration::from_millis(10) >= deadline {
            return Ok(CatchUp {
                target,
                reached,
                waited: start.elapsed(),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Fetches one node's observation.
pub async fn observe_node(pool: &NodePool, addr: &str) -> Result<NodeObservation> {
    let mut pipe = redis::pipe();
    pipe.cmd("CLUSTER")
        .arg("NODES")
        .cmd("CLUSTER")
        .arg("INFO")
        .cmd("INFO")
        .arg("replication")
        .arg("server")
        .arg("memory");
    let (nodes, cluster_info, info): (String, String, String) = pool.pipeline(addr, &pipe).await?;
    let server = ServerInfo::parse(&info).map_err(parse_err(addr))?;
    let replication = ReplicationInfo::parse(&info).map_err(parse_err(addr))?;
    let memory = MemoryInfo::parse(&info).map_err(parse_err(addr))?;
    // Migration jobs are read from primaries only: a replica lists mirrored IMPORT entries
    // without `source_node`/`target_node` (seen on 9.1.2). A reply that does not parse is
    // logged and left out rather than failing the whole observation.
    let migrations = if server.version.has_atomic_slot_migration()
        && replication.role == ReplicationRole::Primary
    {
        match super::migrate::get_slot_migrations(pool, addr).await {
            Ok(m) => m,
            Err(e @ CommandError::Parse { .. }) => {
                tracing::warn!(addr, error = %e, "ignoring unparsable CLUSTER GETSLOTMIGRATIONS");
                Vec::new()
            }
            Err(e) => return Err(e),
        }
    } else {
        Vec::new()
    };
    Ok(NodeObservation {
        nodes: ClusterNodes::parse(&nodes).map_err(parse_err(addr))?,
        cluster_info: Some(ClusterInfo::parse(&cluster_info).map_err(parse_err(addr))?),
        replication: Some(replication),
        server: Some(server),
        memory: Some(memory),
        migrations,
    })
}

/// A position of the layout to observe: (shard index, node index, pod name, address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    /// Shard index.
    pub shard: i32,
    /// Node index inside the shard.
    pub index: i32,
    /// Pod name.
    pub pod: String,
    /// Address to dial.
    pub addr: SocketAddr,
}

/// Observes every position concurrently into the topology model. An unreachable or
/// unparsable node becomes a member without a view (`refused` when the connection was refused:
/// its server process is not running).
pub async fn observe_topology(pool: &NodePool, positions: Vec<Position>) -> Topology {
    let members = futures::future::join_all(positions.into_iter().map(|p| async move {
        let addr = p.addr.to_string();
        let (view, refused, auth_refused, error) = match observe_node(pool, &addr).await {
            Ok(o) => (Some(o.into()), false, None, None),
            Err(e) => {
                tracing::debug!(pod = %p.pod, %addr, error = %e, "node not observable");
                let refused = matches!(&e, CommandError::Client(c) if c.is_connection_refused());
                let auth = match &e {
                    CommandError::Client(c) if c.is_auth() => Some(c.to_string()),
                    _ => None,
                };
                (None, refused, auth, Some(e.to_string()))
            }
        };
        Member {
            shard: p.shard,
            index: p.index,
            pod: p.pod,
            addr: p.addr,
            view,
            refused,
            auth_refused,
            error,
        }
    }))
    .await;
    Topology::new(members)
}
