//! `Retire`: surplus ValkeyNodes (outside the layout) that own no slot anywhere are forgotten
//! on every member of the layout, reset so they stop gossiping, then deleted.

use std::net::SocketAddr;

use kube::Api;
use tracing::{info, warn};
use valkey_api::ValkeyNode;
use valkey_api::status::event;
use valkey_ops::client::NodePool;
use valkey_ops::commands;

use super::Outcome;
use crate::cluster::apply;
use crate::status::{Activity, EventSpec, Progress};

/// Forgets retiring nodes on every member of the layout (replicas first), resets them so
/// they stop gossiping, then deletes their ValkeyNodes. Each part is idempotent; a failed
/// forget stops before anything is deleted.
pub async fn run(
    pool: &NodePool,
    nodes: &Api<ValkeyNode>,
    forget: &[String],
    at: &[SocketAddr],
    reset: &[SocketAddr],
    names: &[String],
) -> Outcome {
    let mut out = Outcome::default();
    let at: Vec<String> = at.iter().map(ToString::to_string).collect();
    for id in forget {
        match commands::forget_everywhere(pool, &at, id).await {
            Ok(n) => out.acted |= n > 0,
            Err(e) => {
                warn!(node = %id, error = %e, "forgetting a retiring node failed");
                out.events.push(EventSpec::warning(
                    event::NODE_FORGET_FAILED,
                    "Forget",
                    format!("forgetting retiring node {id}: {e}"),
                ));
                return out;
            }
        }
    }
    for addr in reset {
        if let Err(e) = commands::reset_soft(pool, &addr.to_string()).await {
            info!(%addr, error = %e, "resetting a retiring node failed (it is deleted anyway)");
        }
    }
    for name in names {
        match apply::delete(nodes, name).await {
            Ok(true) => {
                out.acted = true;
                out.events.push(EventSpec::normal(
                    event::VALKEY_NODE_DELETED,
                    "Delete",
                    format!("deleted surplus ValkeyNode {name}"),
                ));
            }
            Ok(false) => {}
            Err(e) => warn!(node = %name, error = %e, "deleting a surplus ValkeyNode failed"),
        }
    }
    out.progress = Some(Progress::new(
        Activity::Reconciling,
        format!("removing {} surplus nodes", names.len()),
    ));
    out
}
