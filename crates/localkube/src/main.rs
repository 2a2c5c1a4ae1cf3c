//! `localkube up|down`: run a local Kubernetes in the foreground, or clean up
//! after a crashed run.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "localkube",
    version,
    about = "A real Kubernetes control plane with process-backed pods"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the control plane and nodes; runs until SIGINT/SIGTERM.
    /// Writes DIR/kubeconfig, then DIR/ready once everything is ready.
    Up {
        #[arg(long)]
        dir: PathBuf,
        /// Number of nodes.
        #[arg(long, default_value_t = 6)]
        nodes: usize,
        /// Number of zones the nodes are spread over.
        #[arg(long, default_value_t = 3)]
        zones: usize,
        /// Do not run pods (control plane only).
        #[arg(long)]
        no_pods: bool,
    },
    /// Remove whatever a crashed `up` left behind in DIR (processes,
    /// network namespaces, bridge, mounts).
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The TLS provider, chosen here rather than left to rustls's crate features (see the
    // operator's `main`).
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Up {
            dir,
            nodes,
            zones,
            no_pods,
        } => {
            let dir = std::path::absolute(&dir)?;
            localkube::down(&dir);
            let _ = std::fs::remove_file(dir.join("ready"));
            let opts = localkube::Options {
                nodes,
                zones,
                kubelets: !no_pods && nodes > 0,
                dir: Some(dir.clone()),
                ..localkube::Options::default()
            };
            let env = localkube::Env::start(opts).await?;
            std::fs::write(dir.join("ready"), "ready\n")?;
            eprintln!(
                "localkube is ready: export KUBECONFIG={}",
                env.kubeconfig_path().display()
            );
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            eprintln!("localkube: stopping");
            let _ = std::fs::remove_file(dir.join("ready"));
            env.stop().await;
        }
        Command::Down { dir } => {
            let dir = std::path::absolute(&dir)?;
            localkube::down(&dir);
            let _ = std::fs::remove_file(dir.join("ready"));
        }
    }
    Ok(())
}
