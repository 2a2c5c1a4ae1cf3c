//! The operator's HTTP endpoints: `/healthz` (process alive), `/readyz` (controllers started)
//! and Prometheus `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// Shared state of the endpoints.
#[derive(Clone, Debug)]
pub struct HttpState {
    /// Operator metrics.
    pub metrics: Arc<Metrics>,
    /// Set once the controllers run.
    pub ready: Arc<AtomicBool>,
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

/// The router with the three endpoints.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves the endpoints on `addr` until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    state: HttpState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn endpoints_answer_on_loopback() {
        let state = HttpState {
            metrics: Arc::new(Metrics::new()),
            ready: Arc::new(AtomicBool::new(false)),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut buf = String::new();
            s.read_to_string(&mut buf).await.unwrap();
            buf
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.0 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.0 503"));
        state.ready.store(true, Ordering::Relaxed);
        assert!(get("/readyz").await.starts_with("HTTP/1.0 200"));
        state
            .metrics
            .reconciled("valkeynode", std::time::Duration::ZERO, false);
        assert!(
            get("/metrics")
                .await
                .contains("valkey_operator_reconciles_total")
        );
    }
}
