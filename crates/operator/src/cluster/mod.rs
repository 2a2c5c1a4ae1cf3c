//! The ValkeyCluster controller: observe → build → apply → one topology step → status.

pub mod act;
pub mod apply;
pub mod controller;
pub mod desired;
pub mod live;
pub mod observe;
pub mod operation;
pub mod roll;
pub mod topology;

pub use controller::{CONTROLLER, Context, reconcile, run};
