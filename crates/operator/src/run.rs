//! Running the operator's controllers in-process (used by `valkey-operator run` and the
//! end-to-end tests).

use std::sync::Arc;

use futures::FutureExt;
use futures::future::Shared;
use kube::Client;

use crate::metrics::Metrics;

/// Runs the ValkeyCluster and ValkeyNode controllers until `shutdown` completes.
pub async fn run_controllers(
    client: Client,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown: Shared<futures::future::BoxFuture<'static, ()>> = shutdown.boxed().shared();
    crate::cluster::run(client, metrics, shutdown).await;
}
