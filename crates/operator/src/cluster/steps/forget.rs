//! `Forget`: forget the failed nodes that are no pod's identity any more, on every member.

use std::net::SocketAddr;

use valkey_api::status::event;
use valkey_ops::commands::{self, CommandError};

use super::{Act, Actor, Outcome, Reporting, TargetError, each_target};
use crate::status::{Activity, Progress};
use crate::text;

const REPORTING: Reporting = Reporting {
    action: "Forget",
    done: Some((event::STALE_NODE_FORGOTTEN, event::STALE_NODE_FORGOTTEN)),
    failed: Some(event::NODE_FORGET_FAILED),
    failure: None,
};

/// Forget the failed nodes that are no pod's identity any more.
#[derive(Clone, Debug, PartialEq)]
pub struct Forget {
    /// Node ids to forget.
    pub node_ids: Vec<String>,
    /// Addresses of all reachable members (each must forget it).
    pub addrs: Vec<SocketAddr>,
}

impl Act for Forget {
    /// Forgets each of `node_ids` on every member at `addrs` (several nodes at once); a member
    /// that refuses (the node is not failed everywhere yet) makes that node wait for a later
    /// pass.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let Self { node_ids, addrs } = self;
        let mut out = Outcome::default();
        let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        let addrs = &addrs;
        each_target(
            &mut out,
            &REPORTING,
            node_ids,
            |id| async move {
                match commands::forget_everywhere(pool, addrs, id).await {
                    Ok(n) => Ok((n > 0).then(|| format!("forgot failed node {id} on {n} nodes"))),
                    Err(CommandError::Refused(m)) => Err(CommandError::NotReady(m)),
                    Err(e) => Err(e),
                }
            },
            |id, e| TargetError {
                event: format!("forgetting {id}: {e}"),
                failure: format!("forgetting {id}: {e}"),
            },
            |done| text::list("nodes forgotten", done),
        )
        .await;
        out.progress = Some(Progress::new(
            Activity::Reconciling,
            match node_ids.as_slice() {
                [one] => format!("forgetting failed node {one}"),
                many => format!("forgetting failed nodes {}", text::list("nodes", many)),
            },
        ));
        out
    }
}
