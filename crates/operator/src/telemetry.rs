//! Structured logging: JSON lines on stderr (or human-readable text), filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (default; for log collectors).
    #[default]
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global subscriber (`RUST_LOG` filter, default `info`). Safe to call twice: the
/// second call keeps the first subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
