//! The ValkeyCluster controller: observe → build → apply → one topology step → status.

pub mod topology;
