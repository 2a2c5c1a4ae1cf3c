//! Reaching a cluster's servers from the backup and restore controllers: its system
//! passwords and TLS CA (from its Secrets), its pods, and the live topology they show.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use valkey_api::ValkeyCluster;
use valkey_api::labels;
use valkey_ops::Topology;
use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::commands::acl::{OPERATOR_USER, REPLICATION_USER};
use valkey_ops::commands::observe::observe_topology;

use crate::cluster::observe::positions;
use crate::render::{names, secrets};

/// A cluster as the backup controllers see it.
pub struct Reached {
    /// The live topology.
    pub topology: Topology,
    /// Connections as the operator's user (`response` timeout as asked).
    pub pool: NodePool,
    /// The replication user's connection settings (what a snapshot needs, nothing more).
    pub replication: ClientConfig,
}

/// Why a cluster could not be reached.
pub enum Unreached {
    /// The API server.
    Api(kube::Error),
    /// Not yet: what is missing.
    NotYet(String),
}

impl From<kube::Error> for Unreached {
    fn from(e: kube::Error) -> Self {
        Unreached::Api(e)
    }
}

/// Reads `vc`'s Secrets and pods and observes its servers; `response` bounds each command.
pub async fn reach(
    client: &Client,
    vc: &ValkeyCluster,
    response: Duration,
) -> Result<Reached, Unreached> {
    let ns = vc.namespace().unwrap_or_default();
    let cluster = vc.name_any();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let (system_name, backup_name) = (
        names::system_secret_name(&cluster),
        names::system_backup_secret_name(&cluster),
    );
    let (system, system_backup) =
        tokio::try_join!(secrets.get_opt(&system_name), secrets.get_opt(&backup_name))?;
    if system.is_none() && system_backup.is_none() {
        return Err(Unreached::NotYet(format!(
            "ValkeyCluster {cluster} has no system Secret yet"
        )));
    }
    let passwords = secrets::system_passwords(&[system.as_ref(), system_backup.as_ref()]);
    let tls_ca = match vc.spec.tls_secret_name() {
        Some(n) => secrets
            .get_opt(n)
            .await?
            .and_then(|s| s.data?.remove("ca.crt").map(|b| b.0)),
        None => None,
    };
    let with_tls = |c: ClientConfig| match &tls_ca {
        Some(ca) => c.with_tls_names(ca.clone(), names::tls_server_names(&cluster, &ns)),
        None => c,
    };
    let pool = NodePool::new(with_tls(
        ClientConfig::new(OPERATOR_USER, passwords.operator.clone())
            .with_timeouts(Duration::from_secs(2), response),
    ));
    let pods = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&format!("{}={cluster}", labels::CLUSTER)))
        .await?
        .items;
    let topology = observe_topology(&pool, positions(&pods)).await;
    Ok(Reached {
        topology,
        pool,
        replication: with_tls(
            ClientConfig::new(REPLICATION_USER, passwords.replication)
                .with_timeouts(Duration::from_secs(5), Duration::from_secs(10)),
        ),
    })
}
