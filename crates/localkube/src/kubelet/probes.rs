//! Container probes (exec, tcpSocket, httpGet over HTTP or HTTPS, grpc) and the probe loops
//! that drive `started`, `ready` and liveness restarts, with the kubelet's
//! semantics for initialDelaySeconds, periodSeconds, timeoutSeconds,
//! successThreshold and failureThreshold.
//!
//! A `grpc` probe is done as the kubelet does it (k8s.io/kubernetes
//! pkg/probe/grpc): it dials `<podIP>:<port>` in plaintext (HTTP/2 without
//! TLS), retrying the connection until the probe's timeout as gRPC's
//! blocking dial does, and calls `grpc.health.v1.Health/Check` with the
//! probe's `service` (empty when unset) under the same deadline. It passes
//! only when the answer is `SERVING`; failures carry the kubelet's wording
//! (`service unhealthy (responded with "NOT_SERVING")`,
//! `timeout: failed to connect service "<addr>" within 1s: ...`,
//! `error: health rpc probe failed: rpc error: code = NotFound desc = ...`).
//! `mode: TLS` is not supported.
//!
//! An `httpGet` probe is a hand-written `GET` that reads the status line (2xx and 3xx pass);
//! `scheme: HTTPS` does not verify the server's certificate, as the kubelet does.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, GRPCAction, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::runtime::RunningContainer;

/// The `User-Agent` of the kubelet's HTTP and gRPC probes.
const PROBE_USER_AGENT: &str = "kube-probe/1.37";

/// Outcome of one probe attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeResult {
    /// Passed.
    Success,
    /// Failed, with the reason.
    Failure(String),
}

/// Timing and thresholds of a probe, defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeTiming {
    /// Wait before the first probe.
    pub initial_delay: Duration,
    /// Between probes.
    pub period: Duration,
    /// Per attempt.
    pub timeout: Duration,
    /// Consecutive successes to count as passed.
    pub success_threshold: u32,
    /// Consecutive failures to count as failed.
    pub failure_threshold: u32,
}

impl ProbeTiming {
    /// The probe's timing with Kubernetes defaults (period 10 s, timeout 1 s, thresholds 1/3).
    pub fn of(p: &Probe) -> Self {
        let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(0) as u64);
        ProbeTiming {
            initial_delay: secs(p.initial_delay_seconds, 0),
            period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
            timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
            success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
        }
    }
}

/// Consecutive-result bookkeeping of a probe.
#[derive(Debug, Clone, Default)]
pub struct Thresholds {
    successes: u32,
    failures: u32,
}

impl Thresholds {
    /// Records a result; returns `Some(true)` when the success threshold
    /// was just reached, `Some(false)` when the failure threshold was.
    pub fn record(&mut self, ok: bool, timing: &ProbeTiming) -> Option<bool> {
        if ok {
            self.failures = 0;
            self.successes += 1;
            (self.successes >= timing.success_threshold).then_some(true)
        } else {
            self.successes = 0;
            self.failures += 1;
            (self.failures >= timing.failure_threshold).then_some(false)
        }
    }
}

fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("invalid port {p}")),
        IntOrString::String(name) => {
            if let Ok(p) = name.parse::<u16>() {
                return Ok(p);
            }
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("port {name:?} not found in the container's ports"))
        }
    }
}

/// Runs one probe attempt against a container at `pod_ip`.
pub async fn probe_once(
    probe: &Probe,
    container: &Container,
    running: &RunningContainer,
    env: &[(String, String)],
    pod_ip: &str,
) -> ProbeResult {
    let timeout = ProbeTiming::of(probe).timeout;
    if let Some(exec) = &probe.exec {
        let argv = exec.command.clone().unwrap_or_default();
        return match running.exec_in(&argv, env, timeout).await {
            Ok(r) if r.exit_code == 0 => ProbeResult::Success,
            Ok(r) => ProbeResult::Failure(format!(
                "command {argv:?} exited with {}: {}",
                r.exit_code,
                r.output.trim()
            )),
            Err(e) => ProbeResult::Failure(e.to_string()),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = match resolve_port(&tcp.port, container) {
            Ok(p) => p,
            Err(e) => return ProbeResult::Failure(e),
        };
        let host = tcp.host.clone().unwrap_or_else(|| pod_ip.to_string());
        return match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await
        {
            Ok(Ok(_)) => ProbeResult::Success,
            Ok(Err(e)) => ProbeResult::Failure(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => ProbeResult::Failure(format!("dial tcp {host}:{port}: timeout")),
        };
    }
    if let Some(http) = &probe.http_get {
        let port = match resolve_port(&http.port, container) {
            Ok(p) => p,
            Err(e) => return ProbeResult::Failure(e),
        };
        let host = http.host.clone().unwrap_or_else(|| pod_ip.to_string());
        return probe_http(http, &host, port, timeout).await;
    }
    if let Some(grpc) = &probe.grpc {
        return probe_grpc(grpc, pod_ip, timeout).await;
    }
    ProbeResult::Failure("probe has no supported handler (exec, tcpSocket, httpGet, grpc)".into())
}

/// An `httpGet` probe of `host:port`: `GET` with the probe's headers, passed by a 2xx or 3xx
/// status. `scheme: HTTPS` speaks TLS without verifying the server's certificate, as the
/// kubelet does (`InsecureSkipVerify`). Only the status line is read (redirects are not
/// followed: a 3xx passes, as the kubelet treats a redirect it does not follow).
async fn probe_http(http: &HTTPGetAction, host: &str, port: u16, timeout: Duration) -> ProbeResult {
    let https = http.scheme.as_deref() == Some("HTTPS");
    let scheme = if https { "https" } else { "http" };
    let path = http.path.clone().unwrap_or_else(|| "/".into());
    let headers: String = http
        .http_headers
        .iter()
        .flatten()
        .map(|h| format!("{}: {}\r\n", h.name, h.value))
        .collect();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: {PROBE_USER_AGENT}\r\nAccept: */*\r\n{headers}Connection: close\r\n\r\n"
    );
    let fut = async {
        let tcp = TcpStream::connect((host, port)).await?;
        if https {
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let tls = tokio_rustls::TlsConnector::from(insecure_tls())
                .connect(name, tcp)
                .await?;
            status_line(tls, &req).await
        } else {
            status_line(tcp, &req).await
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(resp)) => {
            let code: u16 = resp
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            if (200..400).contains(&code) {
                ProbeResult::Success
            } else {
                ProbeResult::Failure(format!("HTTP probe failed with statuscode: {code}"))
            }
        }
        Ok(Err(e)) => ProbeResult::Failure(format!("Get {scheme}://{host}:{port}{path}: {e}")),
        Err(_) => ProbeResult::Failure(format!("Get {scheme}://{host}:{port}{path}: timeout")),
    }
}

/// Sends `req` and returns the start of the answer (its status line).
async fn status_line<S>(mut s: S, req: &str) -> std::io::Result<String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    s.write_all(req.as_bytes()).await?;
    let mut buf = vec![0u8; 256];
    let mut n = 0;
    while n < 16 {
        let m = s.read(&mut buf[n..]).await?;
        if m == 0 {
            break;
        }
        n += m;
    }
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A TLS client that accepts any server certificate (the handshake's signature is still
/// checked against it), as the kubelet's HTTPS probes do.
fn insecure_tls() -> std::sync::Arc<rustls::ClientConfig> {
    use std::sync::{Arc, OnceLock};
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// Accepts every server certificate; verifies handshake signatures with the provider.
#[derive(Debug)]
struct AnyCertificate(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A `grpc` probe of the pod at `pod_ip` (the kubelet dials the pod IP;
/// a gRPC action has no host).
async fn probe_grpc(grpc: &GRPCAction, pod_ip: &str, timeout: Duration) -> ProbeResult {
    let Ok(port) = u16::try_from(grpc.port) else {
        return ProbeResult::Failure(format!("invalid port {}", grpc.port));
    };
    if grpc.mode.as_deref() == Some("TLS") {
        return ProbeResult::Failure("TLS gRPC probes are not supported by localkube".into());
    }
    grpc_health_check(
        pod_ip,
        port,
        grpc.service.as_deref().unwrap_or_default(),
        timeout,
    )
    .await
}

/// Calls `grpc.health.v1.Health/Check` for `service` at `host:port` in
/// plaintext, connection and call within `timeout`; the messages are the
/// kubelet's (pkg/probe/grpc).
async fn grpc_health_check(host: &str, port: u16, service: &str, timeout: Duration) -> ProbeResult {
    let deadline = Instant::now() + timeout;
    // net.JoinHostPort
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let endpoint = match Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(PROBE_USER_AGENT))
    {
        Ok(e) => e.connect_timeout(timeout),
        Err(e) => {
            return ProbeResult::Failure(format!(
                "error: failed to connect service at {addr:?}: {e}"
            ));
        }
    };
    let connect_timed_out = || {
        ProbeResult::Failure(format!(
            "timeout: failed to connect service {addr:?} within {}: context deadline exceeded",
            go_duration(timeout)
        ))
    };
    // Like gRPC's blocking dial: a refused or failed connection is
    // transient and retried (with backoff) until the deadline.
    let mut backoff = Duration::from_millis(100);
    let channel = loop {
        match tokio::time::timeout_at(deadline, endpoint.connect()).await {
            Ok(Ok(channel)) => break channel,
            Ok(Err(_)) => {}
            Err(_) => return connect_timed_out(),
        }
        let next = Instant::now() + backoff;
        if next >= deadline {
            tokio::time::sleep_until(deadline).await;
            return connect_timed_out();
        }
        tokio::time::sleep_until(next).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    };

    let rpc_timed_out = || {
        ProbeResult::Failure(format!(
            "timeout: health rpc did not complete within {}",
            go_duration(timeout)
        ))
    };
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_string(),
    });
    request.set_timeout(deadline.saturating_duration_since(Instant::now()));
    let mut client = HealthClient::new(channel);
    match tokio::time::timeout_at(deadline, client.check(request)).await {
        Err(_) => rpc_timed_out(),
        Ok(Err(status)) => match status.code() {
            Code::Unimplemented => ProbeResult::Failure(format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            )),
            Code::DeadlineExceeded => rpc_timed_out(),
            code => ProbeResult::Failure(format!(
                "error: health rpc probe failed: rpc error: code = {} desc = {}",
                go_code_name(code),
                status.message()
            )),
        },
        Ok(Ok(response)) => {
            let status = response.into_inner().status;
            match ServingStatus::try_from(status) {
                Ok(ServingStatus::Serving) => ProbeResult::Success,
                Ok(s) => ProbeResult::Failure(format!(
                    "service unhealthy (responded with {:?})",
                    s.as_str_name()
                )),
                // Go prints an unknown enum value as its number.
                Err(_) => {
                    ProbeResult::Failure(format!("service unhealthy (responded with \"{status}\")"))
                }
            }
        }
    }
}

/// A gRPC status code as grpc-go names it (`codes.Code.String()`).
fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// A duration as Go's `time.Duration.String()` prints it (`1s`, `1m30s`,
/// `1.5s`, `500ms`).
fn go_duration(d: Duration) -> String {
    // `int.frac` with the fraction's trailing zeros (and a bare dot) dropped.
    fn decimal(int: u128, frac: u128, digits: usize) -> String {
        let frac = format!("{frac:0digits$}");
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            int.to_string()
        } else {
            format!("{int}.{frac}")
        }
    }
    let nanos = d.as_nanos();
    match nanos {
        0 => "0s".into(),
        1..1_000 => format!("{nanos}ns"),
        1_000..1_000_000 => format!("{}µs", decimal(nanos / 1_000, nanos % 1_000, 3)),
        1_000_000..1_000_000_000 => {
            format!("{}ms", decimal(nanos / 1_000_000, nanos % 1_000_000, 6))
        }
        _ => {
            let secs = d.as_secs();
            let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
            let mut out = String::new();
            if h > 0 {
                out.push_str(&format!("{h}h"));
            }
            if h > 0 || m > 0 {
                out.push_str(&format!("{m}m"));
            }
            out.push_str(&decimal(s.into(), d.subsec_nanos().into(), 9));
            out.push('s');
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_thresholds() {
        let t = ProbeTiming::of(&Probe::default());
        assert_eq!(t.period, Duration::from_secs(10));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        let mut th = Thresholds::default();
        assert_eq!(th.record(false, &t), None);
        assert_eq!(th.record(false, &t), None);
        assert_eq!(th.record(false, &t), Some(false));
        assert_eq!(th.record(true, &t), Some(true));
        let t2 = ProbeTiming {
            success_threshold: 2,
            ..t
        };
        let mut th = Thresholds::default();
        assert_eq!(th.record(true, &t2), None);
        assert_eq!(th.record(true, &t2), Some(true));
    }

    /// A one-shot-per-connection HTTP server on loopback answering `/ok` with 200 and
    /// anything else with 404, over TLS with a self-signed certificate when `tls`.
    async fn http_server(tls: bool) -> u16 {
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tls.then(|| {
            let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let key =
                rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
            let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
            let mut buf = vec![0u8; 1024];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).into_owned();
            let status = if req.starts_with("GET /ok ") && req.contains("X-Probe: yes\r\n") {
                "200 OK"
            } else {
                "404 Not Found"
            };
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await;
            let _ = s.shutdown().await;
        }
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => {
                            if let Ok(s) = a.accept(tcp).await {
                                answer(s).await;
                            }
                        }
                        None => answer(tcp).await,
                    }
                });
            }
        });
        port
    }

    fn http_get(path: &str, scheme: &str) -> HTTPGetAction {
        serde_json::from_value(serde_json::json!({
            "path": path, "port": 0, "scheme": scheme,
            "httpHeaders": [{"name": "X-Probe", "value": "yes"}],
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn http_and_https_probes() {
        let t = Duration::from_secs(2);
        for (scheme, tls) in [("HTTP", false), ("HTTPS", true)] {
            let port = http_server(tls).await;
            let get = |path: &str| http_get(path, scheme);
            assert_eq!(
                probe_http(&get("/ok"), "127.0.0.1", port, t).await,
                ProbeResult::Success,
                "{scheme}"
            );
            assert_eq!(
                probe_http(&get("/missing"), "127.0.0.1", port, t).await,
                ProbeResult::Failure("HTTP probe failed with statuscode: 404".into()),
                "{scheme}"
            );
        }
        // Plain HTTP against a TLS server fails (the server answers no HTTP).
        let port = http_server(true).await;
        assert!(matches!(
            probe_http(&http_get("/ok", "HTTP"), "127.0.0.1", port, t).await,
            ProbeResult::Failure(_)
        ));
        // Nothing listening.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let ProbeResult::Failure(msg) =
            probe_http(&http_get("/ok", "HTTPS"), "127.0.0.1", closed, t).await
        else {
            panic!("a closed port passed")
        };
        assert!(
            msg.starts_with(&format!("Get https://127.0.0.1:{closed}/ok: ")),
            "{msg}"
        );
    }

    #[test]
    fn named_ports() {
        let c = Container {
            name: "c".into(),
            ports: Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                name: Some("redis".into()),
                container_port: 6379,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(
            resolve_port(&IntOrString::String("redis".into()), &c),
            Ok(6379)
        );
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert!(resolve_port(&IntOrString::String("nope".into()), &c).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(go_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(go_duration(Duration::ZERO), "0s");
    }

    mod grpc {
        use std::net::SocketAddr;

        use tonic::service::Routes;
        use tonic::transport::Server;
        use tonic::transport::server::TcpIncoming;
        use tonic_health::ServingStatus;
        use tonic_health::server::{HealthReporter, health_reporter};

        use super::*;

        /// Generous for a loaded machine; the failures under test come
        /// from the server's answer, not from the deadline.
        const TIMEOUT: Duration = Duration::from_secs(10);

        async fn listen() -> (tokio::net::TcpListener, SocketAddr) {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            (listener, addr)
        }

        /// A real `grpc.health.v1.Health` server on an ephemeral port;
        /// the empty service is SERVING.
        async fn health_server() -> (SocketAddr, HealthReporter) {
            let (reporter, service) = health_reporter();
            let (listener, addr) = listen().await;
            tokio::spawn(
                Server::builder()
                    .add_service(service)
                    .serve_with_incoming(TcpIncoming::from(listener)),
            );
            (addr, reporter)
        }

        fn action(addr: SocketAddr, service: Option<&str>) -> GRPCAction {
            GRPCAction {
                port: addr.port().into(),
                service: service.map(Into::into),
                ..Default::default()
            }
        }

        #[tokio::test]
        async fn serving_passes() {
            let (addr, _reporter) = health_server().await;
            assert_eq!(
                probe_grpc(&action(addr, None), "127.0.0.1", TIMEOUT).await,
                ProbeResult::Success
            );
        }

        #[tokio::test]
        async fn not_serving_fails_with_the_kubelet_message() {
            let (addr, reporter) = health_server().await;
            reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
            assert_eq!(
                probe_grpc(&action(addr, None), "127.0.0.1", TIMEOUT).await,
                ProbeResult::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
            );
        }

        #[tokio::test]
        async fn the_service_field_is_asked_for() {
            let (addr, reporter) = health_server().await;
            reporter
                .set_service_status("valkey", ServingStatus::Serving)
                .await;
            reporter
                .set_service_status("sick", ServingStatus::NotServing)
                .await;
            assert_eq!(
                probe_grpc(&action(addr, Some("valkey")), "127.0.0.1", TIMEOUT).await,
                ProbeResult::Success
            );
            assert_eq!(
                probe_grpc(&action(addr, Some("sick")), "127.0.0.1", TIMEOUT).await,
                ProbeResult::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
            );
            // The empty service stays SERVING: the probe asked for "sick".
            assert_eq!(
                probe_grpc(&action(addr, Some("")), "127.0.0.1", TIMEOUT).await,
                ProbeResult::Success
            );
        }

        #[tokio::test]
        async fn unknown_service_is_a_not_found_rpc_error() {
            let (addr, _reporter) = health_server().await;
            assert_eq!(
                probe_grpc(&action(addr, Some("nope")), "127.0.0.1", TIMEOUT).await,
                ProbeResult::Failure(
                    "error: health rpc probe failed: rpc error: code = NotFound desc = service not registered"
                        .into()
                )
            );
        }

        #[tokio::test]
        async fn a_server_without_the_health_service_fails() {
            let (listener, addr) = listen().await;
            tokio::spawn(
                Server::builder()
                    .add_routes(Routes::default())
                    .serve_with_incoming(TcpIncoming::from(listener)),
            );
            assert_eq!(
                probe_grpc(&action(addr, None), "127.0.0.1", TIMEOUT).await,
                ProbeResult::Failure(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): "
                        .into()
                )
            );
        }

        #[tokio::test]
        async fn nothing_listening_times_out_connecting() {
            let (listener, addr) = listen().await;
            drop(listener);
            let started = Instant::now();
            let r = probe_grpc(&action(addr, None), "127.0.0.1", Duration::from_secs(1)).await;
            assert_eq!(
                r,
                ProbeResult::Failure(format!(
                    "timeout: failed to connect service \"{addr}\" within 1s: context deadline exceeded"
                ))
            );
            // Retried until the deadline, as gRPC's blocking dial does.
            assert!(started.elapsed() >= Duration::from_secs(1));
        }

        #[tokio::test]
        async fn unsupported_settings_fail() {
            let tls = GRPCAction {
                mode: Some("TLS".into()),
                port: 50051,
                ..Default::default()
            };
            assert!(matches!(
                probe_grpc(&tls, "127.0.0.1", TIMEOUT).await,
                ProbeResult::Failure(m) if m.contains("TLS")
            ));
            let bad = GRPCAction {
                port: 70000,
                ..Default::default()
            };
            assert_eq!(
                probe_grpc(&bad, "127.0.0.1", TIMEOUT).await,
                ProbeResult::Failure("invalid port 70000".into())
            );
        }
    }
}
