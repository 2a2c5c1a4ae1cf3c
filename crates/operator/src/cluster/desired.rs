//! The desired ValkeyNodes of a cluster, from the render layer with the inputs the cluster
//! controller observed (the ACL revision).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use valkey_api::{ValkeyCluster, ValkeyNode};

use crate::render::acl::AclFile;
use crate::render::valkeynode::{NodeInputs, valkey_nodes as render_nodes};

/// One ValkeyNode per position `<cluster>-<shard>-<node>`.
pub fn valkey_nodes(
    vc: &ValkeyCluster,
    acl: Option<&AclFile>,
    owner: Option<OwnerReference>,
) -> Vec<ValkeyNode> {
    let inputs = NodeInputs {
        acl_revision: acl.map(|a| a.revision.clone()),
        workload_revision: None,
    };
    render_nodes(vc, &inputs, owner)
}
