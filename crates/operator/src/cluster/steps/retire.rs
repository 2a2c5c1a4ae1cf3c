//! `Retire`: surplus ValkeyNodes (outside the layout) that own no slot anywhere are forgotten
//! on every member of the layout, reset so they stop gossiping, then deleted.

use std::net::SocketAddr;

use tracing::{info, warn};
use valkey_api::status::event;
use valkey_ops::commands;

use super::{Act, Actor, Outcome};
use crate::cluster::apply;
use crate::status::{Activity, EventSpec, Progress};

/// Retire surplus ValkeyNodes (outside the layout) that own no slot anywhere: forget their
/// nodes on every member of the layout, reset them so they stop gossiping, then delete the
/// ValkeyNodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Retire {
    /// Node ids to forget (replicas before their primary).
    pub forget: Vec<String>,
    /// Members of the layout that must forget them.
    pub at: Vec<SocketAddr>,
    /// Addresses of the retiring nodes still running (reset, best effort).
    pub reset: Vec<SocketAddr>,
    /// ValkeyNode names to delete.
    pub names: Vec<String>,
}

impl Act for Retire {
    /// Forgets retiring nodes on every member of the layout (replicas first), resets them so
    /// they stop gossiping, then deletes their ValkeyNodes. Each part is idempotent; a failed
    /// forget stops before anything is deleted.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        // Without the ValkeyNode API (the topology loop against bare servers) there is nothing
        // to retire.
        let Some(nodes) = actor.nodes else {
            return Outcome::default();
        };
        let Self {
            forget,
            at,
            reset,
            names,
        } = self;
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
}
