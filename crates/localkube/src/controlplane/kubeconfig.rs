//! Kubeconfig files for the admin and the controller components.

use std::path::Path;

use base64::Engine as _;

/// Writes a kubeconfig that reaches `server` with the given client certificate.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &str,
    cert: &Path,
    key: &Path,
    user: &str,
) -> std::io::Result<()> {
    let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
    let cert = std::fs::read(cert)?;
    let key = std::fs::read(key)?;
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: localkube
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: localkube
  context:
    cluster: localkube
    user: {user}
    namespace: default
current-context: localkube
",
        ca = b64(ca_pem.as_bytes()),
        cert = b64(&cert),
        key = b64(&key),
    );
    std::fs::write(path, text)
}
