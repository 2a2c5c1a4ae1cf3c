//! Typed views of Valkey replies (pure parsing, no I/O).

pub mod nodes;

pub use nodes::{ClusterNode, ClusterNodes, LinkState, NodeAddr, NodeFlags, NodeRole};
