//! The operator's HTTP endpoints: `/healthz` (process alive), `/readyz` (started: running the
//! controllers, or a leader-election standby ready to take over) and Prometheus `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

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
    /// What the process is doing.
    pub phase: Arc<Readiness>,
}

/// What the process is doing, as `/readyz` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the CRDs: not ready (503 `starting`).
    Starting,
    /// Leader election on and another instance holds the Lease: no controller runs. Ready
    /// (200 `standby`), so that a rolling update of the Deployment can proceed: the new pod
    /// waits as a standby while the old one still leads.
    Standby,
    /// The controllers run (200 `ok`).
    Running,
}

/// The current [`Phase`], shared between the run loop and the endpoints.
#[derive(Debug, Default)]
pub struct Readiness(AtomicU8);

impl Readiness {
    /// Records `phase`.
    pub fn set(&self, phase: Phase) {
        self.0.store(phase as u8, Ordering::Relaxed);
    }

    /// The current phase.
    pub fn get(&self) -> Phase {
        match self.0.load(Ordering::Relaxed) {
            0 => Phase::Starting,
            1 => Phase::Standby,
            _ => Phase::Running,
        }
    }
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    match s.phase.get() {
        Phase::Starting => (StatusCode::SERVICE_UNAVAILABLE, "starting"),
        Phase::Standby => (StatusCode::OK, "standby"),
        Phase::Running => (StatusCode::OK, "ok"),
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
            phase: Arc::new(Readiness::default()),
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
        state.phase.set(Phase::Standby);
        let standby = get("/readyz").await;
        assert!(standby.starts_with("HTTP/1.0 200") && standby.ends_with("standby"));
        state.phase.set(Phase::Running);
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
