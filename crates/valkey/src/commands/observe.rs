//! Observation: one node's `CLUSTER NODES`, `CLUSTER INFO`, `INFO replication server` (one
//! pipelined round trip) and, on Valkey >= 9, `CLUSTER GETSLOTMIGRATIONS`, parsed into the
//! model's [`NodeObservation`]; and the [`ClusterView`] of many nodes fetched concurrently.

use std::collections::BTreeMap;

use super::{CommandError, Result};
use crate::client::NodePool;
use crate::model::{
    ClusterInfo, ClusterNodes, ClusterView, NodeObservation, ReplicationInfo, ReplicationRole,
    ServerInfo,
};

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
        .arg("server");
    let (nodes, cluster_info, info): (String, String, String) = pool.pipeline(addr, &pipe).await?;
    let server = ServerInfo::parse(&info).map_err(parse_err(addr))?;
    let replication = ReplicationInfo::parse(&info).map_err(parse_err(addr))?;
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
        migrations,
    })
}

/// Observes every address concurrently and assembles the cluster view (unreachable or
/// unparsable nodes are recorded as errors in the view, not returned).
pub async fn observe_cluster(pool: &NodePool, addrs: &[String]) -> ClusterView {
    let results = futures::future::join_all(addrs.iter().map(|a| async move {
        (
            a.clone(),
            observe_node(pool, a).await.map_err(|e| e.to_string()),
        )
    }))
    .await;
    ClusterView::new(results.into_iter().collect::<BTreeMap<_, _>>())
}
