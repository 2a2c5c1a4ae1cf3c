//! System ACL users (least privilege) and `ACL LOAD` with revision verification.
//!
//! Revision scheme: the rendered ACL file carries one disabled marker user
//! `_acl-rev-<revision>` (see [`revision_marker_line`]). After `ACL LOAD` the operator lists
//! the users and checks that exactly the expected marker is present. This detects a file
//! that was not yet updated on disk (e.g. a Secret volume still propagating) without comparing
//! `ACL LIST` output, whose normalisation differs between server versions. The marker user is
//! `off` with no password and no permissions, so nobody can authenticate as it.

use sha2::{Digest, Sha256};

use super::{CommandError, Result};
use crate::client::NodePool;

/// Name of the operator's system user.
pub const OPERATOR_USER: &str = "_operator";
/// Name of the replication system user (`primaryuser`/`masteruser`).
pub const REPLICATION_USER: &str = "_replication";
/// Name of the metrics exporter's system user.
pub const EXPORTER_USER: &str = "_exporter";
/// Prefix of the revision marker user.
pub const REVISION_MARKER_PREFIX: &str = "_acl-rev-";

/// Passwords of the system users.
#[derive(Clone)]
pub struct SystemUsers<'a> {
    /// Password of [`OPERATOR_USER`].
    pub operator_password: &'a str,
    /// Password of [`REPLICATION_USER`].
    pub replication_password: &'a str,
    /// Password of [`EXPORTER_USER`].
    pub exporter_password: &'a str,
}

impl std::fmt::Debug for SystemUsers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemUsers { <redacted> }")
    }
}

/// Commands the operator needs: cluster administration (all `CLUSTER` subcommands, including
/// `GETKEYSINSLOT`/`COUNTKEYSINSLOT`/`MIGRATESLOTS`), `CONFIG`, `ACL LOAD` and inspection,
/// `INFO`, `WAIT`, `MIGRATE` + `RESTORE-ASKING` for key-by-key slot migration (these two need
/// the `~*` key pattern; `MIGRATE` also sends `SELECT 0` to the target), connection handshake. No data commands (`GET`, `SET`, ...).
pub const OPERATOR_COMMANDS: &[&str] = &[
    "+cluster",
    "+config",
    "+acl|load",
    "+acl|list",
    "+acl|users",
    "+acl|getuser",
    "+acl|whoami",
    "+info",
    "+ping",
    "+echo",
    "+role",
    "+wait",
    "+dbsize",
    "+migrate",
    "+restore-asking",
    "+asking",
    "+select",
    "+client|setinfo",
    "+client|setname",
    "+client|id",
    "+client|info",
    "+client|list",
    "+auth",
    "+hello",
];

/// Commands the replication link needs on the primary (also used by atomic slot migration).
pub const REPLICATION_COMMANDS: &[&str] =
    &["+psync", "+sync", "+replconf", "+ping", "+auth", "+hello"];

/// Replication user rules on Valkey >= 9. Atomic slot migration's *target* executes the
/// source's snapshot and write stream with the permissions of the user it authenticated as at
/// the source (the replication user): on 9.1.2 an import failed with
/// `NOPERM ... _replication ... 'select'`. So this user needs write access to every key and
/// the `CLUSTER SYNCSLOTS` channel; `@admin` and `@dangerous` commands (FLUSHALL, CONFIG, ...)
/// stay denied (checked on 9.1.2: strings, lists, hashes, sets, sorted sets, streams, HLL and
/// TTLs migrate, also under concurrent writes). A replica already receives the whole dataset
/// through `PSYNC`, so read access adds no exposure.
pub const REPLICATION_RULES_V9: &[&str] = &[
    "&*",
    "+@all",
    "-@admin",
    "-@dangerous",
    "+psync",
    "+sync",
    "+replconf",
    "+cluster|syncslots",
];

/// Read-only introspection used by redis_exporter; no key access.
pub const EXPORTER_COMMANDS: &[&str] = &[
    "+info",
    "+ping",
    "+echo",
    "+role",
    "+dbsize",
    "+config|get",
    "+cluster|info",
    "+cluster|nodes",
    "+cluster|shards",
    "+cluster|myid",
    "+client|list",
    "+client|info",
    "+client|setinfo",
    "+client|setname",
    "+slowlog|get",
    "+slowlog|len",
    "+latency|latest",
    "+latency|histogram",
    "+latency|doctor",
    "+memory|stats",
    "+memory|doctor",
    "+module|list",
    "+command|count",
    "+select",
    "+auth",
    "+hello",
];

/// `#<sha256-hex>` ACL password rule (the file never holds the plain password).
pub fn password_rule(password: &str) -> String {
    format!("#{}", hex::encode(Sha256::digest(password.as_bytes())))
}

fn user_line(name: &str, password: &str, keys: &str, commands: &[&str]) -> String {
    format!(
        "user {name} reset on {} {keys} resetchannels -@all {}",
        password_rule(password),
        commands.join(" ")
    )
}

/// ACL file lines for the system users: `default` disabled, `_operator`, `_replication`,
/// `_exporter` (least privilege, hashed passwords) for a server of major version
/// `valkey_major` (rules naming unknown commands make the server refuse the whole file).
/// User-defined users are appended by the caller; the revision marker via
/// [`revision_marker_line`].
pub fn system_acl_rules(users: &SystemUsers<'_>, valkey_major: u32) -> Vec<String> {
    let (replication_keys, replication): (&str, Vec<&str>) = if valkey_major >= 9 {
        let mut v = REPLICATION_COMMANDS.to_vec();
        v.extend_from_slice(REPLICATION_RULES_V9);
        ("~*", v)
    } else {
        ("resetkeys", REPLICATION_COMMANDS.to_vec())
    };
    vec![
        "user default reset off resetchannels -@all".to_owned(),
        user_line(
            OPERATOR_USER,
            users.operator_password,
            "~*",
            OPERATOR_COMMANDS,
        ),
        user_line(
            REPLICATION_USER,
            users.replication_password,
            replication_keys,
            &replication,
        ),
        user_line(
            EXPORTER_USER,
            users.exporter_password,
            "resetkeys",
            EXPORTER_COMMANDS,
        ),
    ]
}

/// Revision of a set of ACL lines: the first 16 hex digits of their SHA-256.
pub fn acl_revision(lines: &[String]) -> String {
    let mut h = Sha256::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())[..16].to_owned()
}

/// The marker user line to add to an ACL file of revision `revision`.
pub fn revision_marker_line(revision: &str) -> String {
    format!("user {REVISION_MARKER_PREFIX}{revision} reset off resetchannels -@all")
}

/// Outcome of [`acl_load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AclLoadOutcome {
    /// The node already had the expected revision; nothing was loaded.
    AlreadyCurrent,
    /// `ACL LOAD` ran and the expected revision is now active.
    Loaded,
}

/// Revision marker currently loaded on the node (`None` if no marker user exists).
pub async fn loaded_revision(pool: &NodePool, addr: &str) -> Result<Option<String>> {
    let users: Vec<String> = pool.query(addr, redis::cmd("ACL").arg("USERS")).await?;
    Ok(users
        .iter()
        .find_map(|u| u.strip_prefix(REVISION_MARKER_PREFIX))
        .map(str::to_owned))
}

/// Loads the node's ACL file (`ACL LOAD`) unless `expected_revision` is already active, then
/// verifies the loaded revision. If the file on disk still has another revision (the mounted
/// Secret is not refreshed yet), [`CommandError::NotReady`] says which one was found. `ACL LOAD` is all-or-nothing on
/// the server: a file with an invalid line leaves the old rules in place.
pub async fn acl_load(
    pool: &NodePool,
    addr: &str,
    expected_revision: &str,
) -> Result<AclLoadOutcome> {
    if loaded_revision(pool, addr).await?.as_deref() == Some(expected_revision) {
        return Ok(AclLoadOutcome::AlreadyCurrent);
    }
    let _: redis::Value = pool.query(addr, redis::cmd("ACL").arg("LOAD")).await?;
    match loaded_revision(pool, addr).await? {
        Some(r) if r == expected_revision => Ok(AclLoadOutcome::Loaded),
        found => Err(CommandError::NotReady(format!(
            "ACL file on {addr} has revision {found:?}, expected {expected_revision:?} (file not updated yet)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users() -> SystemUsers<'static> {
        SystemUsers {
            operator_password: "op",
            replication_password: "rep",
            exporter_password: "exp",
        }
    }

    #[test]
    fn rules_have_no_plain_passwords_and_default_is_off() {
        let rules = system_acl_rules(&users(), 8);
        assert_eq!(rules.len(), 4);
        assert!(!rules[2].contains("syncslots"));
        assert!(system_acl_rules(&users(), 9)[2].contains("+cluster|syncslots"));
        assert!(rules[0].starts_with("user default reset off"));
        for r in &rules {
            assert!(!r.contains(">op") && !r.contains(">rep") && !r.contains(">exp"));
        }
        assert!(rules[1].contains(&password_rule("op")));
    }

    #[test]
    fn operator_has_no_data_commands() {
        for c in OPERATOR_COMMANDS.iter().chain(EXPORTER_COMMANDS) {
            assert!(!c.starts_with("+@"), "{c} grants a whole category");
            for data in ["+get", "+set", "+del", "+keys", "+scan", "+flushall"] {
                assert_ne!(*c, data);
            }
        }
    }

    #[test]
    fn revision_is_stable_and_sensitive() {
        let a = system_acl_rules(&users(), 9);
        let mut b = a.clone();
        assert_eq!(acl_revision(&a), acl_revision(&b));
        b.push("user x off".into());
        assert_ne!(acl_revision(&a), acl_revision(&b));
        assert_eq!(acl_revision(&a).len(), 16);
        assert!(revision_marker_line("abc").starts_with("user _acl-rev-abc "));
    }

    #[test]
    fn password_rule_is_sha256_hex() {
        assert_eq!(
            password_rule("foobar"),
            "#c3ab8ff13720e8ad9047dd39466b3c8974e592c2fa383d4a3960714caef0c4f2"
        );
    }
}
