//! `ClaimAndMeet`: a new cluster's fresh shard primaries claim their slots and a config epoch
//! of their own (`CLUSTER SET-CONFIG-EPOCH`, `CLUSTER ADDSLOTSRANGE`), then every node the
//! seed does not know is introduced to it (`CLUSTER MEET`), as `valkey-cli --cluster create`
//! does: the handshakes carry the slots, so no gossip round is waited for afterwards.

use std::net::SocketAddr;

use valkey_ops::SlotRange;
use valkey_ops::commands;

use super::assign_slots::REPORTING;
use super::meet::introduce;
use super::{Act, Actor, Outcome, TargetError, each_target};
use crate::status::{Activity, Progress};
use crate::text;

/// A fresh shard primary's claim: its shard's initial slot ranges and config epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// The node's address.
    pub addr: SocketAddr,
    /// Its shard.
    pub shard: i32,
    /// The shard's initial slot ranges.
    pub ranges: Vec<SlotRange>,
    /// The config epoch it takes (distinct per shard).
    pub epoch: u64,
}

/// Claims first, then MEET through the seed.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimAndMeet {
    /// Address of the seed.
    pub seed: SocketAddr,
    /// The fresh primaries' claims.
    pub claims: Vec<Claim>,
    /// Addresses of nodes the seed does not know.
    pub nodes: Vec<SocketAddr>,
}

impl Act for ClaimAndMeet {
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let mut out = Outcome::default();
        each_target(
            &mut out,
            &REPORTING,
            &self.claims,
            |c| async move {
                let n = commands::claim_slots(pool, &c.addr.to_string(), c.epoch, &c.ranges).await?;
                Ok((n > 0).then(|| format!("shard {}: {n} slots", c.shard)))
            },
            |c, e| TargetError {
                event: format!("shard {} at {}: {e}", c.shard, c.addr),
                failure: format!("assigning slots to shard {}: {e}", c.shard),
            },
            |done| format!("assigned slots: {}", text::list("primaries", done)),
        )
        .await;
        if self.nodes.is_empty() {
            out.progress = Some(Progress::new(
                Activity::AddingNodes,
                "assigning slots to primaries",
            ));
            return out;
        }
        let met = introduce(pool, self.seed, &self.nodes, false).await;
        out.events.extend(met.events);
        out.acted |= met.acted;
        out.failure = out.failure.or(met.failure);
        out.progress = met.progress;
        out
    }
}
