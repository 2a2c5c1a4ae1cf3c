//! TLS material for tests: a CA (named uniquely) and a server certificate with a DNS SAN.

/// DNS name in the test server certificate's SAN.
pub const TLS_SERVER_NAME: &str = "valkey.cluster.test";

/// Certificates generated for a TLS test (`ca.crt`, `tls.crt`, `tls.key` in a temp dir).
pub struct TlsFiles {
    /// The directory holding the files.
    pub dir: tempfile::TempDir,
    /// The CA certificate (PEM).
    pub ca_pem: Vec<u8>,
}

impl TlsFiles {
    /// A new CA and a server certificate for [`TLS_SERVER_NAME`].
    pub fn generate() -> Self {
        Self::generate_for(&[TLS_SERVER_NAME])
    }

    /// A new CA and a server certificate whose SANs are `sans` (DNS names, wildcards, or IP
    /// addresses), named after the first.
    pub fn generate_for(sans: &[&str]) -> Self {
        Self::generate_with_usages(sans, &[])
    }

    /// Same, with these extended key usages in the server certificate (none: the extension
    /// is left out, and the certificate is valid for any purpose).
    pub fn generate_with_usages(sans: &[&str], usages: &[rcgen::ExtendedKeyUsagePurpose]) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Each CA has its own name: OpenSSL picks a certificate's issuer by name, so two CAs of
        // one name in a bundle (a CA rotation) would be confused, as they would be in real life.
        static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ca_params.distinguished_name.push(
            DnType::CommonName,
            format!("valkey-ops test CA {}-{n}", std::process::id()),
        );
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(
            DnType::CommonName,
            sans.first().copied().unwrap_or("valkey"),
        );
        params.extended_key_usages = usages.to_vec();
        let cert = params.signed_by(&key, &issuer).expect("certificate");
        std::fs::write(dir.path().join("ca.crt"), ca_cert.pem()).expect("write");
        std::fs::write(dir.path().join("tls.crt"), cert.pem()).expect("write");
        std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).expect("write");
        Self {
            ca_pem: ca_cert.pem().into_bytes(),
            dir,
        }
    }

    /// Path of one of the files.
    pub fn path(&self, f: &str) -> String {
        self.dir.path().join(f).display().to_string()
    }
}
