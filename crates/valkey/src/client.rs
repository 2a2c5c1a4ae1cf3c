//! Per-node RESP client: authenticated (ACL user), optionally TLS, with timeouts and a small
//! connection pool keyed by node address.
//!
//! The operator talks to every Valkey pod directly by `ip:port`. With TLS the certificate is
//! verified against a configurable *server name* (a DNS SAN such as
//! `*.my-cluster.ns.svc`) while TCP still dials the pod IP: the server name is handed to
//! redis-rs as the connection host (used for SNI and verification) and a per-connection DNS
//! resolver maps it to the pod's socket address.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::io::AsyncDNSResolver;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue,
    Pipeline, RedisConnectionInfo, RedisError, TlsCertificates,
};
use tracing::debug;

/// Default time allowed to establish a connection (TCP + TLS + AUTH).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default time allowed for one command's reply.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of the node client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The client configuration is unusable (empty credentials, bad CA PEM, bad address).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The server rejected the operator's credentials. Never retried unauthenticated.
    #[error("authentication as {user:?} failed at {addr}: {source}")]
    Auth {
        /// Node address.
        addr: String,
        /// ACL user name.
        user: String,
        /// Underlying error.
        #[source]
        source: RedisError,
    },
    /// TCP/TLS connection could not be established or broke.
    #[error("connection to {addr} failed: {source}")]
    Connection {
        /// Node address.
        addr: String,
        /// Underlying error.
        #[source]
        source: RedisError,
    },
    /// The server did not answer within the response timeout.
    #[error("timeout talking to {addr}")]
    Timeout {
        /// Node address.
        addr: String,
    },
    /// The server answered with an error reply (e.g. `NOPERM`, `ERR ...`).
    #[error("{addr} replied with error: {source}")]
    Server {
        /// Node address.
        addr: String,
        /// Underlying error (its [`RedisError::code`] is the reply's error code).
        #[source]
        source: RedisError,
    },
}

impl ClientError {
    /// Whether the TLS handshake failed only because the certificate is not valid for the
    /// server name that was verified (another name may work). redis-rs keeps the rustls error
    /// only as text, so the text is what is matched (rustls' `NotValidForName` message).
    pub fn is_name_mismatch(&self) -> bool {
        let Self::Connection { source, .. } = self else {
            return false;
        };
        let text = source.to_string();
        text.contains("not valid for name") || text.contains("NotValidForName")
    }

    /// The server error code (`ERR`, `NOPERM`, `MOVED`, ...) if this is an error reply.
    pub fn server_code(&self) -> Option<&str> {
        match self {
            Self::Server { source, .. } => source.code(),
            _ => None,
        }
    }

    /// Full text of an error reply (code and detail) if this is an error reply.
    pub fn server_message(&self) -> Option<String> {
        match self {
            Self::Server { source, .. } => Some(format!(
                "{} {}",
                source.code().unwrap_or(""),
                source.detail().unwrap_or("")
            )),
            _ => None,
        }
    }

    /// Whether the connection was refused: the address is up but nothing listens on the port
    /// (the server process is not running).
    pub fn is_connection_refused(&self) -> bool {
        matches!(self, Self::Connection { source, .. } if source.is_connection_refusal())
    }

    /// Whether the server refused the credentials (a wrong password, or a user that is off or
    /// deleted).
    pub fn is_auth(&self) -> bool {
        matches!(self, Self::Auth { .. })
    }

    /// Whether the node could not be reached or the connection broke (not an error reply).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Connection { .. } | Self::Timeout { .. })
    }

    fn classify(addr: &str, user: &str, err: RedisError) -> Self {
        let addr = addr.to_owned();
        match err.kind() {
            ErrorKind::AuthenticationFailed => Self::Auth {
                addr,
                user: user.to_owned(),
                source: err,
            },
            ErrorKind::Server(redis::ServerErrorKind::NoPerm)
                if err.detail().is_some_and(|d| d.contains("AUTH")) =>
            {
                Self::Auth {
                    addr,
                    user: user.to_owned(),
                    source: err,
                }
            }
            ErrorKind::Server(_) | ErrorKind::Extension => Self::Server { addr, source: err },
            _ if err.is_timeout() => Self::Timeout { addr },
            _ => Self::Connection { addr, source: err },
        }
    }
}

/// TLS settings for node connections.
#[derive(Clone)]
pub struct TlsOptions {
    /// PEM bundle of the CA(s) to trust (e.g. `ca.crt` of the TLS Secret). Only these are trusted.
    pub ca_pem: Vec<u8>,
    /// Names the server certificate may be valid for (SNI + verification), tried in order;
    /// then the dialed IP address (a certificate with an IP SAN). A name is given up only
    /// when the certificate is not valid for it: any other failure (an untrusted CA, an
    /// expired certificate) ends the attempt.
    pub server_names: Vec<String>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_pem", &format_args!("<{} bytes>", self.ca_pem.len()))
            .field("server_names", &self.server_names)
            .finish()
    }
}

/// How to reach and authenticate to Valkey nodes.
#[derive(Clone)]
pub struct ClientConfig {
    /// ACL user name (the operator's system user).
    pub username: String,
    /// Password of that user.
    pub password: String,
    /// TLS, if the cluster uses it.
    pub tls: Option<TlsOptions>,
    /// Time allowed to connect (TCP, TLS handshake and AUTH).
    pub connect_timeout: Duration,
    /// Time allowed for each reply.
    pub response_timeout: Duration,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl ClientConfig {
    /// Plain-TCP config for an ACL user with default timeouts.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
            tls: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
        }
    }

    /// Enables TLS with the given CA bundle and (optional) server name to verify, else the IP.
    pub fn with_tls(self, ca_pem: impl Into<Vec<u8>>, server_name: Option<String>) -> Self {
        self.with_tls_names(ca_pem, server_name.into_iter().collect())
    }

    /// Enables TLS with the given CA bundle; the certificate must be valid for one of
    /// `server_names` or for the dialed IP (see [`TlsOptions::server_names`]).
    pub fn with_tls_names(mut self, ca_pem: impl Into<Vec<u8>>, server_names: Vec<String>) -> Self {
        self.tls = Some(TlsOptions {
            ca_pem: ca_pem.into(),
            server_names,
        });
        self
    }

    /// Sets the connect and response timeouts.
    pub fn with_timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }
}

/// Installs the ring crypto provider as rustls' process default (idempotent; keeps an
/// already-installed provider).
pub fn ensure_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Losing a race with another installer is fine: some provider is then installed.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// Resolver that maps whatever host name redis-rs asks for to one fixed socket address.
struct FixedResolver(SocketAddr);

impl AsyncDNSResolver for FixedResolver {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        _host: &'b str,
        _port: u16,
    ) -> redis::RedisFuture<'a, Box<dyn Iterator<Item = SocketAddr> + Send + 'a>> {
        let addr = self.0;
        Box::pin(async move {
            Ok(Box::new(std::iter::once(addr)) as Box<dyn Iterator<Item = SocketAddr> + Send>)
        })
    }
}

/// Splits `ip:port` / `[v6]:port` / `host:port`.
pub(crate) fn split_addr(addr: &str) -> Result<(String, u16), ClientError> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok((sa.ip().to_string(), sa.port()));
    }
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| ClientError::Config(format!("address {addr:?} has no port")))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| ClientError::Config(format!("address {addr:?} has an invalid port")))?;
    if host.is_empty() {
        return Err(ClientError::Config(format!("address {addr:?} has no host")));
    }
    Ok((host.trim_matches(['[', ']']).to_owned(), port))
}

/// Opens one authenticated multiplexed connection to `addr` (`ip:port`). With TLS, the
/// certificate is verified against each of [`TlsOptions::server_names`] in turn, then the IP.
pub async fn connect(addr: &str, config: &ClientConfig) -> Result<NodeConnection, ClientError> {
    if config.username.is_empty() || config.password.is_empty() {
        return Err(ClientError::Config(
            "username and password are required (no unauthenticated access)".into(),
        ));
    }
    let (host, port) = split_addr(addr)?;
    let Some(tls) = &config.tls else {
        return connect_as(addr, config, ConnectionAddr::Tcp(host, port), None).await;
    };
    ensure_crypto_provider();
    let ip: Option<IpAddr> = host.parse().ok();
    let mut last = None;
    let names = tls.server_names.iter().filter(|n| !n.is_empty());
    for name in names.map(Some).chain(std::iter::once(None)) {
        // Dial the node's IP, verify against the name.
        let (tls_host, resolver) = match (name, ip) {
            (Some(name), Some(ip)) => {
                (name.clone(), Some(FixedResolver(SocketAddr::new(ip, port))))
            }
            (Some(_), None) => {
                return Err(ClientError::Config(format!(
                    "address {addr:?} must be an IP address when a TLS server name is set"
                )));
            }
            (None, _) => (host.clone(), None),
        };
        let target = ConnectionAddr::TcpTls {
            host: tls_host,
            port,
            insecure: false,
            tls_params: None,
        };
        match connect_as(addr, config, target, resolver).await {
            Err(e) if e.is_name_mismatch() => last = Some(e),
            r => return r,
        }
    }
    Err(last.unwrap_or_else(|| ClientError::Config("no TLS server name to try".into())))
}

/// One connection attempt to `target` (the resolver pins the dialed address).
async fn connect_as(
    addr: &str,
    config: &ClientConfig,
    target: ConnectionAddr,
    resolver: Option<FixedResolver>,
) -> Result<NodeConnection, ClientError> {
    let redis_info = RedisConnectionInfo::default()
        .set_username(&config.username)
        .set_password(&config.password)
        .set_lib_name("valkey-operator", env!("CARGO_PKG_VERSION"));
    let mut conn_config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.response_timeout));
    if let Some(r) = resolver {
        conn_config = conn_config.set_dns_resolver(r);
    }
    let info = target
        .into_connection_info_checked()?
        .set_redis_settings(redis_info);
    let client = match &config.tls {
        None => Client::open(info).map_err(|e| ClientError::Config(e.to_string()))?,
        Some(tls) => Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(tls.ca_pem.clone()),
            },
        )
        .map_err(|e| ClientError::Config(format!("TLS setup: {e}")))?,
    };

    let fut = client.get_multiplexed_async_connection_with_config(&conn_config);
    // redis-rs applies the connect timeout to TCP only; bound the whole handshake too.
    let conn = match tokio::time::timeout(config.connect_timeout * 2, fut).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(ClientError::classify(addr, &config.username, e)),
        Err(_) => {
            return Err(ClientError::Timeout {
                addr: addr.to_owned(),
            });
        }
    };
    debug!(addr, user = %config.username, tls = config.tls.is_some(), "connected to valkey node");
    Ok(NodeConnection {
        addr: addr.to_owned(),
        user: config.username.clone(),
        conn,
    })
}

trait IntoInfo {
    fn into_connection_info_checked(self) -> Result<ConnectionInfo, ClientError>;
}

impl IntoInfo for ConnectionAddr {
    fn into_connection_info_checked(self) -> Result<ConnectionInfo, ClientError> {
        redis::IntoConnectionInfo::into_connection_info(self)
            .map_err(|e| ClientError::Config(e.to_string()))
    }
}

/// One authenticated connection to one node; cheap to clone (multiplexed).
#[derive(Clone)]
pub struct NodeConnection {
    addr: String,
    user: String,
    conn: MultiplexedConnection,
}

impl fmt::Debug for NodeConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeConnection")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .finish()
    }
}

impl NodeConnection {
    /// Address this connection dials.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A handle on the same connection whose replies may take up to `timeout` (for commands
    /// that block server-side, such as `WAIT` or `MIGRATE`).
    pub fn with_response_timeout(&self, timeout: Duration) -> Self {
        let mut c = self.clone();
        c.conn.set_response_timeout(timeout);
        c
    }

    /// Runs one command.
    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> Result<T, ClientError> {
        cmd.query_async(&mut self.conn)
            .await
            .map_err(|e| ClientError::classify(&self.addr, &self.user, e))
    }

    /// Runs a pipeline (one round trip).
    pub async fn pipeline<T: FromRedisValue>(&mut self, pipe: &Pipeline) -> Result<T, ClientError> {
        pipe.query_async(&mut self.conn)
            .await
            .map_err(|e| ClientError::classify(&self.addr, &self.user, e))
    }
}

/// Cache of connections by node address, shared across one reconcile pass (or longer).
///
/// Connections that fail with a connection error or timeout are dropped so the next call
/// reconnects. A command sent on a *cached* connection that turns out to be broken is retried
/// once on a fresh connection; all commands in [`crate::commands`] are idempotent, so this is
/// safe.
#[derive(Clone)]
pub struct NodePool {
    config: Arc<ClientConfig>,
    conns: Arc<Mutex<HashMap<String, NodeConnection>>>,
}

impl fmt::Debug for NodePool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodePool")
            .field("config", &self.config)
            .field("cached", &self.cached_addrs())
            .finish()
    }
}

impl NodePool {
    /// Creates an empty pool.
    pub fn new(config: ClientConfig) -> Self {
        Self {
            config: Arc::new(config),
            conns: Arc::default(),
        }
    }

    /// The configuration used for new connections.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Addresses with a cached connection.
    pub fn cached_addrs(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().keys().cloned().collect();
        v.sort();
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NodeConnection>> {
        // A poisoned map only means another task panicked mid-insert; the map is still valid.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns the cached connection to `addr` or opens one.
    pub async fn connection(&self, addr: &str) -> Result<NodeConnection, ClientError> {
        Ok(self.connection_cached(addr).await?.0)
    }

    async fn connection_cached(&self, addr: &str) -> Result<(NodeConnection, bool), ClientError> {
        if let Some(c) = self.lock().get(addr) {
            return Ok((c.clone(), true));
        }
        let c = connect(addr, &self.config).await?;
        self.lock().insert(addr.to_owned(), c.clone());
        Ok((c, false))
    }

    /// Drops the cached connection to `addr` (e.g. the pod went away).
    pub fn evict(&self, addr: &str) {
        self.lock().remove(addr);
    }

    /// Drops all cached connections.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Runs one command on `addr`.
    pub async fn query<T: FromRedisValue>(&self, addr: &str, cmd: &Cmd) -> Result<T, ClientError> {
        let (mut c, cached) = self.connection_cached(addr).await?;
        match c.query(cmd).await {
            Err(e) if e.is_unreachable() => {
                self.evict(addr);
                if cached && matches!(e, ClientError::Connection { .. }) {
                    let (mut fresh, _) = self.connection_cached(addr).await?;
                    let r = fresh.query(cmd).await;
                    if r.as_ref().is_err_and(ClientError::is_unreachable) {
                        self.evict(addr);
                    }
                    return r;
                }
                Err(e)
            }
            r => r,
        }
    }

    /// Runs a pipeline on `addr`.
    pub async fn pipeline<T: FromRedisValue>(
        &self,
        addr: &str,
        pipe: &Pipeline,
    ) -> Result<T, ClientError> {
        let (mut c, _) = self.connection_cached(addr).await?;
        let r = c.pipeline(pipe).await;
        if r.as_ref().is_err_and(ClientError::is_unreachable) {
            self.evict(addr);
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_addresses() {
        assert_eq!(
            split_addr("10.0.0.1:6379").unwrap(),
            ("10.0.0.1".into(), 6379)
        );
        assert_eq!(split_addr("[::1]:7000").unwrap(), ("::1".into(), 7000));
        assert_eq!(
            split_addr("pod-0.svc:6379").unwrap(),
            ("pod-0.svc".into(), 6379)
        );
        assert!(split_addr("10.0.0.1").is_err());
        assert!(split_addr(":6379").is_err());
        assert!(split_addr("h:99999").is_err());
    }

    #[test]
    fn debug_redacts_secrets() {
        let c = ClientConfig::new("_operator", "s3cret").with_tls(b"PEM".to_vec(), None);
        let s = format!("{c:?}");
        assert!(!s.contains("s3cret"));
        assert!(s.contains("<3 bytes>"));
    }

    #[tokio::test]
    async fn refuses_empty_credentials() {
        let err = connect("127.0.0.1:1", &ClientConfig::new("", ""))
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Config(_)));
    }
}
