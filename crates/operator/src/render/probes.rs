//! Readiness and liveness probe scripts (rendered into the ConfigMap, run by exec probes).
//!
//! Both authenticate as the read-only `_exporter` system user (whose password the pod already
//! holds for the metrics sidecar) rather than `_operator`, so no administrative credential is
//! mounted into the pod. With TLS they connect over TLS to the loopback address, skipping
//! certificate verification: the certificate names the pod's DNS names, not 127.0.0.1, and the
//! connection never leaves the pod.

use valkey_api::defaults::VALKEY_PORT;
use valkey_ops::commands::acl::EXPORTER_USER;

use super::paths::{CONFIG_DIR, DATA_DIR, SYSTEM_DIR, TLS_DIR};
use super::secrets::EXPORTER_PASSWORD_KEY;
use super::start::HOLD_MARKER;

/// ConfigMap key of the readiness script.
pub const READINESS_KEY: &str = "readiness.sh";
/// ConfigMap key of the liveness script.
pub const LIVENESS_KEY: &str = "liveness.sh";

/// Command of the readiness exec probe.
pub fn readiness_command() -> Vec<String> {
    vec!["sh".into(), format!("{CONFIG_DIR}/{READINESS_KEY}")]
}

/// Command of the liveness exec probe.
pub fn liveness_command() -> Vec<String> {
    vec!["sh".into(), format!("{CONFIG_DIR}/{LIVENESS_KEY}")]
}

/// Shell lines defining `cli`: `valkey-cli` authenticated as `_exporter` against the local
/// server (over TLS when `tls`), and `cli_flags`, its flags without the address, for other
/// nodes. Shared with the `preStop` hook (`render/handover.rs`) and the start script
/// (`render/start.rs`).
pub fn cli_prelude(tls: bool) -> String {
    // The certificate chain is verified against the cluster's CA (valkey-cli checks no host
    // name, and pods are dialled by IP): the password goes only to a server of the cluster.
    let tls_flags = if tls {
        format!(" --tls --cacert {TLS_DIR}/ca.crt")
    } else {
        String::new()
    };
    format!(
        "REDISCLI_AUTH=\"$(cat {SYSTEM_DIR}/{EXPORTER_PASSWORD_KEY})\" || exit 1\n\
         export REDISCLI_AUTH\n\
         cli_flags=\"--no-auth-warning{tls_flags} --user {EXPORTER_USER}\"\n\
         cli() {{ valkey-cli $cli_flags -h 127.0.0.1 -p {VALKEY_PORT} \"$@\"; }}\n"
    )
}

fn ping_prelude(tls: bool) -> String {
    format!("{}reply=\"$(cli PING 2>&1)\"\nrc=$?\n", cli_prelude(tls))
}

/// Readiness: an authenticated `PING` must answer `PONG` (a loading, failing or unreachable
/// server is not ready).
pub fn readiness_script(tls: bool) -> String {
    format!(
        "#!/bin/sh\n# Rendered by valkey-operator: readiness probe.\n{}\
         if [ \"$rc\" -eq 0 ] && [ \"$reply\" = \"PONG\" ]; then exit 0; fi\n\
         echo \"not ready: $reply\"\nexit 1\n",
        ping_prelude(tls)
    )
}

/// Liveness: the server answers at all. `PONG`, but also `LOADING`, `MASTERDOWN`, `BUSY` or an
/// auth error count as alive (valkey-cli exits 0 on error replies); only a failed connection
/// fails (a hung server is caught by the probe timeout). A restarted primary whose start
/// script holds it back (`render/start.rs`) is alive too.
pub fn liveness_script(tls: bool) -> String {
    format!(
        "#!/bin/sh\n# Rendered by valkey-operator: liveness probe.\n\
         [ -f {DATA_DIR}/{HOLD_MARKER} ] && exit 0\n{}\
         if [ \"$rc\" -eq 0 ] && [ -n \"$reply\" ]; then exit 0; fi\n\
         echo \"not alive: $reply\"\nexit 1\n",
        ping_prelude(tls)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_snapshot() {
        insta::assert_snapshot!("readiness_plain", readiness_script(false));
        insta::assert_snapshot!("liveness_tls", liveness_script(true));
    }

    /// Runs a rendered script with its paths and port pointed at `dir` / `port`.
    fn run_script(script: &str, dir: &std::path::Path, port: u16) -> bool {
        let script = script
            .replace(SYSTEM_DIR, &dir.display().to_string())
            .replace(TLS_DIR, &dir.display().to_string())
            .replace(&format!("-p {VALKEY_PORT}"), &format!("-p {port}"));
        let path = dir.join("probe.sh");
        std::fs::write(&path, script).unwrap();
        let out = std::process::Command::new("sh")
            .arg(&path)
            .output()
            .unwrap();
        if !out.status.success() {
            eprintln!(
                "probe failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        out.status.success()
    }

    /// Writes the ACL file of the system users (exporter password `pw`) into `dir`.
    fn write_system_users(dir: &std::path::Path) {
        let system = crate::render::secrets::SystemPasswords {
            operator: "op".into(),
            replication: "rep".into(),
            exporter: "pw".into(),
        };
        let rules =
            valkey_ops::commands::acl::system_acl_rules(&system.as_system_users(), 8).join("\n");
        std::fs::write(dir.join("users.acl"), format!("{rules}\n")).unwrap();
    }

    /// Debian's Valkey 8.0 (the TLS build) and its `valkey-cli`, which the probe scripts call;
    /// `None` (the test is skipped, and says why) when either is missing.
    fn valkey8_and_cli() -> Option<std::path::PathBuf> {
        if !std::path::Path::new("/usr/bin/valkey-cli").exists() {
            eprintln!("skipped: valkey-cli not installed");
            return None;
        }
        let bin = valkey_testkit::Flavor::V8.installed();
        if bin.is_none() {
            eprintln!("skipped: valkey-server 8 (TLS build) not installed");
        }
        bin
    }

    #[test]
    fn probes_against_a_real_server() {
        let Some(bin) = valkey8_and_cli() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let port = valkey_testkit::free_port();
        // Before the server runs: neither ready nor alive.
        std::fs::write(d.join(EXPORTER_PASSWORD_KEY), "pw").unwrap();
        assert!(!run_script(&readiness_script(false), d, port));
        assert!(!run_script(&liveness_script(false), d, port));

        write_system_users(d);
        let conf = d.join("valkey.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {p}\naclfile {p}/users.acl\n",
                p = d.display()
            ),
        )
        .unwrap();
        let _server = valkey_testkit::Server::start_config(&bin, &conf, port, &[]);
        assert!(run_script(&readiness_script(false), d, port));
        assert!(run_script(&liveness_script(false), d, port));
        // A wrong password: the server answers (alive) but the probe is not authenticated.
        std::fs::write(d.join(EXPORTER_PASSWORD_KEY), "wrong").unwrap();
        assert!(!run_script(&readiness_script(false), d, port));
        assert!(run_script(&liveness_script(false), d, port));
    }

    fn write_certs(dir: &std::path::Path) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A subject of its own: a leaf with the issuer's subject looks self-signed to OpenSSL.
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "probe test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        // Like a real pod certificate: it names the Service, not 127.0.0.1.
        let params = CertificateParams::new(vec!["valkey-c.ns.svc".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    }

    #[test]
    fn tls_config_and_probes_against_a_real_server() {
        let Some(bin) = valkey8_and_cli() else {
            return;
        };
        let spec: valkey_api::ValkeyClusterSpec = serde_json::from_value(serde_json::json!({
            "shards": 1, "image": "valkey/valkey:8.0.1",
            "networking": {"tls": {"certificate": {"secretName": "tls"}}}
        }))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let port = valkey_testkit::free_port();
        let conf = crate::render::valkey_conf::tests::localize(
            &crate::render::valkey_conf::render_valkey_conf(&spec),
            d,
            port,
        )
        .replace(TLS_DIR, &d.display().to_string());
        assert!(conf.contains(&format!("tls-port {port}")));
        write_certs(d);
        write_system_users(d);
        std::fs::write(d.join(EXPORTER_PASSWORD_KEY), "pw").unwrap();
        let path = d.join("valkey.conf");
        std::fs::write(&path, conf).unwrap();
        let _server = valkey_testkit::Server::start_config(
            &bin,
            &path,
            port,
            &["--cluster-announce-ip", "127.0.0.1"],
        );
        assert!(run_script(&readiness_script(true), d, port));
        assert!(run_script(&liveness_script(true), d, port));
        // Plain-text probes get no answer from a TLS-only server.
        assert!(!run_script(&readiness_script(false), d, port));
    }
}
