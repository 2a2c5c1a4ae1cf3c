//! The kubelet API the API server proxies to, so that `kubectl logs` works: one HTTPS server
//! per fake node on the node's `InternalIP` (all nodes share the host's bridge address, so each
//! has its own port, published as `status.daemonEndpoints.kubeletEndpoint.Port`). Clients must
//! present a certificate signed by the cluster CA (the API server's kubelet client
//! certificate), as a kubelet with `--client-ca-file` requires.
//!
//! Served: `GET /containerLogs/{namespace}/{pod}/{container}` with `previous`, `follow`,
//! `tailLines` and `limitBytes` (what `kubectl logs -p -f --tail --limit-bytes` send), and
//! `GET /healthz`. Not served (501): `exec`, `attach`, `portForward` (they need SPDY
//! streams), `timestamps` and `sinceSeconds`/`sinceTime` (the logs carry no timestamps).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;

use super::Shared;

/// Files of the kubelets' serving certificate and of the CA their clients must chain to.
#[derive(Debug, Clone)]
pub struct KubeletTls {
    /// Serving certificate (PEM), valid for the nodes' address.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// CA of the client certificates accepted (PEM).
    pub client_ca: PathBuf,
}

/// How often a followed log is checked for new output.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// The TLS configuration of the servers: the serving certificate, client certificates of the
/// CA required.
pub fn tls_config(tls: &KubeletTls) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
        .with_context(|| format!("read {}", tls.cert.display()))?
        .collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(&tls.key)
        .with_context(|| format!("read {}", tls.key.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(&tls.client_ca)
        .with_context(|| format!("read {}", tls.client_ca.display()))?
    {
        roots.add(ca?)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[derive(Clone)]
struct NodeApi {
    shared: Arc<Shared>,
    node: String,
}

/// Serves the kubelet API of `node` on `listener` until the task is aborted.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    node: String,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_IMPLEMENTED,
                "localkube's kubelet serves only containerLogs (kubectl logs); exec, attach \
                 and port-forward are not emulated\n",
            )
        })
        .with_state(NodeApi { shared, node });
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Query of `containerLogs` (the kubelet's names).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    previous: bool,
    tail_lines: Option<i64>,
    limit_bytes: Option<u64>,
}

/// The last `n` lines of `text` (all of it when it has fewer).
pub fn tail_lines(text: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    // A final newline ends the last line; it does not start another.
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}

/// The log file of restart `restart` of `container` in the pod with `uid`.
fn log_file(state_dir: &Path, uid: &str, container: &str, restart: i32) -> PathBuf {
    state_dir
        .join("pods")
        .join(uid)
        .join("logs")
        .join(container)
        .join(format!("{restart}.log"))
}

/// Restart count of `container` in the pod `uid` on this node and whether it is running;
/// `None` when the pod or the container is gone.
fn container_now(api: &NodeApi, uid: &str, container: &str) -> Option<(i32, bool)> {
    let pods = api.shared.lock_pods();
    let st = pods.get(uid)?.snapshot();
    st.containers
        .iter()
        .chain(st.init.iter())
        .find(|c| c.name == container)
        .map(|c| (c.restart_count, c.running.is_some()))
}

async fn container_logs(
    State(api): State<NodeApi>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    Query(q): Query<LogQuery>,
) -> Response {
    let uid = {
        let pods = api.shared.lock_pods();
        pods.iter()
            .find(|(_, h)| h.namespace == namespace && h.name == pod && h.node == api.node)
            .map(|(uid, _)| uid.clone())
    };
    let Some(uid) = uid else {
        return (
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} does not run on node {}\n", api.node),
        )
            .into_response();
    };
    let Some((restarts, _)) = container_now(&api, &uid, &container) else {
        return (
            StatusCode::BAD_REQUEST,
            format!("container {container} is not valid for pod {pod}\n"),
        )
            .into_response();
    };
    let restart = if q.previous {
        if restarts == 0 {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "previous terminated container \"{container}\" in pod \"{pod}\" not found\n"
                ),
            )
                .into_response();
        }
        restarts - 1
    } else {
        restarts
    };
    let path = log_file(&api.shared.state_dir, &uid, &container, restart);
    let content = tokio::fs::read(&path).await.unwrap_or_default();
    let mut start = match q.tail_lines {
        Some(n) if n >= 0 => content.len() - tail_lines(&content, n as usize).len(),
        _ => 0,
    };
    let mut first = content[start..].to_vec();
    if let Some(limit) = q.limit_bytes {
        first.truncate(limit as usize);
    }
    if !q.follow || q.previous {
        return (StatusCode::OK, first).into_response();
    }
    start = content.len();
    let limit = q.limit_bytes;
    let sent = first.len() as u64;
    // Follow: new output as it is written, until this instance of the container has stopped
    // and its file is read to the end (or the pod is gone, or the limit is reached).
    let stream = futures::stream::unfold(
        (Some(first), start as u64, sent, api, uid, container, path),
        move |(pending, offset, sent, api, uid, container, path)| async move {
            if let Some(first) = pending {
                let state = (None, offset, sent, api, uid, container, path);
                return Some((Ok::<_, std::io::Error>(Bytes::from(first)), state));
            }
            loop {
                if limit.is_some_and(|l| sent >= l) {
                    return None;
                }
                let mut buf = Vec::new();
                if let Ok(mut f) = tokio::fs::File::open(&path).await
                    && f.seek(std::io::SeekFrom::Start(offset)).await.is_ok()
                {
                    let _ = f.read_to_end(&mut buf).await;
                }
                if let Some(l) = limit {
                    buf.truncate((l - sent) as usize);
                }
                if !buf.is_empty() {
                    let n = buf.len() as u64;
                    let state = (None, offset + n, sent + n, api, uid, container, path);
                    return Some((Ok(Bytes::from(buf)), state));
                }
                match container_now(&api, &uid, &container) {
                    Some((r, true)) if r == restart => {}
                    _ => return None,
                }
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        },
    );
    (StatusCode::OK, Body::from_stream(stream)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_counts_lines_from_the_end() {
        let t = b"a\nb\nc\n";
        assert_eq!(tail_lines(t, 1), b"c\n");
        assert_eq!(tail_lines(t, 2), b"b\nc\n");
        assert_eq!(tail_lines(t, 3), t);
        assert_eq!(tail_lines(t, 9), t);
        assert_eq!(tail_lines(t, 0), b"");
        assert_eq!(tail_lines(b"a\nb", 1), b"b");
        assert_eq!(tail_lines(b"", 2), b"");
    }
}
