//! The restore's side effects on the store and the servers: reading a backup's manifest and
//! files from its store, and writing each file's keys into the cluster with `RESTORE`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use valkey_ops::SlotSet;
use valkey_ops::client::NodePool;
use valkey_ops::rdb::{Item, RecordReader};

use super::manifest::{MANIFEST_FILE, Manifest, ShardEntry};
use super::upload;

/// Keys sent to one primary in one pipeline.
const BATCH: usize = 512;

/// Why reading or restoring a backup stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Worth retrying (the store or a server failed).
    Retry(String),
    /// The backup cannot be restored as it is (missing, changed, unreadable).
    Refuse(String),
}

/// Reads and parses the manifest of the backup in `dir` (`location` names it in messages).
pub async fn read_manifest(
    store: &Arc<dyn ObjectStore>,
    dir: &str,
    location: &str,
) -> Result<Manifest, Failure> {
    let path = Path::from(dir).join(MANIFEST_FILE);
    let body = match store.get(&path).await {
        Ok(r) => r.bytes().await.map_err(|e| {
            Failure::Retry(format!(
                "reading {MANIFEST_FILE}: {}",
                upload::with_causes(&e)
            ))
        })?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Failure::Refuse(format!(
                "no {MANIFEST_FILE} at {location}: the backup is incomplete (its manifest is \
                 written last) or the path is wrong; nothing was restored"
            )));
        }
        Err(e) => {
            return Err(Failure::Retry(format!(
                "reading {MANIFEST_FILE}: {}",
                upload::with_causes(&e)
            )));
        }
    };
    serde_json::from_slice(&body).map_err(|e| {
        Failure::Refuse(format!(
            "{MANIFEST_FILE} at {location} is not a manifest: {e}"
        ))
    })
}

/// Reads a file once: its size and SHA-256 must be the manifest's.
pub async fn verify(
    store: &Arc<dyn ObjectStore>,
    dir: &str,
    s: &ShardEntry,
) -> Result<(), Failure> {
    let path = Path::from(dir).join(s.file.as_str());
    let mut stream = match store.get(&path).await {
        Ok(r) => r.into_stream(),
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Failure::Refuse(format!(
                "{} is missing from the backup; nothing was restored",
                s.file
            )));
        }
        Err(e) => {
            return Err(Failure::Retry(format!(
                "{}: {}",
                s.file,
                upload::with_causes(&e)
            )));
        }
    };
    let mut sha = Sha256::new();
    let mut len = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| Failure::Retry(format!("{}: {}", s.file, upload::with_causes(&e))))?;
        len += chunk.len() as u64;
        sha.update(&chunk);
    }
    let got = hex::encode(sha.finalize());
    if len != s.bytes || got != s.sha256 {
        return Err(Failure::Refuse(format!(
            "{}: {len} bytes with SHA-256 {got}, but the manifest lists {} bytes with SHA-256 \
             {}: the file was changed or is incomplete; nothing was restored",
            s.file, s.bytes, s.sha256
        )));
    }
    Ok(())
}

/// What one file gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Keys restored.
    pub keys: u64,
    /// Keys whose expiry had passed (not restored).
    pub expired: u64,
    /// Keys of slots the file's node was still importing (its owner's file has them).
    pub partial: u64,
    /// Bytes read.
    pub bytes: u64,
}

/// Streams one file into the cluster: each key to the primary `owners` gives for its slot,
/// function libraries to every one of `primaries`.
pub async fn restore_file(
    store: &Arc<dyn ObjectStore>,
    dir: &str,
    file: &str,
    owners: &[Option<SocketAddr>],
    primaries: &[SocketAddr],
    pool: &NodePool,
) -> Result<Restored, Failure> {
    let path = Path::from(dir).join(file);
    let mut stream = store
        .get(&path)
        .await
        .map_err(|e| Failure::Retry(format!("{file}: {}", upload::with_causes(&e))))?
        .into_stream();
    let mut reader = RecordReader::new();
    // Per primary and database: the pipeline being filled and its size.
    let mut batches: BTreeMap<(SocketAddr, u64), (redis::Pipeline, usize)> = BTreeMap::new();
    let (mut keys, mut expired, mut bytes) = (0u64, 0u64, 0u64);
    // Slots the file's node was importing when it saved: it held part of their keys only, and
    // the slots' owner's file holds them all.
    let mut importing = SlotSet::new();
    let mut partial = 0u64;
    let now_ms = Timestamp::now().as_millisecond();
    let mut done = false;
    while !done {
        match stream.next().await {
            Some(chunk) => {
                let chunk = chunk
                    .map_err(|e| Failure::Retry(format!("{file}: {}", upload::with_causes(&e))))?;
                bytes += chunk.len() as u64;
                reader
                    .feed(&chunk)
                    .map_err(|e| Failure::Refuse(format!("{file}: {e}; restore stopped")))?;
            }
            None => done = true,
        }
        while let Some(item) = reader.next_item() {
            match item {
                Item::Key(r) => {
                    let ttl = match r.expire_at_ms {
                        Some(at) if at <= now_ms => {
                            expired += 1;
                            continue;
                        }
                        Some(at) => at,
                        None => 0,
                    };
                    if importing.contains(r.slot()) {
                        partial += 1;
                        continue;
                    }
                    let Some(owner) = owners[usize::from(r.slot())] else {
                        return Err(Failure::Retry(format!(
                            "slot of a key in {file} has no owner"
                        )));
                    };
                    let (pipe, n) = batches
                        .entry((owner, r.db))
                        .or_insert_with(|| (redis::pipe(), 0));
                    pipe.cmd("RESTORE")
                        .arg(&r.key)
                        .arg(ttl)
                        .arg(&r.payload)
                        .arg("ABSTTL")
                        .arg("REPLACE")
                        .ignore();
                    *n += 1;
                    keys += 1;
                    if *n >= BATCH
                        && let Some((pipe, _)) = batches.remove(&(owner, r.db))
                    {
                        send(pool, owner, r.db, pipe, file).await?;
                    }
                }
                Item::SlotImport(import) => {
                    import
                        .ranges
                        .iter()
                        .for_each(|r| importing.insert_range(*r));
                }
                Item::Function(code) => {
                    for p in primaries {
                        pool.query::<redis::Value>(
                            &p.to_string(),
                            redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(&code),
                        )
                        .await
                        .map_err(|e| {
                            Failure::Retry(format!("{file}: FUNCTION LOAD on {p}: {e}"))
                        })?;
                    }
                }
            }
        }
    }
    reader
        .finish()
        .map_err(|e| Failure::Refuse(format!("{file}: {e}; restore stopped")))?;
    for ((owner, db), (pipe, _)) in std::mem::take(&mut batches) {
        send(pool, owner, db, pipe, file).await?;
    }
    Ok(Restored {
        keys,
        expired,
        partial,
        bytes,
    })
}

/// Sends one batch of `RESTORE`s; keys of a database other than 0 go there by `SELECT` (and
/// back: the restore's pool serves only this task, one pipeline at a time).
async fn send(
    pool: &NodePool,
    owner: SocketAddr,
    db: u64,
    restores: redis::Pipeline,
    file: &str,
) -> Result<(), Failure> {
    let pipe = if db == 0 {
        restores
    } else {
        let mut p = redis::pipe();
        p.cmd("SELECT").arg(db).ignore();
        for cmd in restores.cmd_iter() {
            p.add_command(cmd.clone()).ignore();
        }
        p.cmd("SELECT").arg(0).ignore();
        p
    };
    pool.pipeline::<()>(&owner.to_string(), &pipe)
        .await
        .map_err(|e| {
            Failure::Retry(format!(
                "{file}: RESTORE on {owner}: {}",
                first_failure(&e.to_string())
            ))
        })
}

/// A pipeline's error reduced to its first failure and how many there were (the client lists
/// every failed command).
fn first_failure(message: &str) -> String {
    const LIST: &str = "Pipeline failures: [";
    let Some(start) = message.find(LIST) else {
        return crate::text::clamp(message, 1024);
    };
    let list = &message[start + LIST.len()..];
    let count = list.matches("(Index ").count();
    let first = list
        .split("), (")
        .next()
        .unwrap_or_default()
        .trim_start_matches('(')
        .trim_end_matches(")]");
    crate::text::clamp(
        &format!("{}{first} ({count} commands failed)", &message[..start]),
        1024,
    )
}

#[cfg(test)]
mod tests {
    use super::first_failure;

    #[test]
    fn a_pipeline_error_is_reduced_to_its_first_failure() {
        let e = "10.0.0.1:6379 replied with error: Pipeline failures: [(Index 0, error: NoPerm: \
                 no permissions to run the 'restore' command), (Index 1, error: NoPerm: no \
                 permissions to run the 'restore' command)]";
        assert_eq!(
            first_failure(e),
            "10.0.0.1:6379 replied with error: Index 0, error: NoPerm: no permissions to run \
             the 'restore' command (2 commands failed)"
        );
        assert_eq!(first_failure("timed out"), "timed out");
    }
}
