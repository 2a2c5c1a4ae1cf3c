//! `CONFIG SET` of several parameters at once, and `WAIT`.

use std::collections::HashMap;
use std::time::Duration;

use super::Result;
use crate::client::NodePool;

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
        .filter(|(k, v)| current.get(&k.to_ascii_lowercase()).map(String::as_str) != Some(*v))
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
