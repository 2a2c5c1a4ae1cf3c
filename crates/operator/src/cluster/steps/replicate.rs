//! `Replicate`: attach nodes as replicas of their shard's live primary
//! (`CLUSTER REPLICATE`).

use std::net::SocketAddr;

use valkey_api::status::event;
use valkey_ops::commands;

use super::{Act, Actor, Outcome, Reporting, TargetError, each_target};
use crate::status::{Activity, FailureKind, Progress};
use crate::text;

const REPORTING: Reporting = Reporting {
    action: "Replicate",
    done: Some((event::REPLICA_CREATED, event::REPLICAS_ATTACHED)),
    failed: Some(event::REPLICA_CREATION_FAILED),
    failure: Some(FailureKind::NodeAddFailed),
};

/// Attach nodes as replicas of their shard's live primary.
#[derive(Clone, Debug, PartialEq)]
pub struct Replicate {
    /// (replica address, primary node id, shard index, primary address).
    pub attachments: Vec<(SocketAddr, String, i32, SocketAddr)>,
}

impl Act for Replicate {
    /// Attaches each (replica address, primary node id, shard, primary address); a replica that
    /// does not know its primary yet is introduced to it directly (`CLUSTER MEET`) rather than
    /// left to wait for gossip.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let attachments = &self.attachments;
        let mut out = Outcome::default();
        let waiting = each_target(
            &mut out,
            &REPORTING,
            attachments,
            |(addr, primary, shard, primary_addr)| async move {
                let attached =
                    commands::replicate(pool, &addr.to_string(), primary, Some(*primary_addr)).await?;
                Ok(attached.then(|| format!("{addr} → shard {shard}")))
            },
            |(addr, _, shard, _), e| TargetError {
                event: format!("{addr} as replica in shard {shard}: {e}"),
                failure: format!("attaching a replica to shard {shard}: {e}"),
            },
            |attached| format!("attached replicas: {}", text::list("replicas", attached)),
        )
        .await;
        out.progress = Some(Progress::new(
            Activity::AddingNodes,
            format!(
                "attaching {} replicas ({waiting} waiting for gossip)",
                attachments.len()
            ),
        ));
        out
    }
}
