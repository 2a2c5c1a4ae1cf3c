//! `AuthorizeRoll`: apply a ValkeyNode with its workload revision bumped, so that the node
//! controller rolls its pod.

use kube::{Api, ResourceExt};
use tracing::{info, warn};
use valkey_api::ValkeyNode;

use super::Outcome;
use crate::cluster::apply;

/// Applies `node`.
pub async fn run(nodes: &Api<ValkeyNode>, node: &ValkeyNode) -> Outcome {
    let mut out = Outcome::default();
    let name = node.name_any();
    info!(node = %name, "authorizing the roll of a node");
    match apply::apply_now(nodes, node).await {
        Ok(()) => out.acted = true,
        Err(e) => warn!(node = %name, error = %e, "authorizing a roll failed"),
    }
    out
}
