//! The one test harness of the workspace: real `valkey-server` processes on free loopback
//! ports in temporary directories (killed on drop), TLS material, cluster formation and key
//! helpers built on `valkey-ops`' commands.
//!
//! Binaries (see [`bins`]): Valkey 9.1 (`valkey-server-9`, no TLS) and Valkey 8.0
//! (`/usr/bin/valkey-server`, TLS), both installed by `hack/install-deps.sh`; SeaweedFS'
//! `weed` for [`S3Server`], a real S3-compatible store (`hack/install-deps.sh seaweedfs`);
//! `fake-gcs-server` for [`GcsServer`] and Azurite for [`AzureServer`], the Google Cloud
//! Storage and Azure Blob Storage emulators (`hack/install-deps.sh fakegcs azurite`).

pub mod azure_server;
pub mod bins;
pub mod cluster;
pub mod gcs_server;
mod http1;
pub mod keys;
pub mod promql;
pub mod s3_server;
pub mod server;
mod store_process;
pub mod tls;

pub use azure_server::{AZURE_ACCOUNT, AZURE_CONTAINER, AZURE_KEY, AzureServer};
pub use bins::Flavor;
pub use cluster::*;
pub use gcs_server::{GCS_BUCKET, GcsServer};
pub use keys::*;
pub use s3_server::{S3_ACCESS_KEY, S3_BUCKET, S3_REGION, S3_SECRET_KEY, S3Server};
pub use server::{Server, acl_lines, free_port, start_servers};
pub use tls::{TLS_SERVER_NAME, TlsFiles};

/// Password of `_operator` on harness servers.
pub const OPERATOR_PASSWORD: &str = "operator-secret";
/// Password of `_replication` on harness servers.
pub const REPLICATION_PASSWORD: &str = "replication-secret";
/// Password of `_exporter` on harness servers.
pub const EXPORTER_PASSWORD: &str = "exporter-secret";
/// Application user of harness servers (all commands, all keys).
pub const APP_USER: &str = "app";
/// Its password.
pub const APP_PASSWORD: &str = "app-secret";
/// Revision of the ACL file written by the harness.
pub const ACL_REVISION: &str = "harness0";

/// Logs of `valkey_ops` (and `RUST_LOG`) to the test output.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "valkey_ops=info".into()),
        )
        .with_test_writer()
        .try_init();
}
