//! The ValkeyCluster controller. One pass ([`controller`]) is a list of stages:
//!
//! 1. **observe** ([`observe`]): the children from the API server and every pod's live view
//!    (the topology model) → one [`observe::Observed`] value;
//! 2. **build** ([`build`], pure): every object the controller writes, with the image and
//!    settings the config gate ([`config_gate`], pure) lets through;
//! 3. **apply** ([`apply`]): server-side apply of the children that differ;
//! 4. **plan** ([`plan`], pure): the one risky step of the pass (topology, removal of surplus
//!    nodes, rolling update) and the topology facts;
//! 5. **act** ([`steps`], one module per step; [`live`]): that step, then the live settings
//!    and ACL;
//! 6. **report** ([`report`]): status, ValkeyNode roles, events, requeue.

pub mod apply;
pub mod build;
pub mod config_gate;
pub mod controller;
pub mod live;
pub mod node_zones;
pub mod observe;
pub mod operation;
pub mod plan;
pub mod report;
pub mod rule_check;
pub mod steps;
pub mod tls_secret;

pub use controller::{CLUSTER_CONTROLLER, Context, reconcile, run};
