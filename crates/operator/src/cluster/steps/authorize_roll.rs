//! `AuthorizeRoll`: apply a ValkeyNode with its workload revision bumped, so that the node
//! controller rolls its pod.

use kube::ResourceExt;
use tracing::{info, warn};
use valkey_api::ValkeyNode;

use super::{Act, Actor, Outcome};
use crate::cluster::apply;

/// Authorize a pending pod-template change: the ValkeyNode with its workload revision bumped,
/// to be applied.
#[derive(Clone, Debug, PartialEq)]
pub struct AuthorizeRoll {
    /// The ValkeyNode as it is to be applied.
    pub node: Box<ValkeyNode>,
}

impl Act for AuthorizeRoll {
    /// Applies `node`.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let Some(nodes) = actor.nodes else {
            return Outcome::default();
        };
        let node = &self.node;
        let mut out = Outcome::default();
        let name = node.name_any();
        info!(node = %name, "authorizing the roll of a node");
        match apply::apply_now(nodes, node).await {
            Ok(()) => out.acted = true,
            Err(e) => warn!(node = %name, error = %e, "authorizing a roll failed"),
        }
        out
    }
}
