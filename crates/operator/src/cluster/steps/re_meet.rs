//! `ReMeet`: meet again peers the seed knows under an old IP (`CLUSTER MEET` at their new
//! addresses, whatever the seed believes).

use std::net::SocketAddr;

use super::meet::introduce;
use super::{Act, Actor, Outcome};

/// MEET again peers the seed knows under an old IP.
#[derive(Clone, Debug, PartialEq)]
pub struct ReMeet {
    /// Address of the seed.
    pub seed: SocketAddr,
    /// New addresses of the moved peers.
    pub nodes: Vec<SocketAddr>,
}

impl Act for ReMeet {
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        introduce(actor.pool, self.seed, &self.nodes, true).await
    }
}
