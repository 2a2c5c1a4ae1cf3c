//! The kubelet API the API server proxies to, so that `kubectl logs`, `kubectl exec` and
//! `kubectl port-forward` work: one HTTPS server per fake node on the node's `InternalIP` (all
//! nodes share the host's bridge address, so each has its own port, published as
//! `status.daemonEndpoints.kubeletEndpoint.Port`). Clients must present a certificate signed by
//! the cluster CA (the API server's kubelet client certificate), as a kubelet with
//! `--client-ca-file` requires.
//!
//! Served:
//! - `GET /containerLogs/{namespace}/{pod}/{container}` with `previous`, `follow`, `tailLines`
//!   and `limitBytes` (what `kubectl logs -p -f --tail --limit-bytes` send);
//! - `GET|POST /exec/{namespace}/{pod}[/{uid}]/{container}` with `command`, `input`, `output`,
//!   `error`, `tty`: an upgrade to SPDY/3.1, remote command protocol `v4.channel.k8s.io`
//!   ([`super::exec`]; the API server translates kubectl's WebSockets to it);
//! - `GET|POST /portForward/{namespace}/{pod}[/{uid}]`: an upgrade to SPDY/3.1, protocol
//!   `portforward.k8s.io` ([`super::portforward`]);
//! - `GET /healthz`.
//!
//! Not served (501): `attach` and `run`; WebSocket upgrades straight to the kubelet (the node
//! does not declare `ExtendWebSocketsToKubelet`, so the API server does not send them); exec
//! protocols before v4 (the API server offers v4); `timestamps` and `sinceSeconds`/`sinceTime`
//! of logs (the logs carry no timestamps). `exec -t` gets pipes, not a terminal.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;

use super::{PodHandle, Shared, exec, portforward};

/// The header carrying the remote command protocols (offered, then chosen).
const PROTOCOL_HEADER: &str = "X-Stream-Protocol-Version";

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
        .route("/exec/{namespace}/{pod}/{container}", get(exec).post(exec))
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(exec_with_uid).post(exec_with_uid),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(port_forward).post(port_forward),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(port_forward_with_uid).post(port_forward_with_uid),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_IMPLEMENTED,
                "localkube's kubelet serves only containerLogs, exec and portForward (kubectl \
                 logs, exec, port-forward); attach is not emulated\n",
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
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
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

/// `exec` of a pod on this node: checks the pod, the container and the upgrade request,
/// answers `101 Switching Protocols` (SPDY/3.1) and runs the session ([`exec::serve`]).
async fn exec(
    State(api): State<NodeApi>,
    UrlPath((namespace, pod, container)): UrlPath<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    start_exec(api, namespace, pod, None, container, query, req)
}

async fn exec_with_uid(
    State(api): State<NodeApi>,
    UrlPath((namespace, pod, uid, container)): UrlPath<(String, String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    start_exec(api, namespace, pod, Some(uid), container, query, req)
}

fn start_exec(
    api: NodeApi,
    namespace: String,
    pod: String,
    uid: Option<String>,
    container: String,
    query: Vec<(String, String)>,
    mut req: Request,
) -> Response {
    let error = |code: StatusCode, msg: String| (code, format!("{msg}\n")).into_response();
    let opts = exec::ExecOptions::from_query(&query);
    if opts.argv.is_empty() {
        return error(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 command".into(),
        );
    }
    if !(opts.stdin || opts.stdout || opts.stderr) {
        return error(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr".into(),
        );
    }
    let target = {
        let pods = api.shared.lock_pods();
        let handle = match pod_on_node(&api, &pods, &namespace, &pod, uid.as_deref()) {
            Ok(handle) => handle,
            Err(resp) => return *resp,
        };
        let known = {
            let st = handle.snapshot();
            st.containers
                .iter()
                .chain(st.init.iter())
                .any(|c| c.name == container)
        };
        if !known {
            return error(
                StatusCode::BAD_REQUEST,
                format!("container {container} is not valid for pod {pod}"),
            );
        }
        handle.exec_target(&container)
    };
    let Some((running, env)) = target else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("container {container} in pod {namespace}/{pod} is not running"),
        );
    };
    upgrade_and_serve(&mut req, exec::PROTOCOLS, "exec", move |io| {
        exec::serve(io, opts, running, env)
    })
}

/// `portForward` of a pod on this node: checks the pod and the upgrade request, answers `101
/// Switching Protocols` (SPDY/3.1) and serves the connection ([`portforward::serve`]).
async fn port_forward(
    State(api): State<NodeApi>,
    UrlPath((namespace, pod)): UrlPath<(String, String)>,
    req: Request,
) -> Response {
    start_port_forward(api, namespace, pod, None, req)
}

async fn port_forward_with_uid(
    State(api): State<NodeApi>,
    UrlPath((namespace, pod, uid)): UrlPath<(String, String, String)>,
    req: Request,
) -> Response {
    start_port_forward(api, namespace, pod, Some(uid), req)
}

fn start_port_forward(
    api: NodeApi,
    namespace: String,
    pod: String,
    uid: Option<String>,
    mut req: Request,
) -> Response {
    let error = |code: StatusCode, msg: String| (code, format!("{msg}\n")).into_response();
    let netns = {
        let pods = api.shared.lock_pods();
        let handle = match pod_on_node(&api, &pods, &namespace, &pod, uid.as_deref()) {
            Ok(handle) => handle,
            Err(resp) => return *resp,
        };
        match handle.sandbox() {
            Some(sb) => Some(sb.netns_path),
            // No sandbox of its own but running containers: host network.
            None if handle
                .snapshot()
                .containers
                .iter()
                .any(|c| c.running.is_some()) =>
            {
                None
            }
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("pod {namespace}/{pod} has no network namespace yet"),
                );
            }
        }
    };
    let target = portforward::Target {
        pod: format!("{namespace}/{pod}"),
        netns,
    };
    upgrade_and_serve(
        &mut req,
        portforward::PROTOCOLS,
        "port-forward",
        move |io| portforward::serve(io, target),
    )
}

/// The pod `namespace/name` (with `uid`, if given) running on the node of `api`, or the
/// `404 Not Found` answer.
fn pod_on_node<'a>(
    api: &NodeApi,
    pods: &'a std::collections::HashMap<String, PodHandle>,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<&'a PodHandle, Box<Response>> {
    pods.iter()
        .find(|(u, h)| {
            h.namespace == namespace
                && h.name == name
                && h.node == api.node
                && uid.is_none_or(|uid| uid == u.as_str())
        })
        .map(|(_, h)| h)
        .ok_or_else(|| {
            let msg = format!("pod {namespace}/{name} does not run on node {}\n", api.node);
            Box::new((StatusCode::NOT_FOUND, msg).into_response())
        })
}

/// Checks that `req` asks for an upgrade to SPDY/3.1 with one of `protocols` (the kubelet's
/// handshake): the pending upgrade and the protocol chosen, or the error response.
fn upgrade(
    req: &mut Request,
    protocols: &[&'static str],
) -> Result<(hyper::upgrade::OnUpgrade, &'static str), Box<Response>> {
    let headers = req.headers();
    let has = |name: header::HeaderName, want: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.to_ascii_lowercase().contains(want))
        })
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, "spdy/3.1") {
        return Err(Box::new(
            (
                StatusCode::BAD_REQUEST,
                "unable to upgrade: missing upgrade headers in request (SPDY/3.1 is served; \
                 WebSockets are translated by the API server)\n",
            )
                .into_response(),
        ));
    }
    let offered = headers
        .get_all(PROTOCOL_HEADER)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let Some(protocol) = negotiate(offered, protocols) else {
        let mut resp = (
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: unable to negotiate protocol: server accepts {protocols:?}\n"
            ),
        )
            .into_response();
        for p in protocols {
            resp.headers_mut().append(
                "X-Accepted-Stream-Protocol-Versions",
                header::HeaderValue::from_static(p),
            );
        }
        return Err(Box::new(resp));
    };
    Ok((hyper::upgrade::on(req), protocol))
}

/// The first protocol of the client's `X-Stream-Protocol-Version` values (comma-separated,
/// possibly repeated) that is in `served`.
pub fn negotiate<'a>(
    client: impl IntoIterator<Item = &'a str>,
    served: &[&'static str],
) -> Option<&'static str> {
    client
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| served.iter().copied().find(|s| *s == p))
}

/// `101 Switching Protocols` to SPDY/3.1 with `protocol`.
/// Answers `101 Switching Protocols` to a valid upgrade request ([`upgrade`]) and serves the
/// upgraded connection with `serve` (`what` names the session in logs); else the error.
fn upgrade_and_serve<Fut>(
    req: &mut Request,
    protocols: &[&'static str],
    what: &'static str,
    serve: impl FnOnce(TokioIo<hyper::upgrade::Upgraded>) -> Fut + Send + 'static,
) -> Response
where
    Fut: Future<Output = ()> + Send,
{
    let (on_upgrade, protocol) = match upgrade(req, protocols) {
        Ok(u) => u,
        Err(resp) => return *resp,
    };
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => serve(TokioIo::new(upgraded)).await,
            Err(e) => tracing::debug!(error = %e, "{what}: upgrade failed"),
        }
    });
    switching_protocols(protocol)
}

fn switching_protocols(protocol: &'static str) -> Response {
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header(PROTOCOL_HEADER, protocol)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiates_the_first_served_protocol_offered() {
        assert_eq!(
            negotiate(
                ["v5.channel.k8s.io, v4.channel.k8s.io", "v3.channel.k8s.io"],
                exec::PROTOCOLS
            ),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(negotiate(["v5.channel.k8s.io"], exec::PROTOCOLS), None);
        assert_eq!(negotiate([], exec::PROTOCOLS), None);
        assert_eq!(
            negotiate(["portforward.k8s.io"], portforward::PROTOCOLS),
            Some("portforward.k8s.io")
        );
    }

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
