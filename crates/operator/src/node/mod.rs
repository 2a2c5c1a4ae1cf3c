//! The ValkeyNode controller ("dumb infrastructure"): turns each ValkeyNode into its
//! single-replica StatefulSet or Deployment and PersistentVolumeClaim, and reports the pod's
//! state in the ValkeyNode's status.

pub mod controller;
pub mod create_failure;
pub mod status;
pub mod status_writes;
pub mod workload_plan;

pub use controller::{FINALIZER, run};
