//! The ACL file: `default` disabled, the least-privilege system users (rules from
//! `valkey_ops::commands::acl`), then `spec.users`, then a revision marker user.
//!
//! Passwords appear only as `#<sha256>` so neither the file nor its Secret holds a plain
//! password. Lines are in a stable order (system users, then `spec.users` in list order).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use valkey_api::ValkeyClusterSpec;
use valkey_api::users::UserSpec;
use valkey_ops::commands::acl::{
    acl_revision, password_rule, revision_marker_line, system_acl_rules,
};

use super::secrets::{SystemPasswords, secret_string};
use super::valkey_conf::valkey_major_from_image;

/// A rendered ACL file and its revision (also the ValkeyNode's `aclHash`).
#[derive(Clone, PartialEq, Eq)]
pub struct AclFile {
    /// File content.
    pub content: String,
    /// Revision: 16 hex digits of the SHA-256 of the rules (the marker user carries it).
    pub revision: String,
}

impl std::fmt::Debug for AclFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AclFile")
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

/// Why the users' passwords could not be resolved (reported as `UsersACLError`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AclError {
    /// The Secret named by a user's `passwordSecret` does not exist.
    #[error("Secret {secret:?} of user {user:?} not found")]
    SecretNotFound {
        /// User name.
        user: String,
        /// Secret name.
        secret: String,
    },
    /// A key is missing from the Secret or holds no usable password.
    #[error("key {key:?} of Secret {secret:?} (user {user:?}) is missing or not a valid password")]
    KeyMissing {
        /// User name.
        user: String,
        /// Secret name.
        secret: String,
        /// Secret key.
        key: String,
    },
}

/// Names of the Secrets referenced by `spec.users[].passwordSecret` (to read before rendering).
pub fn referenced_secrets(spec: &ValkeyClusterSpec) -> BTreeSet<String> {
    spec.users
        .iter()
        .flatten()
        .filter_map(|u| u.password_secret.as_ref().map(|p| p.name.clone()))
        .collect()
}

impl AclError {
    /// The user the problem is about.
    pub fn user(&self) -> &str {
        match self {
            Self::SecretNotFound { user, .. } | Self::KeyMissing { user, .. } => user,
        }
    }
}

/// The users' passwords that could be resolved, and the first problem of each other user.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ResolvedPasswords {
    /// User name → passwords, in the order of `passwordSecret.keys`.
    pub passwords: BTreeMap<String, Vec<String>>,
    /// Users whose Secret or key is missing.
    pub problems: Vec<AclError>,
}

/// Resolves each user's passwords from the observed Secrets (keyed by Secret name), in the
/// order of `passwordSecret.keys`; a user with a missing Secret or key is a problem, the others
/// are resolved.
pub fn resolve_user_passwords(
    spec: &ValkeyClusterSpec,
    secrets: &BTreeMap<String, Secret>,
) -> ResolvedPasswords {
    let mut out = ResolvedPasswords::default();
    for user in spec.users.iter().flatten() {
        let Some(ps) = &user.password_secret else {
            continue;
        };
        let Some(secret) = secrets.get(&ps.name) else {
            out.problems.push(AclError::SecretNotFound {
                user: user.name.clone(),
                secret: ps.name.clone(),
            });
            continue;
        };
        let passwords: Result<Vec<String>, AclError> = ps
            .keys
            .iter()
            .map(|key| {
                secret_string(secret, key).ok_or_else(|| AclError::KeyMissing {
                    user: user.name.clone(),
                    secret: ps.name.clone(),
                    key: key.clone(),
                })
            })
            .collect();
        match passwords {
            Ok(p) => {
                out.passwords.insert(user.name.clone(), p);
            }
            Err(e) => out.problems.push(e),
        }
    }
    out
}

fn with_sign(rule: &str, sign: char) -> String {
    if rule.starts_with('+') || rule.starts_with('-') {
        rule.to_owned()
    } else {
        format!("{sign}{rule}")
    }
}

/// The permission rules of one user as ACL tokens (keys, channels, commands, then the raw
/// `permissions` split at whitespace), without the state and password rules: what a server is
/// asked to accept before the user enters the file (see `check_user_rules` in valkey-ops).
pub fn user_rules(user: &UserSpec) -> Vec<String> {
    let mut rules = Vec::new();
    if let Some(keys) = &user.keys {
        rules.extend(keys.read_write.iter().flatten().map(|k| format!("~{k}")));
        rules.extend(keys.read_only.iter().flatten().map(|k| format!("%R~{k}")));
        rules.extend(keys.write_only.iter().flatten().map(|k| format!("%W~{k}")));
    }
    if let Some(ch) = &user.channels {
        rules.extend(ch.patterns.iter().flatten().map(|c| format!("&{c}")));
    }
    if let Some(cmds) = &user.commands {
        rules.extend(cmds.allow.iter().flatten().map(|c| with_sign(c, '+')));
        rules.extend(cmds.deny.iter().flatten().map(|c| with_sign(c, '-')));
    }
    if let Some(raw) = &user.permissions {
        rules.extend(raw.split_whitespace().map(str::to_owned));
    }
    rules
}

/// Whether `rules` (as [`user_rules`] gives them, in order) leave the user allowed to run
/// `ACL SETUSER`: then it can change or delete the operator's system users and lock the
/// operator out. `ACL SETUSER` is in `@admin`, `@dangerous` and `@slow`; the last rule that
/// names it or one of its categories decides.
pub fn may_change_acls(rules: &[String]) -> bool {
    const GRANTS: &[&str] = &[
        "@all",
        "@admin",
        "@dangerous",
        "@slow",
        "acl",
        "acl|setuser",
    ];
    let mut allowed = false;
    for r in rules {
        let r = r.to_ascii_lowercase();
        match r.as_str() {
            "allcommands" => allowed = true,
            "nocommands" => allowed = false,
            _ => {
                if let Some(name) = r.strip_prefix('+')
                    && GRANTS.contains(&name)
                {
                    allowed = true;
                } else if let Some(name) = r.strip_prefix('-')
                    && GRANTS.contains(&name)
                {
                    allowed = false;
                }
            }
        }
    }
    allowed
}

/// The users of `spec` whose rules allow changing ACLs ([`may_change_acls`]): the warning.
pub fn acl_admin_warning(spec: &valkey_api::ValkeyClusterSpec) -> Option<String> {
    let names: Vec<&str> = spec
        .users
        .iter()
        .flatten()
        .filter(|u| may_change_acls(&user_rules(u)))
        .map(|u| u.name.as_str())
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "users {} may run ACL SETUSER/DELUSER/LOAD: they can change or delete the \
             operator's system users and lock it out of the cluster; add -@admin (or -acl) to \
             their rules unless they administer ACLs on purpose",
            names.join(", ")
        )
    })
}

/// The ACL line of one user. `passwords` are the resolved plain passwords (hashed here).
pub fn user_line(user: &UserSpec, passwords: &[String]) -> String {
    let mut rules: Vec<String> = vec!["reset".into(), "on".into()];
    if user.nopass() {
        rules.push("nopass".into());
    }
    rules.extend(passwords.iter().map(|p| password_rule(p)));
    rules.extend(user_rules(user));
    format!("user {} {}", user.name, rules.join(" "))
}

/// The line of user `name` in an ACL file's `content`, if it has one.
pub fn previous_line<'a>(content: &'a str, name: &str) -> Option<&'a str> {
    let prefix = format!("user {name} ");
    content.lines().find(|l| l.starts_with(&prefix))
}

/// Renders the ACL file for `spec` with the system passwords and the resolved user passwords
/// (see [`resolve_user_passwords`]; users absent from the map get no password). A user in
/// `held` (a missing password, or rules a server refused or has not checked yet) keeps its line
/// of the `previous` file, or is left out when it has none: a file Valkey would refuse is
/// never written.
pub fn render_acl_file(
    spec: &ValkeyClusterSpec,
    system: &SystemPasswords,
    user_passwords: &BTreeMap<String, Vec<String>>,
    held: &BTreeSet<String>,
    previous: Option<&str>,
) -> AclFile {
    let mut lines = system_acl_rules(
        &system.as_system_users(),
        valkey_major_from_image(&spec.image),
    );
    for user in spec.users.iter().flatten() {
        if held.contains(&user.name) {
            if let Some(line) = previous.and_then(|p| previous_line(p, &user.name)) {
                lines.push(line.to_owned());
            }
            continue;
        }
        let pw = user_passwords
            .get(&user.name)
            .map(Vec::as_slice)
            .unwrap_or_default();
        lines.push(user_line(user, pw));
    }
    let revision = acl_revision(&lines);
    lines.push(revision_marker_line(&revision));
    let mut content = lines.join("\n");
    content.push('\n');
    AclFile { content, revision }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn spec(json: serde_json::Value) -> ValkeyClusterSpec {
        serde_json::from_value(json).unwrap()
    }

    fn system() -> SystemPasswords {
        SystemPasswords {
            operator: "op".into(),
            replication: "rep".into(),
            exporter: "exp".into(),
        }
    }

    fn users_spec() -> ValkeyClusterSpec {
        spec(serde_json::json!({
            "shards": 1,
            "users": [
                {"name": "alice",
                 "passwordSecret": {"name": "pw", "keys": ["alicepw", "alicepw2"]},
                 "commands": {"allow": ["@read", "@write", "@connection"], "deny": ["@admin", "@dangerous"]},
                 "keys": {"readWrite": ["app:*"], "readOnly": ["shared:*"], "writeOnly": ["log:*"]},
                 "channels": {"patterns": ["notifications:*"]}},
                {"name": "bob", "nopass": true, "permissions": "+@all ~* &*"}
            ]
        }))
    }

    fn pw_secret() -> Secret {
        Secret {
            data: Some(BTreeMap::from([
                ("alicepw".to_owned(), ByteString(b"s3cret".to_vec())),
                ("alicepw2".to_owned(), ByteString(b"n3w".to_vec())),
            ])),
            ..Default::default()
        }
    }

    #[test]
    fn acl_file_snapshot_and_no_plain_passwords() {
        let s = users_spec();
        let secrets = BTreeMap::from([("pw".to_owned(), pw_secret())]);
        let pws = resolve_user_passwords(&s, &secrets);
        assert!(pws.problems.is_empty());
        let file = render_acl_file(&s, &system(), &pws.passwords, &BTreeSet::new(), None);
        for plain in ["s3cret", "n3w", " >op", "rep ", "exp "] {
            assert!(!file.content.contains(plain), "{plain} leaked");
        }
        assert!(file.content.starts_with("user default reset off"));
        assert!(
            file.content
                .ends_with(&format!("{}\n", revision_marker_line(&file.revision)))
        );
        // System rules come from valkey-ops (tested there); snapshot only what this module adds.
        let system_rules = system_acl_rules(&system().as_system_users(), 9);
        let lines: Vec<&str> = file.content.lines().collect();
        assert_eq!(lines[..system_rules.len()], system_rules[..]);
        insta::assert_snapshot!(lines[system_rules.len()..lines.len() - 1].join("\n"));
    }

    #[test]
    fn revision_is_stable_and_follows_content() {
        let s = users_spec();
        let pws = BTreeMap::from([("alice".to_owned(), vec!["a".to_owned()])]);
        let none = BTreeSet::new();
        let a = render_acl_file(&s, &system(), &pws, &none, None);
        assert_eq!(a, render_acl_file(&s, &system(), &pws, &none, None));
        let pws2 = BTreeMap::from([("alice".to_owned(), vec!["b".to_owned()])]);
        assert_ne!(
            a.revision,
            render_acl_file(&s, &system(), &pws2, &none, None).revision
        );
    }

    #[test]
    fn missing_secret_or_key_is_a_problem_of_that_user_only() {
        let s = users_spec();
        let r = resolve_user_passwords(&s, &BTreeMap::new());
        assert_eq!(
            r.problems,
            [AclError::SecretNotFound {
                user: "alice".into(),
                secret: "pw".into()
            }]
        );
        assert!(r.passwords.is_empty());
        let mut sec = pw_secret();
        sec.data.as_mut().unwrap().remove("alicepw2");
        let secrets = BTreeMap::from([("pw".to_owned(), sec)]);
        let r = resolve_user_passwords(&s, &secrets);
        assert!(matches!(
            &r.problems[..],
            [AclError::KeyMissing { key, user, .. }] if key == "alicepw2" && user == "alice"
        ));
        assert_eq!(referenced_secrets(&s), BTreeSet::from(["pw".to_owned()]));
    }

    #[test]
    fn a_held_user_keeps_its_previous_line_or_is_left_out() {
        let s = users_spec();
        let pws = BTreeMap::from([("alice".to_owned(), vec!["a".to_owned()])]);
        let none = BTreeSet::new();
        let before = render_acl_file(&s, &system(), &pws, &none, None);
        let alice = previous_line(&before.content, "alice")
            .expect("alice")
            .to_owned();
        // alice's Secret went missing and bob's rules changed: alice keeps her line.
        let mut changed = s.clone();
        changed.users.as_mut().unwrap()[1].permissions = Some("+get ~*".into());
        let held = BTreeSet::from(["alice".to_owned()]);
        let after = render_acl_file(
            &changed,
            &system(),
            &BTreeMap::new(),
            &held,
            Some(&before.content),
        );
        assert_eq!(previous_line(&after.content, "alice"), Some(alice.as_str()));
        assert_eq!(
            previous_line(&after.content, "bob"),
            Some("user bob reset on nopass +get ~*")
        );
        // Without a previous file the held user is left out; the others are written.
        let fresh = render_acl_file(&changed, &system(), &BTreeMap::new(), &held, None);
        assert_eq!(previous_line(&fresh.content, "alice"), None);
        assert!(previous_line(&fresh.content, "bob").is_some());
        // "alice" is not mistaken for a user whose name starts with it.
        assert_eq!(previous_line("user alice2 reset on\n", "alice"), None);
    }

    #[test]
    fn user_rules_are_the_line_without_state_and_passwords() {
        let s = users_spec();
        let users = s.users.as_ref().unwrap();
        assert_eq!(user_rules(&users[1]), ["+@all", "~*", "&*"]);
        let line = user_line(&users[0], &["pw".to_owned()]);
        assert!(line.ends_with(&user_rules(&users[0]).join(" ")), "{line}");
    }

    #[test]
    fn acl_rights_follow_the_last_rule_that_names_them() {
        let r = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        for yes in [
            "+@all ~*",
            "allcommands",
            "+@slow",
            "+acl",
            "-@all +acl|setuser",
            "-@admin +@dangerous",
        ] {
            assert!(may_change_acls(&r(yes)), "{yes}");
        }
        for no in [
            "+@read ~*",
            "+@all -@admin",
            "+@all -acl",
            "+@all nocommands +get",
            "+@all -@slow",
        ] {
            assert!(!may_change_acls(&r(no)), "{no}");
        }
        let spec = spec(serde_json::json!({"shards": 1, "users": [
            {"name": "ops", "nopass": true, "permissions": "+@all ~*"},
            {"name": "app", "nopass": true, "permissions": "+@all -@admin ~*"}]}));
        let w = acl_admin_warning(&spec).unwrap();
        assert!(w.starts_with("users ops may run ACL SETUSER"), "{w}");
    }

    #[test]
    fn explicit_signs_are_kept() {
        let u: UserSpec = serde_json::from_value(serde_json::json!({
            "name": "x", "commands": {"allow": ["-@all", "+get"], "deny": ["flushall"]}
        }))
        .unwrap();
        assert_eq!(user_line(&u, &[]), "user x reset on -@all +get -flushall");
    }

    #[test]
    fn rendered_file_is_loaded_by_valkey() {
        // The real server must accept the whole file (ACL LOAD is all-or-nothing).
        let Some(bin) = valkey_testkit::Flavor::V8.installed() else {
            eprintln!("skipped: valkey-server 8 not installed");
            return;
        };
        let mut s = users_spec();
        s.image = "valkey/valkey:8.0.1".into();
        let pws = BTreeMap::from([("alice".to_owned(), vec!["a".to_owned()])]);
        let file = render_acl_file(&s, &system(), &pws, &BTreeSet::new(), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("users.acl"), &file.content).unwrap();
        let port = valkey_testkit::free_port();
        let conf = dir.path().join("valkey.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {d}\naclfile {d}/users.acl\n",
                d = dir.path().display()
            ),
        )
        .unwrap();
        let _server = valkey_testkit::Server::start_config(&bin, &conf, port, &[]);
    }
}
