//! `Meet`: introduce isolated nodes to the cluster through the seed (`CLUSTER MEET`); the
//! introduction [`ReMeet`](super::ReMeet) repeats at new addresses.

use std::net::SocketAddr;

use valkey_api::status::event;
use valkey_ops::client::NodePool;
use valkey_ops::commands;

use super::{Act, Actor, Outcome, Reporting, TargetError, each_target};
use crate::status::{Activity, FailureKind, Progress};

const MEET: Reporting = Reporting {
    action: "ClusterMeet",
    done: Some((event::CLUSTER_MEET_BATCH, event::CLUSTER_MEET_BATCH)),
    failed: Some(event::CLUSTER_MEET_FAILED),
    failure: Some(FailureKind::NodeAddFailed),
};

const MEET_AGAIN: Reporting = Reporting {
    action: "ClusterMeet",
    done: Some((event::STALE_ADDRESSES_HEALED, event::STALE_ADDRESSES_HEALED)),
    failed: None,
    failure: None,
};

/// Introduce isolated nodes to the cluster through the seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Meet {
    /// Address of the best-connected node.
    pub seed: SocketAddr,
    /// Addresses of nodes the seed does not know.
    pub nodes: Vec<SocketAddr>,
}

impl Act for Meet {
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        introduce(actor.pool, self.seed, &self.nodes, false).await
    }
}

/// Meets each of `nodes` through `seed` (`again`: unconditionally, at their new addresses).
pub(super) async fn introduce(
    pool: &NodePool,
    seed: SocketAddr,
    nodes: &[SocketAddr],
    again: bool,
) -> Outcome {
    let mut out = Outcome::default();
    let seed = &seed.to_string();
    each_target(
        &mut out,
        if again { &MEET_AGAIN } else { &MEET },
        nodes,
        |n| async move {
            if again {
                commands::meet_again(pool, seed, *n).await?;
                return Ok(Some(n.to_string()));
            }
            let met = commands::meet(pool, seed, *n).await?;
            Ok(met.then(|| n.to_string()))
        },
        |n, e| TargetError {
            event: format!("meeting {n} through {seed}: {e}"),
            failure: format!("meet {n}: {e}"),
        },
        |met| match again {
            true => format!("re-introduced {} nodes at their new addresses", met.len()),
            false => format!(
                "introduced {} nodes to the cluster through {seed}",
                met.len()
            ),
        },
    )
    .await;
    out.progress = Some(if again {
        Progress::new(Activity::Reconciling, "healing stale node addresses")
    } else {
        Progress::new(
            Activity::AddingNodes,
            format!("joining {} nodes to the cluster", nodes.len()),
        )
    });
    out
}
