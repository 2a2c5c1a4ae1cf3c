//! The zones of the Kubernetes nodes pods run on (`topology.kubernetes.io/zone`), read with
//! `get` on nodes and kept for a minute, so a pass does not read every node again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt};
use valkey_api::scheduling::ZONE_TOPOLOGY_KEY;

/// How long a node's zone is kept before it is read again (a node's zone label changes only
/// when an administrator relabels it; a pod moved to another node is seen at once).
const ZONE_TTL: Duration = Duration::from_secs(60);

/// Node name → (when read, its zone), shared by the passes of every cluster.
#[derive(Default)]
pub struct NodeZones {
    read: Mutex<HashMap<String, (Instant, Option<String>)>>,
}

impl NodeZones {
    fn cached(&self, node: &str) -> Option<Option<String>> {
        let read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        read.get(node)
            .filter(|(at, _)| at.elapsed() < ZONE_TTL)
            .map(|(_, zone)| zone.clone())
    }

    fn keep(&self, node: &str, zone: Option<String>) {
        let mut read = self.read.lock().unwrap_or_else(|p| p.into_inner());
        read.retain(|_, (at, _)| at.elapsed() < ZONE_TTL);
        read.insert(node.to_owned(), (Instant::now(), zone));
    }

    /// Pod name → the zone of the node it runs on. Pods not scheduled yet, nodes without the
    /// label and nodes the operator may not read (no `get` on nodes: zone awareness is then
    /// off; not kept, so a granted permission counts from the next pass) are left out.
    pub async fn of_pods(&self, client: &kube::Client, pods: &[Pod]) -> BTreeMap<String, String> {
        let api: Api<Node> = Api::all(client.clone());
        let node_of = |pod: &Pod| pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let unknown: BTreeSet<String> = pods
            .iter()
            .filter_map(node_of)
            .filter(|n| self.cached(n).is_none())
            .collect();
        // The nodes not cached are read at once.
        let read = futures::future::join_all(unknown.into_iter().map(|node| {
            let api = api.clone();
            async move {
                let got = api.get_opt(&node).await;
                (node, got)
            }
        }))
        .await;
        for (node, got) in read {
            match got {
                Ok(n) => self.keep(
                    &node,
                    n.and_then(|n| n.labels().get(ZONE_TOPOLOGY_KEY).cloned()),
                ),
                Err(e) => tracing::debug!(%node, error = %e, "cannot read the node's zone"),
            }
        }
        pods.iter()
            .filter_map(|pod| {
                // Not cached: not scheduled or not readable; `None` inside: no zone label.
                let zone = self.cached(&node_of(pod)?)?;
                Some((pod.name_any(), zone?))
            })
            .collect()
    }
}
