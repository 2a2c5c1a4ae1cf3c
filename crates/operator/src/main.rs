//! `valkey-operator`: Kubernetes operator for Valkey in cluster mode.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};
use tracing::{error, info};

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
    Run,
    /// Print the ValkeyCluster and ValkeyNode CRDs as multi-document YAML.
    Crd,
    /// Print the operator version.
    Version,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run => run().await,
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

/// Connects, checks that both CRDs are installed and established, then stops: the controllers
/// arrive with issue 5.
async fn run() -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("building a Kubernetes client (kubeconfig or in-cluster)")?;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
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
    info!("controllers are not implemented yet (issue 5); exiting");
    Ok(())
}
