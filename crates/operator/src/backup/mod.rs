//! Backups: the ValkeyBackup controller streams every shard's snapshot to an object store
//! and writes a manifest.

pub mod controller;
pub mod manifest;
pub mod plan;
pub mod progress;
pub mod store;
pub mod upload;

pub use controller::{BACKUP_CONTROLLER, run};
