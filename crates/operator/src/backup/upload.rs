//! Writing to the store: a shard's snapshot streamed from its node into a multipart upload
//! (held in memory only a few MiB at a time), split into keys on the way (so the count is
//! exact and a file a restore could not split fails the backup), and the manifest.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use valkey_ops::client::ClientConfig;
use valkey_ops::rdb::{RdbError, RecordReader, Summary};
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
    /// The node's RDB cannot be split into keys, so no restore could use it.
    #[error("the snapshot cannot be split into keys, so it could not be restored: {0}")]
    Unsplittable(RdbError),
}

/// A stored shard: what the node sent, and the keys the file holds.
pub struct Stored {
    /// The snapshot.
    pub info: SnapshotInfo,
    /// The file's keys, split as a restore will split them.
    pub summary: Summary,
}

/// A sink that also splits what passes through it into keys (dropping them: only the count
/// and whether the file splits matter here).
struct Splitting<W> {
    inner: W,
    /// The reader, or why the bytes so far cannot be split.
    state: Result<RecordReader, RdbError>,
}

impl<W> Splitting<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            state: Ok(RecordReader::new()),
        }
    }

    fn split(&mut self, data: &[u8]) {
        if let Ok(reader) = &mut self.state {
            match reader.feed(data) {
                Ok(()) => while reader.next_item().is_some() {},
                Err(e) => self.state = Err(e),
            }
        }
    }

    fn finish(self) -> (W, Result<Summary, RdbError>) {
        (self.inner, self.state.and_then(RecordReader::finish))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Splitting<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.split(&buf[..n]);
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Streams the snapshot of `source` to `path`; an incomplete upload, or one that cannot be
/// split into keys, is aborted.
pub async fn shard(
    store: Arc<dyn ObjectStore>,
    path: &Path,
    source: &ShardSource,
    config: &ClientConfig,
) -> Result<Stored, UploadError> {
    let writer = BufWriter::with_capacity(store, path.clone(), PART_SIZE)
        .with_max_concurrency(PARTS_IN_FLIGHT);
    let mut sink = Splitting::new(writer);
    let streamed = stream_snapshot(
        &source.addr.to_string(),
        config,
        &SnapshotOptions::default(),
        &mut sink,
    )
    .await;
    let (mut writer, summary) = sink.finish();
    let failed = match (streamed, summary) {
        (Ok(info), Ok(summary)) => {
            return match writer.shutdown().await {
                Ok(()) => Ok(Stored { info, summary }),
                Err(e) => Err(UploadError::Store(with_causes(&e))),
            };
        }
        (Err(SnapshotError::Sink(io)), _) => UploadError::Store(with_causes(&io)),
        (Err(other), _) => UploadError::Snapshot(other),
        (Ok(_), Err(e)) => UploadError::Unsplittable(e),
    };
    let _ = writer.abort().await;
    Err(failed)
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

#[cfg(test)]
mod splitting_tests {
    use super::*;

    /// A real Valkey 9.1 RDB (several databases, every type).
    const RDB: &[u8] = include_bytes!("../../../valkey/src/rdb/testdata/valkey-9.1.rdb");

    async fn split(data: &[u8]) -> (Vec<u8>, Result<Summary, RdbError>) {
        let mut sink = Splitting::new(Vec::new());
        for chunk in data.chunks(4093) {
            sink.write_all(chunk).await.unwrap();
        }
        sink.finish()
    }

    #[tokio::test]
    async fn every_key_of_every_database_is_counted_while_the_bytes_pass() {
        let (passed, summary) = split(RDB).await;
        assert_eq!(passed, RDB);
        let summary = summary.unwrap();
        assert!(summary.keys_per_db.len() > 1, "{:?}", summary.keys_per_db);
        assert_eq!(summary.keys, summary.keys_per_db.values().sum::<u64>());
    }

    #[tokio::test]
    async fn a_damaged_file_passes_but_does_not_split() {
        let mut damaged = RDB.to_vec();
        let cut = damaged.len() / 2;
        damaged.truncate(cut);
        let (passed, summary) = split(&damaged).await;
        assert_eq!(passed.len(), cut);
        assert!(summary.is_err());
    }
}
