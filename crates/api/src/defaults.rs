//! Documented default values and well-known ports.

/// Valkey image used when `spec.image` is omitted.
pub const VALKEY_IMAGE: &str = "valkey/valkey:9.0.0";
/// Metrics exporter image used when `spec.exporter.image` is omitted.
pub const EXPORTER_IMAGE: &str = "oliver006/redis_exporter:v1.80.0";

/// Valkey client port.
pub const VALKEY_PORT: i32 = 6379;
/// Valkey cluster bus port (client port + 10000).
pub const CLUSTER_BUS_PORT: i32 = 16379;
/// Prometheus metrics port of the exporter sidecar.
pub const EXPORTER_PORT: i32 = 9121;

/// Name of the Valkey server container in every pod.
pub const SERVER_CONTAINER: &str = "server";
/// Name of the metrics exporter sidecar container.
pub const EXPORTER_CONTAINER: &str = "metrics-exporter";

/// Kubernetes' default pod termination grace period.
pub const KUBERNETES_GRACE_PERIOD_SECONDS: i64 = 30;
/// Valkey's default `cluster-manual-failover-timeout` (milliseconds).
pub const CLUSTER_MANUAL_FAILOVER_TIMEOUT_MS: i64 = 5_000;
/// Headroom added to the failover timeout when deriving the grace period.
pub const GRACE_PERIOD_BUFFER_SECONDS: i64 = 10;
