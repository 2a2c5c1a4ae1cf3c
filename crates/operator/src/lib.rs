//! The `valkey-operator` library: pure renderers of the Kubernetes objects and the controllers.

pub mod api_client;
pub mod backoff;
pub mod backup;
pub mod bounded;
pub mod cluster;
pub mod context;
pub mod crds;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod node;
pub mod render;
mod run;
pub mod scope;
pub mod stage_clock;
pub mod status;
pub mod telemetry;
pub mod text;

pub use run::run_controllers;
pub use scope::Scope;
