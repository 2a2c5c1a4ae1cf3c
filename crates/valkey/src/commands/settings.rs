//! `CONFIG SET` of several parameters at once, and `WAIT`.

use std::collections::HashMap;
use std::time::Duration;

use super::Result;
use crate::client::NodePool;

/// Bytes of a Valkey memory value (`1gb`, `100mb`, `64k`, `1024`), as the server parses it:
/// `k`/`m`/`g` are powers of 1000, `kb`/`mb`/`gb` powers of 1024, case-insensitive.
pub fn memory_bytes(value: &str) -> Option<u64> {
    let v = value.trim().to_ascii_lowercase();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let mul: u64 = match unit {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// Whether a value read with `CONFIG GET` (canonical: bytes, lowercase names) already is the
/// desired value written in the user's form (`64mb`, `AllKeys-LRU`).
pub fn same_config_value(current: &str, desired: &str) -> bool {
    if current.eq_ignore_ascii_case(desired.trim()) {
        return true;
    }
    matches!((memory_bytes(current), memory_bytes(desired)), (Some(a), Some(b)) if a == b)
}

/// Sets several configuration parameters in one `CONFIG SET` call (atomic on the server:
/// all or none), after a `CONFIG GET` so that parameters that already have the desired value
/// are not sent. Returns the names that were changed (empty when nothing was to do).
pub async fn config_set(
    pool: &NodePool,
    addr: &str,
    params: &[(&str, &str)],
) -> Result<Vec<String>> {
    if params.is_empty() {
        return Ok(Vec::new());
    }
    let mut get = redis::cmd("CONFIG");
    get.arg("GET");
    for (k, _) in params {
        get.arg(*k);
    }
    let current: HashMap<String, String> = pool.query(addr, &get).await?;
    let changes: Vec<(&str, &str)> = params
        .iter()
        .filter(|(k, v)| {
            current
                .get(&k.to_ascii_lowercase())
                .is_none_or(|c| !same_config_value(c, v))
        })
        .copied()
        .collect();
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let mut set = redis::cmd("CONFIG");
    set.arg("SET");
    for (k, v) in &changes {
        set.arg(*k).arg(*v);
    }
    let _: redis::Value = pool.query(addr, &set).await?;
    Ok(changes.iter().map(|(k, _)| (*k).to_owned()).collect())
}

/// Reloads the TLS certificate, key and CA bundle of the node at `addr` from `files`
/// (`tls-cert-file`, `tls-key-file`, `tls-ca-cert-file` and their paths): a `CONFIG SET` of
/// these parameters re-reads the files even when the paths are unchanged, and new connections
/// use them. The server keeps its previous TLS context when the files are not a valid pair.
pub async fn tls_reload(pool: &NodePool, addr: &str, files: &[(&str, &str)]) -> Result<()> {
    let mut set = redis::cmd("CONFIG");
    set.arg("SET");
    for (k, v) in files {
        set.arg(*k).arg(*v);
    }
    let _: redis::Value = pool.query(addr, &set).await?;
    Ok(())
}

/// `WAIT numreplicas timeout` on the node at `addr`: blocks until the writes made on this
/// connection are acknowledged by `numreplicas` replicas or `timeout` passes. Returns the
/// number of replicas that acknowledged.
pub async fn wait_replicas(
    pool: &NodePool,
    addr: &str,
    numreplicas: u32,
    timeout: Duration,
) -> Result<u64> {
    let conn = pool.connection(addr).await?;
    let mut conn = conn.with_response_timeout(timeout + pool.config().response_timeout);
    let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    Ok(conn
        .query(redis::cmd("WAIT").arg(numreplicas).arg(millis))
        .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_values_compare_in_bytes() {
        assert_eq!(memory_bytes("64mb"), Some(67_108_864));
        assert_eq!(memory_bytes("1GB"), Some(1 << 30));
        assert_eq!(memory_bytes("2k"), Some(2_000));
        assert_eq!(memory_bytes("512"), Some(512));
        assert_eq!(memory_bytes("lots"), None);
        assert!(same_config_value("67108864", "64mb"));
        assert!(same_config_value("allkeys-lru", "AllKeys-LRU"));
        assert!(same_config_value("10000", "10000"));
        assert!(!same_config_value("67108864", "65mb"));
        assert!(!same_config_value("noeviction", "allkeys-lru"));
    }
}
