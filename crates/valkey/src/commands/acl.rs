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
/// the `~*` key pattern; `MIGRATE` also sends `SELECT 0` to the target), `RESTORE` and
/// `FUNCTION LOAD` to restore a backup into a new cluster, connection handshake. No command
/// that reads data (`GET`, `SCAN`, `DUMP`, ...).
pub const OPERATOR_COMMANDS: &[&str] = &[
    "+cluster",
    "+config",
    "+acl|load",
    "+acl|list",
    "+acl|users",
    "+acl|getuser",
    "+acl|whoami",
    "+acl|setuser",
    "+acl|deluser",
    "+info",
    "+ping",
    "+echo",
    "+role",
    "+wait",
    "+dbsize",
    "+migrate",
    "+restore",
    "+function|load",
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

/// Read-only introspection used by redis_exporter and the pods' probes, hook and start
/// script; no key access, and nothing that returns a secret or data: not `CONFIG GET` (it
/// returns `primaryauth`, the replication user's password) nor `SLOWLOG GET` (it returns the
/// arguments of slow commands: keys and values). redis_exporter then exports no
/// `redis_config_*` and no last-slow-command figures; `redis_slowlog_length` stays.
pub const EXPORTER_COMMANDS: &[&str] = &[
    "+info",
    "+ping",
    "+echo",
    "+role",
    "+dbsize",
    "+cluster|info",
    "+cluster|nodes",
    "+cluster|shards",
    "+cluster|myid",
    "+client|list",
    "+client|info",
    "+client|setinfo",
    "+client|setname",
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

/// Prefix of the scratch users [`check_user_rules`] creates (reserved: users cannot start
/// with `_`).
pub const CHECK_USER_PREFIX: &str = "_check-";

/// Whether the server at `addr` accepts the ACL `rules` (tokens as in an ACL file line after
/// the user name): they are set on a disabled scratch user `_check-<tag>` (`ACL SETUSER`
/// applies all rules or none), which is then deleted. `Ok(None)` when accepted,
/// `Ok(Some(reason))` with the server's reason when refused; `Err` when the server could not
/// be asked (nothing is concluded).
pub async fn check_user_rules(
    pool: &NodePool,
    addr: &str,
    tag: &str,
    rules: &[String],
) -> Result<Option<String>> {
    let scratch = format!("{CHECK_USER_PREFIX}{tag}");
    let mut set = redis::cmd("ACL");
    set.arg("SETUSER").arg(&scratch).arg("reset").arg("off");
    for r in rules {
        set.arg(r);
    }
    let verdict = match pool.query::<redis::Value>(addr, &set).await {
        Ok(_) => None,
        // NOPERM: this operator user may not create users (an ACL file of an older
        // operator): nothing is concluded.
        Err(crate::client::ClientError::Server { source, .. })
            if source.code() != Some("NOPERM") =>
        {
            Some(
                source
                    .detail()
                    .map_or_else(|| source.to_string(), str::to_owned),
            )
        }
        Err(e) => return Err(e.into()),
    };
    let _: redis::Value = pool
        .query(addr, redis::cmd("ACL").arg("DELUSER").arg(&scratch))
        .await?;
    Ok(verdict)
}

/// Outcome of [`acl_load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AclLoadOutcome {
    /// The node already had the expected revision; nothing was loaded.
    AlreadyCurrent,
    /// `ACL LOAD` ran and the expected revision is now active.
    Loaded,
}

/// The users every ACL file defines for the cluster's own use (`default` disabled).
pub const SYSTEM_USER_NAMES: [&str; 4] =
    ["default", OPERATOR_USER, REPLICATION_USER, EXPORTER_USER];

/// What a server's ACL shows (`ACL LIST`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclState {
    /// The revision marker's revision (`None` without a marker user).
    pub revision: Option<String>,
    /// The first 16 hex digits of the SHA-256 of the system users' `ACL LIST` lines, as this
    /// server prints them (the normalisation differs between versions, so a digest is only
    /// compared with one taken on the same server version).
    pub system_digest: String,
}

impl AclState {
    /// The state shown by the lines of `ACL LIST`.
    pub fn from_list(lines: &[String]) -> Self {
        let revision = lines.iter().find_map(|l| {
            let name = l.strip_prefix("user ")?.split_whitespace().next()?;
            name.strip_prefix(REVISION_MARKER_PREFIX).map(str::to_owned)
        });
        let mut h = Sha256::new();
        for name in SYSTEM_USER_NAMES {
            let line = lines.iter().find(|l| {
                l.strip_prefix("user ")
                    .and_then(|r| r.split_whitespace().next())
                    == Some(name)
            });
            // A deleted system user digests differently from any present one.
            h.update(line.map_or("-", String::as_str).as_bytes());
            h.update(b"\n");
        }
        Self {
            revision,
            system_digest: hex::encode(h.finalize())[..16].to_owned(),
        }
    }
}

/// The node's ACL revision and system-user digest (`ACL LIST`).
pub async fn acl_state(pool: &NodePool, addr: &str) -> Result<AclState> {
    let lines: Vec<String> = pool.query(addr, redis::cmd("ACL").arg("LIST")).await?;
    Ok(AclState::from_list(&lines))
}

/// Sets the system users of the ACL file `content` on the node at `addr` again (`ACL SETUSER`
/// of their lines, each beginning with `reset`, so each ends with exactly the file's rules),
/// after someone allowed to change ACLs changed them on the server; other users are kept.
pub async fn restore_system_users(pool: &NodePool, addr: &str, content: &str) -> Result<()> {
    for (name, rules) in parse_acl_lines(content) {
        if !SYSTEM_USER_NAMES.contains(&name) {
            continue;
        }
        let mut set = redis::cmd("ACL");
        set.arg("SETUSER").arg(name);
        for r in rules {
            set.arg(r);
        }
        let _: redis::Value = pool.query(addr, &set).await?;
    }
    Ok(())
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

/// Whether `ACL LOAD` may crash a replica of this server version: Valkey 8.0 and 8.1.0
/// dereference the primary link's client, which has no user, while reloading (valkey-io/valkey
/// issue 1832, fixed by pull request 1842); on these versions [`acl_apply`] is used instead.
pub fn acl_load_unsafe(version: crate::Version) -> bool {
    version.major == 8 && (version.minor == 0 || (version.minor == 1 && version.patch == 0))
}

/// The user names and rule tokens of an ACL file's `user` lines.
pub fn parse_acl_lines(content: &str) -> Vec<(&str, Vec<&str>)> {
    content
        .lines()
        .filter_map(|l| {
            let mut t = l.split_whitespace();
            (t.next()? == "user").then_some(())?;
            let name = t.next()?;
            Some((name, t.collect()))
        })
        .collect()
}

/// Applies an ACL file's `content` to the node at `addr` without `ACL LOAD` (see
/// [`acl_load_unsafe`]): `ACL SETUSER` of every user line (each begins with `reset`, so a user
/// ends with exactly the file's rules), then `ACL DELUSER` of every other user, unless
/// `expected_revision` (the file's marker user) is already active; then verifies it.
pub async fn acl_apply(
    pool: &NodePool,
    addr: &str,
    content: &str,
    expected_revision: &str,
) -> Result<AclLoadOutcome> {
    if loaded_revision(pool, addr).await?.as_deref() == Some(expected_revision) {
        return Ok(AclLoadOutcome::AlreadyCurrent);
    }
    let lines = parse_acl_lines(content);
    for (name, rules) in &lines {
        let mut set = redis::cmd("ACL");
        set.arg("SETUSER").arg(*name);
        for r in rules {
            set.arg(*r);
        }
        let _: redis::Value = pool.query(addr, &set).await?;
    }
    let users: Vec<String> = pool.query(addr, redis::cmd("ACL").arg("USERS")).await?;
    let gone: Vec<&String> = users
        .iter()
        .filter(|u| u.as_str() != "default" && !lines.iter().any(|(n, _)| n == u))
        .collect();
    if !gone.is_empty() {
        let mut del = redis::cmd("ACL");
        del.arg("DELUSER");
        for u in gone {
            del.arg(u);
        }
        let _: redis::Value = pool.query(addr, &del).await?;
    }
    match loaded_revision(pool, addr).await? {
        Some(r) if r == expected_revision => Ok(AclLoadOutcome::Loaded),
        found => Err(CommandError::NotReady(format!(
            "ACL of {addr} has revision {found:?} after applying {expected_revision:?}"
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
    fn acl_state_digests_only_the_system_users() {
        let list = |exporter: &str, app: &str| -> Vec<String> {
            [
                "user _acl-rev-abc off resetchannels -@all",
                "user _exporter on #e resetchannels -@all +info",
                "user _operator on #o ~* resetchannels -@all +cluster",
                "user _replication on #r resetchannels -@all +psync",
                "user app on #a ~* &* +@all",
                "user default off resetchannels -@all",
            ]
            .iter()
            .map(|l| l.replace("+info", exporter).replace("+@all", app))
            .collect()
        };
        let base = AclState::from_list(&list("+info", "+@all"));
        assert_eq!(base.revision.as_deref(), Some("abc"));
        assert_eq!(base.system_digest.len(), 16);
        // An application user's change is not a system user's.
        assert_eq!(AclState::from_list(&list("+info", "+get")), base);
        // A system user's rules, or its absence, change the digest.
        assert_ne!(AclState::from_list(&list("+@all", "+@all")), base);
        let mut gone = list("+info", "+@all");
        gone.retain(|l| !l.starts_with("user _exporter "));
        assert_ne!(AclState::from_list(&gone).system_digest, base.system_digest);
        // No marker user: no revision.
        assert_eq!(AclState::from_list(&gone[1..]).revision, None);
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
