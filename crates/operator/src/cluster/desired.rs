//! The desired ValkeyNodes of a cluster, from the render layer with the inputs the cluster
//! controller observed (the ACL revision, each node's current workload revision) and the roll
//! it authorizes this pass.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use valkey_api::{ValkeyCluster, ValkeyNode};

use super::roll::{FIRST_REVISION, bump};
use crate::render::acl::AclFile;
use crate::render::valkeynode::{NodeInputs, valkey_node};

/// One ValkeyNode per position `<cluster>-<shard>-<node>`. Each keeps the workload revision it
/// has (`"1"` when new), except `authorize`, whose revision is bumped so that its pending pod
/// template change is applied.
pub fn valkey_nodes(
    vc: &ValkeyCluster,
    acl: Option<&AclFile>,
    owner: Option<OwnerReference>,
    observed: &[ValkeyNode],
    authorize: Option<&str>,
) -> Vec<ValkeyNode> {
    let spec = &vc.spec;
    let per_shard = i32::try_from(spec.nodes_per_shard()).unwrap_or(i32::MAX);
    (0..spec.shards.max(0))
        .flat_map(|s| (0..per_shard).map(move |n| (s, n)))
        .map(|(s, n)| {
            let name = crate::render::names::valkey_node_name(&vc.name_any(), s, n);
            let current = observed
                .iter()
                .find(|o| o.name_any() == name)
                .and_then(|o| o.spec.workload_revision.clone());
            let revision = if authorize == Some(name.as_str()) {
                bump(current.as_deref())
            } else {
                current.unwrap_or_else(|| FIRST_REVISION.to_owned())
            };
            let inputs = NodeInputs {
                acl_revision: acl.map(|a| a.revision.clone()),
                workload_revision: Some(revision),
            };
            valkey_node(vc, s, n, &inputs, owner.clone())
        })
        .collect()
}
