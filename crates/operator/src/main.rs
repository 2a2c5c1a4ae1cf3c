//! `valkey-operator`: Kubernetes operator for Valkey in cluster mode.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use kube::Client;
use tracing::{error, info};
use valkey_operator::http::{HttpState, Phase, Readiness};
use valkey_operator::leader;
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
    /// Run the controllers only while holding a coordination.k8s.io Lease; other instances wait
    /// as standbys and take over when the holder stops or dies.
    #[arg(long, env = "VALKEY_OPERATOR_LEADER_ELECT")]
    leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "VALKEY_OPERATOR_LEASE_NAME",
        default_value = "valkey-operator"
    )]
    lease_name: String,
    /// Namespace of the leader-election Lease [default: $POD_NAMESPACE, else the service
    /// account's namespace, else `default`].
    #[arg(long, env = "VALKEY_OPERATOR_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Lease duration in seconds: a standby takes over at most this long (plus about a second)
    /// after the leader died; the leader renews a third of it (at least 2 s) before expiry.
    #[arg(
        long,
        env = "VALKEY_OPERATOR_LEASE_DURATION",
        default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(leader::MIN_DURATION_SECS..=3600)
    )]
    lease_duration: u64,
    /// Holder identity written in the Lease [default: $POD_NAME (else the host name), the pid
    /// and a random suffix].
    #[arg(long, env = "VALKEY_OPERATOR_LEASE_IDENTITY")]
    lease_identity: Option<String>,
    /// Serve the ValkeyClusters of this namespace only (its RBAC can then be a Role there;
    /// reading the CRDs still needs a ClusterRole) [default: every namespace].
    #[arg(long, env = "VALKEY_OPERATOR_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
}

impl RunArgs {
    /// The leader-election settings, `None` when it is off.
    fn election(&self) -> Option<leader::Config> {
        self.leader_elect.then(|| leader::Config {
            lease_name: self.lease_name.clone(),
            namespace: self
                .lease_namespace
                .clone()
                .unwrap_or_else(leader::default_namespace),
            identity: self
                .lease_identity
                .clone()
                .unwrap_or_else(leader::default_identity),
            duration_secs: self.lease_duration,
        })
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // The TLS provider of every client (Kubernetes API, Valkey), chosen here rather than left
    // to rustls's crate features: a build that unifies features with a crate enabling another
    // provider (as `cargo test --workspace` does) would otherwise have none by default.
    let _ = rustls::crypto::ring::default_provider().install_default();
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

/// Connects, serves the HTTP endpoints, waits until every CRD is Established, then runs the
/// controllers (with `--leader-elect`: only while holding the Lease) until SIGTERM/SIGINT.
async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = kube::Config::infer()
        .await
        .context("reading the Kubernetes client configuration (kubeconfig or in-cluster)")?;
    let client = valkey_operator::api_client::client(config)
        .context("building a Kubernetes client (kubeconfig or in-cluster)")?;
    let shutdown = shutdown_signal().boxed().shared();
    let metrics = Arc::new(Metrics::new());
    let phase = Arc::new(Readiness::default());
    let (http_stop, mut http_stop_rx) = tokio::sync::watch::channel(false);
    let http_state = HttpState {
        metrics: metrics.clone(),
        phase: phase.clone(),
    };
    let http = tokio::spawn(valkey_operator::http::serve(
        args.metrics_address,
        http_state,
        async move {
            // An error means the sender is gone, which also means stop.
            let _ = http_stop_rx.wait_for(|s| *s).await;
        },
    ));
    let result = operate(&args, client, metrics, phase, shutdown).await;
    let _ = http_stop.send(true);
    let served = http
        .await
        .context("http task")?
        .with_context(|| format!("serving on {}", args.metrics_address));
    result?;
    served?;
    info!("stopped");
    Ok(())
}

/// Waits for the CRDs, then runs the controllers until `shutdown`, or while leading.
async fn operate(
    args: &RunArgs,
    client: Client,
    metrics: Arc<Metrics>,
    phase: Arc<Readiness>,
    shutdown: Shared<BoxFuture<'static, ()>>,
) -> anyhow::Result<()> {
    tokio::select! {
        () = valkey_operator::crds::wait_all_established(&client) => {}
        () = shutdown.clone() => return Ok(()),
    }
    let scope = valkey_operator::Scope::from_option(args.watch_namespace.clone());
    info!(scope = %scope.describe(), "serving ValkeyClusters");
    let controllers = {
        let (client, metrics) = (client.clone(), metrics.clone());
        move |stop| valkey_operator::run_controllers(client, metrics, scope, stop)
    };
    if let Some(election) = args.election() {
        return leader::run(client, election, phase, metrics, shutdown, controllers).await;
    }
    phase.set(Phase::Running);
    metrics.set_leader(true);
    info!("controllers running");
    controllers(shutdown.boxed()).await;
    Ok(())
}
