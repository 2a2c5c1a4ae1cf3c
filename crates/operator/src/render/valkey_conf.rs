//! The rendered `valkey.conf` and the cluster's ConfigMap.
//!
//! User `config` comes first, operator-owned settings last (Valkey keeps the last value of a
//! repeated key, so the operator's settings always win). No secret is written here: the
//! replication password is pulled in with an `include` of a file from the system Secret.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use sha2::{Digest, Sha256};
use valkey_api::ValkeyClusterSpec;
use valkey_api::defaults::VALKEY_PORT;
use valkey_ops::commands::acl::REPLICATION_USER;

use super::paths::{ACL_FILE, CONFIG_KEY, DATA_DIR, SYSTEM_DIR, TLS_DIR};
use super::{handover, names, probes, start};

/// Default `cluster-node-timeout` in milliseconds when the user sets none.
pub const DEFAULT_CLUSTER_NODE_TIMEOUT_MS: u32 = 5000;
/// Settings applied live with `CONFIG SET` (they do not roll the pods).
pub const LIVE_KEYS: &[&str] = &["maxclients", "maxmemory", "maxmemory-policy"];
/// Valkey's defaults of the [`LIVE_KEYS`] (the same on 7.2 to 9.x): what a running server
/// returns to when the user removes the key, as a restarted one would (the rendered
/// `valkey.conf` then has no such line).
pub const LIVE_DEFAULTS: &[(&str, &str)] = &[
    ("maxclients", "10000"),
    ("maxmemory", "0"),
    ("maxmemory-policy", "noeviction"),
];

/// Settings the operator picks when `spec.config` has none, written to `valkey.conf` but left
/// out of the restart hash: a pod started afterwards gets them, a running one keeps what it
/// has until its next restart (so introducing or changing one never rolls a cluster).
///
/// - `repl-diskless-sync-delay 0`: Valkey's default makes a primary wait 5 s before it
///   streams a full sync, in case more replicas arrive to share it. The operator attaches
///   replicas one at a time (a roll, a replaced pod, a new replica), so the wait only
///   delays the moment the shard has a synced copy again.
pub const RESTARTLESS_DEFAULTS: &[(&str, &str)] = &[("repl-diskless-sync-delay", "0")];

/// Major version of the Valkey server in `image`, from its tag (`valkey/valkey:9.0.0` → 9,
/// `…:8.1-alpine` → 8). An unknown tag (digest, `latest`, custom) is assumed to be ≥ 9, the
/// default image's version; only a tag that parses below 9 disables the 9-only settings.
pub fn valkey_major_from_image(image: &str) -> u32 {
    const ASSUMED: u32 = 9;
    let without_digest = image.split('@').next().unwrap_or(image);
    // The tag follows the last ':' after the last '/' (a registry port also uses ':').
    let last_segment = without_digest.rsplit('/').next().unwrap_or(without_digest);
    let Some((_, tag)) = last_segment.rsplit_once(':') else {
        return ASSUMED;
    };
    let tag = tag.strip_prefix('v').unwrap_or(tag);
    let digits: String = tag.chars().take_while(char::is_ascii_digit).collect();
    match digits.parse::<u32>() {
        Ok(major) if major > 0 => major,
        _ => ASSUMED,
    }
}

/// Whether `spec` enables TLS.
pub fn tls_enabled(spec: &ValkeyClusterSpec) -> bool {
    spec.tls_secret_name().is_some()
}

/// Whether `key` is applied live (case-insensitive).
pub fn is_live_key(key: &str) -> bool {
    LIVE_KEYS.iter().any(|k| k.eq_ignore_ascii_case(key))
}

/// The user's live-settable settings (lower-case keys), applied with `CONFIG SET`.
pub fn live_config(spec: &ValkeyClusterSpec) -> BTreeMap<String, String> {
    spec.config
        .iter()
        .flatten()
        .filter(|(k, _)| is_live_key(k))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
        .collect()
}

/// The live settings to put on a server: the user's (`live`, as in [`live_config`]), and
/// Valkey's default ([`LIVE_DEFAULTS`]) for each key in `previously` (set by the operator
/// before) that the user has removed since.
pub fn live_settings<'a>(
    live: Option<&'a BTreeMap<String, String>>,
    previously: &[String],
) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<(&str, &str)> = live
        .iter()
        .flat_map(|l| l.iter())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    for (k, default) in LIVE_DEFAULTS {
        let removed = previously.iter().any(|p| p.eq_ignore_ascii_case(k));
        if removed && !out.iter().any(|(have, _)| have == k) {
            out.push((k, default));
        }
    }
    out
}

fn config_line(key: &str, value: &str) -> String {
    if value.is_empty() {
        format!("{key} \"\"")
    } else {
        format!("{key} {value}")
    }
}

/// The `spec.config` lines of `valkey.conf` (operator-owned keys dropped; live keys only with
/// `include_live`), each ending in a newline; empty without user settings.
pub fn user_lines(spec: &ValkeyClusterSpec, include_live: bool) -> String {
    spec.config
        .iter()
        .flatten()
        .filter(|(k, _)| !is_owned(k) && (include_live || !is_live_key(k)))
        .map(|(k, v)| config_line(k, v) + "\n")
        .collect()
}

/// Renders `valkey.conf`. With `include_live` false the live-settable keys and the
/// [`RESTARTLESS_DEFAULTS`] are left out (used for the restart hash, so changing them does not
/// roll the pods).
fn render(spec: &ValkeyClusterSpec, include_live: bool) -> String {
    let mut out = String::from("# Rendered by valkey-operator. Do not edit.\n");
    let user = user_lines(spec, include_live);
    if !user.is_empty() {
        out.push_str("\n# spec.config\n");
        out.push_str(&user);
    }
    if include_live {
        let defaults: String = RESTARTLESS_DEFAULTS
            .iter()
            .filter(|(k, _)| spec.config_value(k).is_none())
            .map(|(k, v)| config_line(k, v) + "\n")
            .collect();
        if !defaults.is_empty() {
            out.push_str("\n# Operator defaults (a spec.config setting replaces them)\n");
            out.push_str(&defaults);
        }
    }
    out.push_str("\n# Operator-owned settings (last, so they win)\n");
    let mut lines: Vec<String> = Vec::new();
    if tls_enabled(spec) {
        lines.push("port 0".into());
        lines.push(format!("tls-port {VALKEY_PORT}"));
        lines.push("tls-cluster yes".into());
        lines.push("tls-replication yes".into());
        lines.push(format!("tls-cert-file {TLS_DIR}/tls.crt"));
        lines.push(format!("tls-key-file {TLS_DIR}/tls.key"));
        lines.push(format!("tls-ca-cert-file {TLS_DIR}/ca.crt"));
        // Clients authenticate with ACL passwords; a client certificate is verified when
        // presented but not required (the exporter, probes and applications need none).
        lines.push("tls-auth-clients optional".into());
    } else {
        lines.push(format!("port {VALKEY_PORT}"));
    }
    lines.push("bind * -::*".into());
    lines.push("cluster-enabled yes".into());
    lines.push(format!("cluster-config-file {DATA_DIR}/nodes.conf"));
    lines.push(format!("dir {DATA_DIR}"));
    if spec.config_value("cluster-node-timeout").is_none() {
        lines.push(format!(
            "cluster-node-timeout {DEFAULT_CLUSTER_NODE_TIMEOUT_MS}"
        ));
    }
    lines.push("cluster-allow-replica-migration no".into());
    if valkey_major_from_image(&spec.image) >= 9 {
        lines.push("shutdown-on-sigterm failover".into());
    }
    lines.push(format!("aclfile {ACL_FILE}"));
    lines.push(format!("primaryuser {REPLICATION_USER}"));
    // `primaryauth <password>` lives in the system Secret, never in this ConfigMap.
    lines.push(format!(
        "include {SYSTEM_DIR}/{}",
        super::secrets::REPLICATION_CONF_KEY
    ));
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// Defensive: operator-owned keys are rejected at admission; should one get through (an old
/// CRD), it is dropped rather than overriding the operator.
fn is_owned(key: &str) -> bool {
    valkey_api::config::is_operator_owned(key)
}

/// The full `valkey.conf` of a cluster.
pub fn render_valkey_conf(spec: &ValkeyClusterSpec) -> String {
    render(spec, true)
}

/// Stable hash (hex SHA-256, 16 digits) of everything in the ConfigMap that needs a restart to
/// take effect: the config without the live-settable keys, and the probe scripts. Put onto the
/// ValkeyNode (`spec.config.hash`) and the pod template; a change rolls the pods.
pub fn config_hash(spec: &ValkeyClusterSpec) -> String {
    let mut h = Sha256::new();
    for (k, v) in config_map_data(spec, false) {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())[..16].to_owned()
}

fn config_map_data(spec: &ValkeyClusterSpec, include_live: bool) -> BTreeMap<String, String> {
    let tls = tls_enabled(spec);
    BTreeMap::from([
        (CONFIG_KEY.to_owned(), render(spec, include_live)),
        (
            probes::READINESS_KEY.to_owned(),
            probes::readiness_script(tls),
        ),
        (
            probes::LIVENESS_KEY.to_owned(),
            probes::liveness_script(tls),
        ),
        (start::START_KEY.to_owned(), start::start_script(tls)),
        (
            handover::HANDOVER_KEY.to_owned(),
            handover::handover_script(
                tls,
                handover::handover_wait_seconds(spec.termination_grace_period_seconds()),
            ),
        ),
    ])
}

/// The ConfigMap `valkey-<cluster>-config` with `valkey.conf` and the probe scripts.
pub fn config_map(
    cluster_name: &str,
    namespace: &str,
    spec: &ValkeyClusterSpec,
    owner: Option<OwnerReference>,
) -> ConfigMap {
    ConfigMap {
        metadata: names::child_meta(
            names::config_map_name(cluster_name),
            cluster_name,
            namespace,
            owner,
        ),
        data: Some(config_map_data(spec, true)),
        ..Default::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> ValkeyClusterSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn major_version_from_tags() {
        assert_eq!(valkey_major_from_image("valkey/valkey:9.0.0"), 9);
        assert_eq!(valkey_major_from_image("valkey/valkey:8.1-alpine"), 8);
        assert_eq!(valkey_major_from_image("valkey/valkey:7"), 7);
        assert_eq!(valkey_major_from_image("reg.example:5000/valkey:8.0.1"), 8);
        assert_eq!(valkey_major_from_image("reg.example:5000/valkey"), 9);
        assert_eq!(valkey_major_from_image("valkey/valkey:latest"), 9);
        assert_eq!(valkey_major_from_image("valkey/valkey@sha256:abcd"), 9);
        assert_eq!(valkey_major_from_image("valkey/valkey:v10.1"), 10);
    }

    #[test]
    fn default_config_snapshot() {
        insta::assert_snapshot!(render_valkey_conf(&spec(serde_json::json!({"shards": 3}))));
    }

    #[test]
    fn tls_and_user_config_snapshot() {
        let s = spec(serde_json::json!({
            "shards": 3,
            "image": "valkey/valkey:8.1.0",
            "networking": {"tls": {"certificate": {"secretName": "tls"}}},
            "config": {"maxmemory-policy": "noeviction", "cluster-node-timeout": "15000",
                       "save": "", "io-threads": "4"}
        }));
        insta::assert_snapshot!(render_valkey_conf(&s));
    }

    #[test]
    fn user_config_first_operator_last_and_no_secrets() {
        let s = spec(serde_json::json!({"shards": 1, "config": {"appendonly": "yes"}}));
        let conf = render_valkey_conf(&s);
        let user = conf.find("appendonly yes").unwrap();
        let owned = conf.find("cluster-enabled yes").unwrap();
        assert!(user < owned);
        assert!(!conf.contains("primaryauth"));
        assert!(conf.contains("cluster-node-timeout 5000"));
        assert!(conf.contains("shutdown-on-sigterm failover"));
        let s8 = spec(serde_json::json!({"shards": 1, "image": "valkey/valkey:8.0.1"}));
        assert!(!render_valkey_conf(&s8).contains("shutdown-on-sigterm"));
    }

    #[test]
    fn restartless_defaults_yield_to_the_user_and_never_roll() {
        let plain = spec(serde_json::json!({"shards": 1}));
        assert!(render_valkey_conf(&plain).contains("\nrepl-diskless-sync-delay 0\n"));
        let user =
            spec(serde_json::json!({"shards": 1, "config": {"Repl-Diskless-Sync-Delay": "3"}}));
        let conf = render_valkey_conf(&user);
        assert!(conf.contains("Repl-Diskless-Sync-Delay 3"));
        assert!(!conf.contains("repl-diskless-sync-delay 0"));
        // Not in the restart hash: adding the default to the operator rolls no cluster.
        assert!(!render(&plain, false).contains("repl-diskless-sync-delay"));
    }

    #[test]
    fn owned_keys_never_override() {
        let s = spec(serde_json::json!({"shards": 1, "config": {"PORT": "1", "dir": "/tmp"}}));
        let conf = render_valkey_conf(&s);
        assert!(!conf.contains("PORT 1"));
        assert!(!conf.contains("dir /tmp"));
    }

    #[test]
    fn removed_live_settings_return_to_valkeys_defaults() {
        let user = BTreeMap::from([("maxmemory".to_owned(), "2gb".to_owned())]);
        let before = ["maxmemory".to_owned(), "maxclients".to_owned()];
        assert_eq!(
            live_settings(Some(&user), &before),
            vec![("maxmemory", "2gb"), ("maxclients", "10000")]
        );
        assert_eq!(live_settings(Some(&user), &[]), vec![("maxmemory", "2gb")]);
        assert_eq!(
            live_settings(None, &["maxmemory-policy".to_owned()]),
            vec![("maxmemory-policy", "noeviction")]
        );
        assert_eq!(
            LIVE_KEYS.to_vec(),
            LIVE_DEFAULTS.iter().map(|(k, _)| *k).collect::<Vec<_>>()
        );
    }

    #[test]
    fn hash_ignores_live_keys_but_not_others() {
        let a = spec(serde_json::json!({"shards": 1, "config": {"maxmemory": "1gb"}}));
        let b = spec(serde_json::json!({"shards": 1, "config": {"maxmemory": "2gb"}}));
        let c = spec(
            serde_json::json!({"shards": 1, "config": {"maxmemory": "2gb", "io-threads": "2"}}),
        );
        assert_eq!(config_hash(&a), config_hash(&b));
        assert_ne!(config_hash(&b), config_hash(&c));
        assert_eq!(config_hash(&a).len(), 16);
        assert_eq!(live_config(&b)["maxmemory"], "2gb");
        // The ConfigMap still carries live keys so a restarted pod starts with them.
        let cm = config_map("c", "ns", &b, None);
        assert!(cm.data.unwrap()[CONFIG_KEY].contains("maxmemory 2gb"));
    }

    #[test]
    fn rendered_config_is_accepted_by_valkey_8() {
        // The real server parses the rendered file (paths pointed at temporary files, loopback
        // only) and exits on any unknown or malformed directive.
        let Some(bin) = valkey_testkit::Flavor::V8.installed() else {
            eprintln!("skipped: valkey-server 8 not installed");
            return;
        };
        let s = spec(
            serde_json::json!({"shards": 1, "image": "valkey/valkey:8.0.1",
            "config": {"maxmemory-policy": "noeviction", "save": ""}}),
        );
        check_with_server(&bin, &render_valkey_conf(&s));
    }

    #[test]
    fn rendered_config_is_accepted_by_valkey_9() {
        let Some(bin) = valkey_testkit::Flavor::V9.installed() else {
            eprintln!("skipped: valkey-server-9 not installed");
            return;
        };
        let s = spec(serde_json::json!({"shards": 1}));
        check_with_server(&bin, &render_valkey_conf(&s));
    }

    /// Rewrites the pod paths to a temp dir and the port to a free loopback one.
    pub(crate) fn localize(conf: &str, dir: &std::path::Path, port: u16) -> String {
        let d = dir.display().to_string();
        std::fs::write(dir.join("users.acl"), "user default off\n").unwrap();
        std::fs::write(dir.join("replication.conf"), "primaryauth x\n").unwrap();
        conf.replace(ACL_FILE, &format!("{d}/users.acl"))
            .replace(
                &format!("{SYSTEM_DIR}/replication.conf"),
                &format!("{d}/replication.conf"),
            )
            .replace(&format!("dir {DATA_DIR}"), &format!("dir {d}"))
            .replace(
                &format!("{DATA_DIR}/nodes.conf"),
                &format!("{d}/nodes.conf"),
            )
            .replace("port 6379", &format!("port {port}"))
            .replace("bind * -::*", "bind 127.0.0.1")
    }

    fn check_with_server(bin: &std::path::Path, conf: &str) {
        let dir = tempfile::tempdir().unwrap();
        let port = valkey_testkit::free_port();
        let path = dir.path().join("valkey.conf");
        std::fs::write(&path, localize(conf, dir.path(), port)).unwrap();
        let _server = valkey_testkit::Server::start_config(
            bin,
            &path,
            port,
            &["--cluster-announce-ip", "127.0.0.1"],
        );
    }
}
