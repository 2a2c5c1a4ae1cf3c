//! Running the operator's controllers in-process (used by `valkey-operator run` and the
//! end-to-end tests).

use std::sync::Arc;

use futures::FutureExt;
use kube::Client;
use tracing::error;

use crate::metrics::Metrics;
use crate::scope::Scope;

/// Runs the ValkeyCluster, ValkeyNode, ValkeyBackup, ValkeyScheduledBackup and restore
/// controllers over `scope` until `shutdown` completes.
pub async fn run_controllers(
    client: Client,
    metrics: Arc<Metrics>,
    scope: Scope,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let shutdown = shutdown.boxed().shared();
    let cluster = crate::cluster::run(
        client.clone(),
        metrics.clone(),
        scope.clone(),
        shutdown.clone(),
    );
    let backup = crate::backup::run(
        client.clone(),
        metrics.clone(),
        scope.clone(),
        shutdown.clone(),
    );
    let schedules = crate::backup::scheduler::run(
        client.clone(),
        metrics.clone(),
        scope.clone(),
        shutdown.clone(),
    );
    let restores = crate::backup::restore::run(
        client.clone(),
        metrics.clone(),
        scope.clone(),
        shutdown.clone(),
    );
    let node = async {
        if let Err(e) = crate::node::run(client, metrics, scope, shutdown).await {
            error!("ValkeyNode controller stopped: {e:#}");
        }
    };
    futures::join!(cluster, node, backup, schedules, restores);
}
