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
