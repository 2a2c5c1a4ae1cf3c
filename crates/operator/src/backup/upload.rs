//! Writing to the store: a shard's snapshot streamed from its node into a multipart upload
//! (held in memory only a few MiB at a time), and the manifest.

use std::sync::Arc;

use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::io::AsyncWriteExt;
use valkey_ops::client::ClientConfig;
use valkey_ops::snapshot::{SnapshotError, SnapshotInfo, SnapshotOptions, stream_snapshot};

use super::manifest::{MANIFEST_FILE, Manifest};
use super::plan::ShardSource;

/// Bytes buffered per upload part (S3 accepts parts of 5 MiB and more).
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts uploaded at once per shard.
const PARTS_IN_FLIGHT: usize = 2;

/// Why a shard's file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The node's snapshot failed.
    #[error("{0}")]
    Snapshot(SnapshotError),
    /// The store refused or could not be reached.
    #[error("store: {0}")]
    Store(String),
}

/// Streams the snapshot of `source` to `path`; an incomplete upload is aborted.
pub async fn shard(
    store: Arc<dyn ObjectStore>,
    path: &Path,
    source: &ShardSource,
    config: &ClientConfig,
) -> Result<SnapshotInfo, UploadError> {
    let mut writer = BufWriter::with_capacity(store, path.clone(), PART_SIZE)
        .with_max_concurrency(PARTS_IN_FLIGHT);
    let streamed = stream_snapshot(
        &source.addr.to_string(),
        config,
        &SnapshotOptions::default(),
        &mut writer,
    )
    .await;
    match streamed {
        Ok(info) => match writer.shutdown().await {
            Ok(()) => Ok(info),
            Err(e) => Err(UploadError::Store(with_causes(&e))),
        },
        Err(e) => {
            let _ = writer.abort().await;
            Err(match e {
                SnapshotError::Sink(io) => UploadError::Store(with_causes(&io)),
                other => UploadError::Snapshot(other),
            })
        }
    }
}

/// An error's message followed by those of its causes that add something (the client's
/// "error sending request" says nothing without the "Connection refused" under it).
pub fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let m = c.to_string();
        if !text.contains(&m) {
            text.push_str(": ");
            text.push_str(&m);
        }
        cause = c.source();
    }
    text
}

/// Writes the manifest, pretty-printed, as the backup's last object.
pub async fn manifest(
    store: &Arc<dyn ObjectStore>,
    dir: &Path,
    m: &Manifest,
) -> Result<(), object_store::Error> {
    let body = serde_json::to_vec_pretty(m).unwrap_or_default();
    store
        .put(&dir.clone().join(MANIFEST_FILE), PutPayload::from(body))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_appended_once() {
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let outer = std::io::Error::other(refused);
        // io::Error::other's Display is its inner error's: nothing repeats.
        assert_eq!(with_causes(&outer), "Connection refused");
        #[derive(Debug, thiserror::Error)]
        #[error("error sending request")]
        struct Sending(#[source] std::io::Error);
        let e = Sending(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused",
        ));
        assert_eq!(with_causes(&e), "error sending request: Connection refused");
    }
}
