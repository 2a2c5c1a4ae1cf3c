//! The headless Service `valkey-<cluster>`: stable DNS for every pod, ready or not.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use valkey_api::defaults::{CLUSTER_BUS_PORT, VALKEY_PORT};

use super::names;

/// Name of the client port.
pub const CLIENT_PORT_NAME: &str = "valkey";
/// Name of the cluster bus port.
pub const BUS_PORT_NAME: &str = "cluster-bus";

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// The headless Service selecting all pods of the cluster; not-ready addresses are published
/// so that nodes can find each other while the cluster forms.
pub fn service(cluster: &str, namespace: &str, owner: Option<OwnerReference>) -> Service {
    Service {
        metadata: names::child_meta(names::service_name(cluster), cluster, namespace, owner),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(names::cluster_selector(cluster)),
            ports: Some(vec![
                port(CLIENT_PORT_NAME, VALKEY_PORT),
                port(BUS_PORT_NAME, CLUSTER_BUS_PORT),
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_snapshot() {
        insta::assert_yaml_snapshot!(service("c", "ns", None));
    }
}
