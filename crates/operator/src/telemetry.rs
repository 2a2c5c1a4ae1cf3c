//! Structured logging: JSON lines on stderr (or human-readable text), filtered by `RUST_LOG`.
//!
//! A stuck cluster is retried every few seconds, and each pass would log the same warning
//! again. The [`Repeats`] filter lets a line of a cluster's reconcile (an info, warning or
//! error inside a span with a `cluster` field) through when it first appears, then drops the
//! identical line for [`REPEAT_WINDOW`]; a line that says something new passes at once. The
//! lines let through per cluster are counted ([`lines_logged`]), so the log volume of a stuck
//! cluster is measurable.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber, span};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (default; for log collectors).
    #[default]
    Json,
    /// Human-readable text.
    Text,
}

/// How long an identical line of one cluster stays silent after it was logged.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(600);

/// Installs the global subscriber on stderr (`RUST_LOG` filter, default `info`). Safe to call
/// twice: the second call keeps the first subscriber.
pub fn init(format: LogFormat) {
    init_to(format, std::io::stderr);
}

/// Installs the global subscriber writing to `writer` (tests pass `std::io::sink` to count
/// lines without printing them).
pub fn init_to<W>(format: LogFormat, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let registry = tracing_subscriber::registry();
    let _ = match format {
        LogFormat::Json => registry
            .with(
                fmt.json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_filter(Repeats::new(filter)),
            )
            .try_init(),
        LogFormat::Text => registry
            .with(fmt.with_filter(Repeats::new(filter)))
            .try_init(),
    };
}

/// Lines logged so far for the cluster `namespace/name` (after [`Repeats`]).
pub fn lines_logged(cluster: &str) -> u64 {
    counts()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(cluster)
        .copied()
        .unwrap_or(0)
}

fn counts() -> &'static Mutex<HashMap<String, u64>> {
    static COUNTS: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    COUNTS.get_or_init(Mutex::default)
}

/// The `cluster` field of a span, kept in its extensions.
struct ClusterOf(String);

/// Finds the `cluster` field (span) or renders every field (event).
#[derive(Default)]
struct Fields {
    cluster: Option<String>,
    rendered: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "cluster" {
            self.cluster = Some(value.to_owned());
        }
        self.rendered.push_str(field.name());
        self.rendered.push('=');
        self.rendered.push_str(value);
        self.rendered.push(' ');
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

/// A per-layer filter: `inner` (the `RUST_LOG` filter), and no identical line of the same
/// cluster twice within [`REPEAT_WINDOW`].
pub struct Repeats<F> {
    inner: F,
    last: Mutex<HashMap<u64, Instant>>,
}

impl<F> Repeats<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        Self {
            inner,
            last: Mutex::default(),
        }
    }

    /// Whether a line with `key` logged `now` is new (then it is remembered).
    fn fresh(&self, key: u64, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.retain(|_, at| now.duration_since(*at) < REPEAT_WINDOW);
        if last.contains_key(&key) {
            return false;
        }
        last.insert(key, now);
        true
    }
}

impl<S, F> Filter<S> for Repeats<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    F: Filter<S>,
{
    fn enabled(&self, meta: &tracing::Metadata<'_>, cx: &Context<'_, S>) -> bool {
        self.inner.enabled(meta, cx)
    }

    fn callsite_enabled(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        // Every event must reach `event_enabled`; `enabled` still applies the inner filter.
        if self.inner.callsite_enabled(meta).is_never() {
            tracing::subscriber::Interest::never()
        } else {
            tracing::subscriber::Interest::sometimes()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        self.inner.max_level_hint()
    }

    fn event_enabled(&self, event: &Event<'_>, cx: &Context<'_, S>) -> bool {
        if !self.inner.event_enabled(event, cx) {
            return false;
        }
        if *event.metadata().level() > Level::INFO {
            return true;
        }
        let Some(cluster) = cx.event_scope(event).and_then(|scope| {
            scope
                .from_root()
                .find_map(|s| s.extensions().get::<ClusterOf>().map(|c| c.0.clone()))
        }) else {
            return true;
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&cluster, event.metadata().callsite(), &fields.rendered).hash(&mut h);
        if !self.fresh(h.finish(), Instant::now()) {
            return false;
        }
        *counts()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(cluster)
            .or_default() += 1;
        true
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, cx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let (Some(cluster), Some(span)) = (fields.cluster, cx.span(id)) {
            span.extensions_mut().insert(ClusterOf(cluster));
        }
        self.inner.on_new_span(attrs, id, cx);
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, cx: Context<'_, S>) {
        self.inner.on_record(id, values, cx);
    }

    fn on_enter(&self, id: &span::Id, cx: Context<'_, S>) {
        self.inner.on_enter(id, cx);
    }

    fn on_exit(&self, id: &span::Id, cx: Context<'_, S>) {
        self.inner.on_exit(id, cx);
    }

    fn on_close(&self, id: span::Id, cx: Context<'_, S>) {
        self.inner.on_close(id, cx);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_repeated_line_of_a_cluster_is_logged_once() {
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || out.clone())
                .with_filter(Repeats::new(EnvFilter::new("info"))),
        );
        tracing::subscriber::with_default(subscriber, || {
            for pass in 0..5 {
                let span = tracing::info_span!("pass", cluster = %"ns/stuck");
                let _g = span.enter();
                tracing::warn!(error = "slot 7 busy", "slot migration failed");
                tracing::debug!(pass, "debug lines are never held back");
                if pass == 3 {
                    tracing::warn!(error = "slot 8 busy", "slot migration failed");
                }
            }
            for _ in 0..2 {
                // Outside a cluster's reconcile nothing is held back.
                tracing::info!("controllers running");
            }
            let other = tracing::info_span!("pass", cluster = %"ns/other");
            let _g = other.enter();
            tracing::warn!(error = "slot 7 busy", "slot migration failed");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("slot 7 busy").count(), 2, "{text}");
        assert_eq!(text.matches("slot 8 busy").count(), 1, "{text}");
        assert_eq!(text.matches("controllers running").count(), 2, "{text}");
        assert_eq!(lines_logged("ns/stuck"), 2);
        assert_eq!(lines_logged("ns/other"), 1);
    }

    #[test]
    fn a_line_is_let_through_again_after_the_window() {
        let f = Repeats::new(());
        let t0 = Instant::now();
        assert!(f.fresh(1, t0));
        assert!(!f.fresh(1, t0 + Duration::from_secs(60)));
        assert!(f.fresh(2, t0 + Duration::from_secs(60)));
        assert!(f.fresh(1, t0 + REPEAT_WINDOW + Duration::from_secs(1)));
    }
}
