//! Backups: the ValkeyBackup controller streams every shard's snapshot to an object store
//! and writes a manifest; the ValkeyScheduledBackup controller creates backups on a schedule
//! and applies retention; the restore controller restores `spec.bootstrap.backup` into a new
//! ValkeyCluster.

pub mod controller;
pub mod manifest;
pub mod plan;
pub mod progress;
pub mod reach;
pub mod restore;
pub mod restore_check;
pub mod restore_io;
pub mod schedule;
pub mod scheduler;
pub mod store;
pub mod upload;

pub use controller::{BACKUP_CONTROLLER, run};
