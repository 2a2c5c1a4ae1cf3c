//! Which certificate a TLS server presents (for certificate rotation: a pod has reloaded its
//! certificate when it serves the one in the Secret).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Why the served certificate could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The address is not `ip:port`.
    #[error("{0} is not an ip:port address")]
    Address(String),
    /// Connecting or the handshake failed.
    #[error("TLS handshake with {addr}: {source}")]
    Handshake {
        addr: String,
        source: std::io::Error,
    },
    /// No answer within the timeout.
    #[error("TLS handshake with {0} timed out")]
    Timeout(String),
    /// The server sent no certificate.
    #[error("{0} presented no certificate")]
    NoCertificate(String),
}

/// The SHA-256 fingerprint (lowercase hex) of a DER certificate.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// Records the end-entity certificate and accepts it: the chain is not judged here, only
/// which certificate is presented (the operator's own client verifies it on every connection).
#[derive(Debug)]
struct Capture {
    seen: Mutex<Option<Vec<u8>>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(end_entity.to_vec());
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client configuration that trusts only the CA certificates in `ca_pem` (for connections
/// made here rather than through redis-rs, which builds its own from the same PEM).
pub(crate) fn verifying_client_config(ca_pem: &[u8]) -> Result<Arc<ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("CA bundle: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the CA bundle holds no certificate".into());
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Whether a TLS handshake failed only because the certificate is not valid for the server
/// name that was verified.
pub(crate) fn is_name_mismatch(err: &std::io::Error) -> bool {
    use rustls::CertificateError;
    matches!(
        err.get_ref()
            .and_then(|e| e.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        ))
    )
}

/// The end-entity certificate (DER) the TLS server at `addr` (`ip:port`) presents, read from
/// one handshake that is then closed.
pub async fn served_certificate(addr: &str, timeout: Duration) -> Result<Vec<u8>, ProbeError> {
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|_| ProbeError::Address(addr.to_owned()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let capture = Arc::new(Capture {
        seen: Mutex::new(None),
        provider: provider.clone(),
    });
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ProbeError::Handshake {
            addr: addr.to_owned(),
            source: std::io::Error::other(e),
        })?
        .dangerous()
        .with_custom_certificate_verifier(capture.clone())
        .with_no_client_auth();
    let handshake = async {
        let tcp = TcpStream::connect(sock).await?;
        let mut tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::IpAddress(sock.ip().into()), tcp)
            .await?;
        let _ = tls.shutdown().await;
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(timeout, handshake).await {
        Err(_) => return Err(ProbeError::Timeout(addr.to_owned())),
        Ok(Err(source)) => {
            return Err(ProbeError::Handshake {
                addr: addr.to_owned(),
                source,
            });
        }
        Ok(Ok(())) => {}
    }
    let seen = capture
        .seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    seen.ok_or_else(|| ProbeError::NoCertificate(addr.to_owned()))
}
