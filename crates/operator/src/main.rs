//! `valkey-operator`: Kubernetes operator for Valkey in cluster mode.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use tracing::{error, info};
use valkey_operator::http::HttpState;
use valkey_operator::metrics::Metrics;
use valkey_operator::telemetry::{self, LogFormat};

/// Kubernetes operator for Valkey in cluster mode.
#[derive(Parser, Debug)]
#[command(name = "valkey-operator", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controllers (uses the kubeconfig or the in-cluster service account).
    Run(RunArgs),
    /// Print the ValkeyCluster and ValkeyNode CRDs as multi-document YAML.
    Crd,
    /// Print the operator version.
    Version,
}

/// Options of `valkey-operator run`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Address of the /healthz, /readyz and /metrics endpoints.
    #[arg(long, env = "METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,
    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let format = match &cli.command {
        Command::Run(args) => args.log_format,
        _ => LogFormat::Text,
    };
    telemetry::init(format);
    let result = match cli.command {
        Command::Run(args) => run(args).await,
        Command::Crd => print_crds(),
        Command::Version => {
            println!("valkey-operator {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn print_crds() -> anyhow::Result<()> {
    let yaml = valkey_api::crds_yaml()?;
    std::io::stdout()
        .write_all(yaml.as_bytes())
        .context("writing CRDs to stdout")
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => info!("SIGTERM received, shutting down"),
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => info!("SIGINT received, shutting down"),
            Err(e) => {
                error!("cannot listen for SIGINT: {e}");
                std::future::pending::<()>().await;
            }
        },
    }
}

/// Connects, checks that both CRDs are installed and established, then runs both controllers
/// and the HTTP endpoints until SIGTERM/SIGINT.
async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("building a Kubernetes client (kubeconfig or in-cluster)")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in valkey_api::crds() {
        let name = crd.metadata.name.unwrap_or_default();
        let installed = crds
            .get_opt(&name)
            .await
            .with_context(|| format!("reading CRD {name}"))?
            .with_context(|| {
                format!("CRD {name} is not installed: run `valkey-operator crd | kubectl apply --server-side -f -`")
            })?;
        let established = installed
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        anyhow::ensure!(
            established,
            "CRD {name} is installed but not Established yet"
        );
        info!(crd = %name, "CRD installed");
    }
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        // An error means the sender is gone, which also means stop.
        let _ = rx.wait_for(|s| *s).await;
    };
    let http_state = HttpState {
        metrics: metrics.clone(),
        ready: ready.clone(),
    };
    let http = tokio::spawn(valkey_operator::http::serve(
        args.metrics_address,
        http_state,
        stopped(stop_rx.clone()),
    ));
    let controllers = tokio::spawn(valkey_operator::run_controllers(
        client,
        metrics,
        stopped(stop_rx),
    ));
    ready.store(true, Ordering::Relaxed);
    info!("controllers running");
    shutdown_signal().await;
    let _ = stop_tx.send(true);
    controllers.await.context("controller task")?;
    http.await
        .context("http task")?
        .with_context(|| format!("serving on {}", args.metrics_address))?;
    info!("stopped");
    Ok(())
}
