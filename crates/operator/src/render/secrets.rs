//! The system users' passwords and the two Secrets the operator owns (system, ACL).
//!
//! Passwords are generated once and then always read back from the observed Secrets, so they
//! are never rotated by accident (an operator restart, a re-render, a new operator version).
//! A copy lives in a second Secret: when one of the two is deleted, it is restored from the
//! other with the same passwords (new ones would lock the operator out of every running pod,
//! whose servers still hold the old ACL).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use rand::Rng;
use rand::distr::Alphanumeric;

use super::names;

/// System Secret key: password of `_operator`.
pub const OPERATOR_PASSWORD_KEY: &str = "operator-password";
/// System Secret key: password of `_replication`.
pub const REPLICATION_PASSWORD_KEY: &str = "replication-password";
/// System Secret key: password of `_exporter`.
pub const EXPORTER_PASSWORD_KEY: &str = "exporter-password";
/// System Secret key: `primaryauth <password>`, included by `valkey.conf`.
pub const REPLICATION_CONF_KEY: &str = "replication.conf";
/// Length of generated passwords (alphanumeric, ~238 bits).
pub const PASSWORD_LENGTH: usize = 40;

/// Passwords of the three system users. `Debug` never prints them.
#[derive(Clone, PartialEq, Eq)]
pub struct SystemPasswords {
    /// `_operator`.
    pub operator: String,
    /// `_replication`.
    pub replication: String,
    /// `_exporter`.
    pub exporter: String,
}

impl std::fmt::Debug for SystemPasswords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SystemPasswords { <redacted> }")
    }
}

impl SystemPasswords {
    /// As the borrowed form the `valkey-ops` ACL rules take.
    pub fn as_system_users(&self) -> valkey_ops::commands::acl::SystemUsers<'_> {
        valkey_ops::commands::acl::SystemUsers {
            operator_password: &self.operator,
            replication_password: &self.replication,
            exporter_password: &self.exporter,
        }
    }
}

/// A fresh random alphanumeric password of [`PASSWORD_LENGTH`] characters.
pub fn generate_password() -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(PASSWORD_LENGTH)
        .map(char::from)
        .collect()
}

/// A usable password stored under `key` of `secret` (non-empty UTF-8 without whitespace).
pub fn secret_string(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    let s = std::str::from_utf8(&bytes.0).ok()?;
    (!s.is_empty() && !s.chars().any(char::is_whitespace)).then(|| s.to_owned())
}

/// The system passwords: each is taken from the first of the observed `sources` (the system
/// Secret, then its backup) that holds a usable one; missing (or unusable) ones are generated
/// with `generate`.
pub fn system_passwords_with(
    sources: &[Option<&Secret>],
    mut generate: impl FnMut() -> String,
) -> SystemPasswords {
    let mut get = |key: &str| {
        sources
            .iter()
            .flatten()
            .find_map(|s| secret_string(s, key))
            .unwrap_or_else(&mut generate)
    };
    SystemPasswords {
        operator: get(OPERATOR_PASSWORD_KEY),
        replication: get(REPLICATION_PASSWORD_KEY),
        exporter: get(EXPORTER_PASSWORD_KEY),
    }
}

/// [`system_passwords_with`] using [`generate_password`].
pub fn system_passwords(sources: &[Option<&Secret>]) -> SystemPasswords {
    system_passwords_with(sources, generate_password)
}

fn bytes(s: &str) -> ByteString {
    ByteString(s.as_bytes().to_vec())
}

/// The system Secret `valkey-<cluster>-system`: the three passwords and `replication.conf`.
pub fn system_secret(
    cluster: &str,
    namespace: &str,
    passwords: &SystemPasswords,
    owner: Option<OwnerReference>,
) -> Secret {
    Secret {
        metadata: names::child_meta(
            names::system_secret_name(cluster),
            cluster,
            namespace,
            owner,
        ),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (OPERATOR_PASSWORD_KEY.to_owned(), bytes(&passwords.operator)),
            (
                REPLICATION_PASSWORD_KEY.to_owned(),
                bytes(&passwords.replication),
            ),
            (EXPORTER_PASSWORD_KEY.to_owned(), bytes(&passwords.exporter)),
            (
                REPLICATION_CONF_KEY.to_owned(),
                bytes(&format!("primaryauth {}\n", passwords.replication)),
            ),
        ])),
        ..Default::default()
    }
}

/// The backup of the system passwords, `valkey-<cluster>-system-backup` (the three passwords,
/// nothing a pod mounts).
pub fn system_backup_secret(
    cluster: &str,
    namespace: &str,
    passwords: &SystemPasswords,
    owner: Option<OwnerReference>,
) -> Secret {
    let mut secret = system_secret(cluster, namespace, passwords, owner);
    secret.metadata.name = Some(names::system_backup_secret_name(cluster));
    if let Some(data) = secret.data.as_mut() {
        data.remove(REPLICATION_CONF_KEY);
    }
    secret
}

/// The ACL Secret `valkey-<cluster>-acl` holding the rendered ACL file (hashed passwords only).
pub fn acl_secret(
    cluster: &str,
    namespace: &str,
    acl_file: &str,
    owner: Option<OwnerReference>,
) -> Secret {
    Secret {
        metadata: names::child_meta(names::acl_secret_name(cluster), cluster, namespace, owner),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            super::paths::ACL_KEY.to_owned(),
            bytes(acl_file),
        )])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_passwords_are_long_and_distinct() {
        let p = system_passwords(&[None, None]);
        assert_eq!(p.operator.len(), PASSWORD_LENGTH);
        assert!(p.operator.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(p.operator, p.replication);
        assert_ne!(p.replication, p.exporter);
        assert_eq!(format!("{p:?}"), "SystemPasswords { <redacted> }");
    }

    #[test]
    fn existing_passwords_are_kept() {
        let first = system_passwords(&[]);
        let secret = system_secret("c", "ns", &first, None);
        let again = system_passwords_with(&[Some(&secret), None], || panic!("must not generate"));
        assert_eq!(first, again);
    }

    #[test]
    fn a_deleted_system_secret_is_restored_from_its_backup_and_back() {
        let first = system_passwords(&[]);
        let backup = system_backup_secret("c", "ns", &first, None);
        assert_eq!(
            backup.metadata.name.as_deref(),
            Some("valkey-c-system-backup")
        );
        assert!(
            !backup
                .data
                .as_ref()
                .unwrap()
                .contains_key(REPLICATION_CONF_KEY)
        );
        let restored =
            system_passwords_with(&[None, Some(&backup)], || panic!("must not generate"));
        assert_eq!(restored, first);
        let system = system_secret("c", "ns", &first, None);
        let again = system_passwords_with(&[Some(&system), None], || panic!("must not generate"));
        assert_eq!(again, first);
    }

    #[test]
    fn only_missing_or_unusable_passwords_are_generated() {
        let mut secret = system_secret(
            "c",
            "ns",
            &SystemPasswords {
                operator: "op".into(),
                replication: "rep".into(),
                exporter: "exp".into(),
            },
            None,
        );
        let data = secret.data.as_mut().unwrap();
        data.remove(EXPORTER_PASSWORD_KEY);
        data.insert(REPLICATION_PASSWORD_KEY.into(), ByteString(vec![]));
        let p = system_passwords_with(&[Some(&secret)], || "new".into());
        assert_eq!(p.operator, "op");
        assert_eq!(p.replication, "new");
        assert_eq!(p.exporter, "new");
    }

    #[test]
    fn system_secret_carries_primaryauth_include() {
        let p = SystemPasswords {
            operator: "op".into(),
            replication: "rep".into(),
            exporter: "exp".into(),
        };
        let s = system_secret("c", "ns", &p, None);
        assert_eq!(s.metadata.name.as_deref(), Some("valkey-c-system"));
        assert!(
            secret_string(&s, REPLICATION_CONF_KEY).is_none(),
            "replication.conf contains a space, it is not a password"
        );
        assert_eq!(
            s.data.unwrap()[REPLICATION_CONF_KEY].0,
            b"primaryauth rep\n".to_vec()
        );
    }
}
