//! The operator's Kubernetes client, with bounded retries.
//!
//! kube's default client retries 429, 503 and 504 answers up to 15 times, its back-off
//! growing towards minutes: a throttled or refused call (API Priority and Fairness, an
//! overloaded API server) could hold one pass, and with it that cluster's failover, for about
//! five minutes. This client retries at most 3 times, 0.5 to 5 s apart; beyond that the call
//! fails, the pass reports it and is requeued.

use kube::client::ClientBuilder;
use kube::client::retry::RetryPolicy;
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

/// Requests queued for the client's worker task (the retry layer needs a cloneable service,
/// which the buffer's handle is).
const QUEUED_REQUESTS: usize = 1024;

/// A client for `config` whose retries are bounded (see the module docs). Call it inside a
/// Tokio runtime: the buffer spawns its worker task.
pub fn client(mut config: kube::Config) -> kube::Result<kube::Client> {
    config.default_retry = false;
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&BufferLayer::new(QUEUED_REQUESTS))
        .with_layer(&RetryLayer::new(RetryPolicy::default()))
        .build())
}
