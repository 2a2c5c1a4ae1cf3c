//! The `valkey.io/v1alpha1` API: the user-facing [`ValkeyCluster`], [`ValkeyBackup`] and
//! [`ValkeyScheduledBackup`] and the internal [`ValkeyNode`] custom resources, their defaults, admission rules (CEL in the
//! CRD) and CRD generation.

pub mod backup;
pub mod backup_store;
pub mod bootstrap;
pub mod cluster;
pub mod config;
pub mod crd;
pub mod defaults;
pub mod disruption;
pub mod exporter;
pub mod failback;
pub mod labels;
pub mod networking;
pub mod node;
pub mod persistence;
pub mod scheduled_backup;
pub mod scheduling;
pub mod status;
pub mod users;

pub use backup::{ValkeyBackup, ValkeyBackupSpec, ValkeyBackupStatus};
pub use cluster::{ValkeyCluster, ValkeyClusterSpec, ValkeyClusterStatus, WorkloadType};
pub use crd::{CrdError, crd_yaml, crds, crds_yaml};
pub use node::{ValkeyNode, ValkeyNodeSpec, ValkeyNodeStatus};
pub use scheduled_backup::{
    ValkeyScheduledBackup, ValkeyScheduledBackupSpec, ValkeyScheduledBackupStatus,
};
