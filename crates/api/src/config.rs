//! `spec.config`: which Valkey settings users may set, and the admission rule enforcing it.

use kube::core::Rule;

/// Config keys owned by the operator (compared case-insensitively): setting them would break
/// cluster management, networking, persistence layout, ACL handling or graceful shutdown.
pub const OPERATOR_OWNED_KEYS: &[&str] = &[
    "aclfile",
    "bind",
    "bind-source-addr",
    "cluster-config-file",
    "cluster-enabled",
    "cluster-port",
    "daemonize",
    "dir",
    "include",
    "logfile",
    "masterauth",
    "masteruser",
    "pidfile",
    "port",
    "primaryauth",
    "primaryuser",
    "protected-mode",
    "rename-command",
    "replica-announce-ip",
    "replica-announce-port",
    "replicaof",
    "requirepass",
    "shutdown-on-sigterm",
    "slave-announce-ip",
    "slave-announce-port",
    "slaveof",
    "supervised",
    "unixsocket",
    "unixsocketperm",
];

/// Config key prefixes owned by the operator (compared case-insensitively).
pub const OPERATOR_OWNED_PREFIXES: &[&str] = &["cluster-announce-", "tls-"];

/// Maximum number of entries in `spec.config`.
pub const MAX_ENTRIES: u64 = 256;
/// Maximum length of a config key.
pub const MAX_KEY_LENGTH: u64 = 128;
/// Maximum length of a config value.
pub const MAX_VALUE_LENGTH: u64 = 4096;

/// Message of the rule rejecting operator-owned keys.
pub const OWNED_KEY_MESSAGE: &str = "spec.config must not set settings managed by the operator \
     (cluster-enabled, port, cluster-port, cluster-config-file, dir, aclfile, bind, \
     cluster-announce-*, tls-*, primaryuser/masteruser, primaryauth/masterauth, requirepass, \
     shutdown-on-sigterm, unixsocket, include, rename-command, daemonize, logfile, pidfile, \
     protected-mode, replicaof, ...): remove these keys";
/// Message of the rule rejecting malformed keys.
pub const KEY_FORMAT_MESSAGE: &str = "spec.config keys must be Valkey setting names \
     (letters, digits, '-', '_' or '.'; no spaces or newlines): fix the key";
/// Message of the rule rejecting values with line breaks.
pub const VALUE_NEWLINE_MESSAGE: &str =
    "spec.config values must not contain line breaks: put the value on a single line";

/// Whether `key` is a setting the operator owns (case-insensitive).
pub fn is_operator_owned(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    OPERATOR_OWNED_KEYS.contains(&key.as_str())
        || OPERATOR_OWNED_PREFIXES.iter().any(|p| key.starts_with(p))
}

/// CEL rule on the `config` map rejecting operator-owned keys.
pub fn owned_keys_rule() -> Rule {
    let keys = OPERATOR_OWNED_KEYS
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let prefixes = OPERATOR_OWNED_PREFIXES
        .iter()
        .map(|p| format!("k.lowerAscii().startsWith('{p}')"))
        .collect::<Vec<_>>()
        .join(" || ");
    Rule::new(format!(
        "self.all(k, !(k.lowerAscii() in [{keys}]) && !({prefixes}))"
    ))
    .message(OWNED_KEY_MESSAGE)
}

/// CEL rule on the `config` map requiring well-formed keys.
pub fn key_format_rule() -> Rule {
    Rule::new("self.all(k, k.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$'))").message(KEY_FORMAT_MESSAGE)
}

/// CEL rule on the `config` map rejecting values with line breaks.
pub fn value_newline_rule() -> Rule {
    Rule::new(r"self.all(k, !self[k].contains('\n') && !self[k].contains('\r'))")
        .message(VALUE_NEWLINE_MESSAGE)
}

/// Schema of the `config` map: bounded so the apiserver accepts the CEL rules' cost.
pub fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": MAX_ENTRIES,
        "additionalProperties": {"type": "string", "maxLength": MAX_VALUE_LENGTH},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_keys_are_case_insensitive() {
        assert!(is_operator_owned("port"));
        assert!(is_operator_owned("PORT"));
        assert!(is_operator_owned("tls-cert-file"));
        assert!(is_operator_owned("cluster-announce-ip"));
        assert!(!is_operator_owned("maxmemory"));
        assert!(!is_operator_owned("cluster-node-timeout"));
        assert!(!is_operator_owned("cluster-manual-failover-timeout"));
    }
}
