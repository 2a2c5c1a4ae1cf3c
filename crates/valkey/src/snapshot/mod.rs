//! Full RDB snapshot of a node, streamed: the replication handshake a replica makes
//! (`PSYNC ? -1`) on a connection of its own, with the payload passed on in bounded chunks
//! to an [`AsyncWrite`] sink while its SHA-256 and RDB checksum are computed.
//!
//! For backups, point it at a synced *replica*: the node serving the snapshot forks (or, with
//! `repl-diskless-sync yes`, its fork writes straight to the socket), so the primary is left
//! alone. The connection announces exactly what is implemented here:
//! - `REPLCONF capa eof`: the diskless `$EOF:<mark>` form is understood (a server may also
//!   send a length-prefixed file saved to disk; both are handled);
//! - `REPLCONF rdb-only 1`: only the RDB is wanted. The server keeps no replication buffer
//!   for this connection (no output-buffer growth while the snapshot transfers) and closes it
//!   after the payload, without marking it an online replica;
//! - `REPLCONF version <the server's own version>` (from `HELLO`): a Valkey 9 server writes
//!   an RDB in the format of the version its replica reports, and falls back to RDB 11 (and
//!   always diskless) for a replica that reports none; reporting the server's own version
//!   gets its native format, which a server of that version restores;
//! - no `listening-port` (the server never connects back; `INFO replication` of the serving
//!   node lists the connection with `port=0` while it lasts), no `psync2`, no
//!   `dual-channel` (the dual-channel handshake is not implemented: it is used only by a
//!   replica that announces it).
//!
//! Needs an ACL user with `+psync +replconf` (`AUTH` and `HELLO` need no permission).

pub mod prelude;
mod protocol;
pub(crate) mod rdb;

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tracing::{debug, info};

use crate::client::{ClientConfig, split_addr};

use prelude::Prelude;
pub use protocol::Transfer;
use protocol::{Event, StreamError, SyncStream};
pub use rdb::RdbMagic;
use rdb::{RDB_HEADER_LEN, RdbDigest, parse_header};

/// Default [`SnapshotOptions::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`SnapshotOptions::chunk_size`].
pub const DEFAULT_CHUNK_SIZE: usize = 256 * 1024;
/// Largest reply accepted to the commands before `PSYNC`.
const MAX_REPLY: usize = 64 * 1024;

/// How a snapshot is read.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// Longest wait for any byte once `PSYNC` is sent. The server sends a newline every
    /// second while it prepares the RDB (each one restarts this wait), so this bounds a
    /// silent server, not a large dataset.
    pub idle_timeout: Duration,
    /// Size of each read, and so the most the sink gets in one write (the only buffer).
    pub chunk_size: usize,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        Self {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            chunk_size: DEFAULT_CHUNK_SIZE,
        }
    }
}

/// What was streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Replication id of the serving node's history (`+FULLRESYNC`).
    pub replid: String,
    /// Replication offset the snapshot corresponds to (`+FULLRESYNC`).
    pub offset: u64,
    /// Payload bytes written to the sink (the RDB file, end mark excluded).
    pub bytes: u64,
    /// SHA-256 of those bytes, lowercase hex.
    pub sha256: String,
    /// The RDB header's magic.
    pub rdb_magic: RdbMagic,
    /// The RDB format version (11 for `REDIS0011`, 80 for `VALKEY080`).
    pub rdb_version: u32,
    /// The RDB's CRC-64 checksum, verified against the content; `None` when the server wrote
    /// none (`rdbchecksum no`).
    pub rdb_checksum: Option<u64>,
    /// How the server delimited the payload.
    pub transfer: Transfer,
    /// The server's version (`HELLO`), which was reported back to it as the replica's.
    pub server_version: String,
    /// Keep-alive newlines received while the server prepared the RDB.
    pub keepalives: u64,
    /// Keys in the RDB's first database, as the server counted them when it wrote the file
    /// (its `RESIZEDB` record; cluster mode has database 0 only); `None` when the file
    /// starts with something else (a module's data).
    pub keys: Option<u64>,
}

/// Where the exchange was when something went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// TCP connect or TLS handshake.
    Connect,
    /// A command before `PSYNC` (`AUTH`, `HELLO`, `REPLCONF`).
    Handshake,
    /// Waiting for `+FULLRESYNC`.
    PsyncReply,
    /// Waiting for the payload header.
    PayloadHeader,
    /// In the payload.
    Payload,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Connect => "connecting",
            Stage::Handshake => "the replication handshake",
            Stage::PsyncReply => "waiting for the PSYNC reply",
            Stage::PayloadHeader => "waiting for the RDB payload",
            Stage::Payload => "the RDB payload",
        })
    }
}

/// Why a snapshot failed. Nothing is retried here; whatever the sink received is to be
/// discarded.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Unusable configuration (empty credentials, bad address, bad CA bundle).
    #[error("invalid snapshot configuration: {0}")]
    Config(String),
    /// The TCP connection or the TLS handshake failed.
    #[error("connection to {addr} failed: {source}")]
    Connect {
        /// Node address.
        addr: String,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The server refused the credentials.
    #[error("authentication as {user:?} failed at {addr}: {message}")]
    Auth {
        /// Node address.
        addr: String,
        /// ACL user name.
        user: String,
        /// The server's error reply.
        message: String,
    },
    /// The server answered a command with an error reply (e.g. `NOPERM` for a user without
    /// `+psync`, `NOMASTERLINK` from a replica whose link to its primary is down).
    #[error("{addr} refused {command}: {message}")]
    Server {
        /// Node address.
        addr: String,
        /// The command (without arguments).
        command: String,
        /// The server's error reply (code and text).
        message: String,
    },
    /// Nothing arrived within the timeout.
    #[error("timed out after {after:?} during {stage} with {addr}")]
    Timeout {
        /// Node address.
        addr: String,
        /// Where.
        stage: Stage,
        /// The timeout that ran out.
        after: Duration,
    },
    /// Reading or writing the connection failed, or it was closed before the payload.
    #[error("connection to {addr} failed during {stage}: {source}")]
    Io {
        /// Node address.
        addr: String,
        /// Where.
        stage: Stage,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The server sent something that is not the replication protocol.
    #[error("unexpected data from {addr}: {detail}")]
    Protocol {
        /// Node address.
        addr: String,
        /// What was wrong.
        detail: String,
    },
    /// The connection ended in the middle of the payload.
    #[error("snapshot from {addr} incomplete: connection closed after {received} payload bytes{}",
        expected.map(|e| format!(" of {e}")).unwrap_or_default())]
    Incomplete {
        /// Node address.
        addr: String,
        /// Payload bytes passed on (a diskless transfer holds back its latest 40 bytes,
        /// which may be the end mark).
        received: u64,
        /// Announced payload length (disk-based transfers).
        expected: Option<u64>,
    },
    /// The payload is not a whole RDB file (wrong header, no `EOF` opcode at the end).
    #[error("snapshot from {addr} is not a valid RDB: {detail}")]
    InvalidRdb {
        /// Node address.
        addr: String,
        /// What was wrong.
        detail: String,
    },
    /// The RDB's checksum does not match its content.
    #[error(
        "snapshot from {addr}: RDB checksum {stored:#018x} does not match the content ({computed:#018x})"
    )]
    Checksum {
        /// Node address.
        addr: String,
        /// The checksum in the file.
        stored: u64,
        /// The checksum of the content.
        computed: u64,
    },
    /// Writing to the sink failed.
    #[error("writing the snapshot failed: {0}")]
    Sink(#[source] std::io::Error),
}

impl SnapshotError {
    /// The server's error reply, if this is one (`NOPERM ...`, `WRONGPASS ...`, ...).
    pub fn server_message(&self) -> Option<&str> {
        match self {
            Self::Auth { message, .. } | Self::Server { message, .. } => Some(message),
            _ => None,
        }
    }
}

/// The connection: TCP or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Streams a full RDB snapshot of the node at `addr` (`ip:port`) into `sink`, authenticating
/// as `config`'s user (over TLS when configured: the certificate is verified against each of
/// the server names, then the IP, as [`crate::client::connect`] does). The sink receives only
/// payload bytes, in writes of at most [`SnapshotOptions::chunk_size`], and only once the
/// RDB header was checked; it is flushed at the end. The connection is closed as soon as
/// the payload ends.
///
/// The RDB is checked while it passes: header, `EOF` opcode, CRC-64 checksum. A sink that
/// stalls stalls the transfer: the server drops a replica that does not read for
/// `repl-timeout` (60 s by default), and a diskless transfer keeps the server's fork alive
/// meanwhile.
pub async fn stream_snapshot<W>(
    addr: &str,
    config: &ClientConfig,
    options: &SnapshotOptions,
    sink: &mut W,
) -> Result<SnapshotInfo, SnapshotError>
where
    W: AsyncWrite + Unpin + ?Sized,
{
    if config.username.is_empty() || config.password.is_empty() {
        return Err(SnapshotError::Config(
            "username and password are required (no unauthenticated access)".into(),
        ));
    }
    if options.chunk_size == 0 {
        return Err(SnapshotError::Config("chunk_size must not be 0".into()));
    }
    let started = Instant::now();
    let io = dial(addr, config).await?;
    let mut conn = Conn {
        addr: addr.to_owned(),
        io,
        pending: Vec::new(),
        timeout: config.response_timeout,
    };
    match conn
        .command(&[
            b"AUTH",
            config.username.as_bytes(),
            config.password.as_bytes(),
        ])
        .await?
    {
        Reply::Error(message) => {
            return Err(SnapshotError::Auth {
                addr: addr.to_owned(),
                user: config.username.clone(),
                message,
            });
        }
        r => conn.expect_ok("AUTH", r)?,
    }
    let hello = conn.command(&[b"HELLO"]).await?;
    let server_version = conn.hello_version(hello)?;
    let r = conn
        .command(&[b"REPLCONF", b"capa", b"eof", b"rdb-only", b"1"])
        .await?;
    conn.expect_ok("REPLCONF", r)?;
    match conn
        .command(&[b"REPLCONF", b"version", server_version.as_bytes()])
        .await?
    {
        // A server older than the `version` option knows one RDB format only.
        Reply::Error(m) if m.contains("Unrecognized REPLCONF option") => {
            debug!(addr, "server does not take REPLCONF version: {m}");
        }
        r => conn.expect_ok("REPLCONF", r)?,
    }
    conn.send(&[b"PSYNC", b"?", b"-1"]).await?;
    debug!(addr, server_version, "PSYNC sent");

    let mut rx = Receiver {
        addr: addr.to_owned(),
        stream: SyncStream::new(),
        digest: RdbDigest::new(),
        sink,
        staged: Vec::with_capacity(RDB_HEADER_LEN),
        header_checked: None,
        resync: None,
        transfer: None,
        keepalives: 0,
    };
    let leftover = std::mem::take(&mut conn.pending);
    rx.accept(&leftover).await?;
    let mut buf = vec![0u8; options.chunk_size];
    while !rx.stream.is_done() {
        let stage = rx.stage();
        let n = match read_some(&mut conn.io, &mut buf, options.idle_timeout).await {
            Ok(n) => n,
            Err(ReadError::Timeout) => {
                return Err(SnapshotError::Timeout {
                    addr: addr.to_owned(),
                    stage,
                    after: options.idle_timeout,
                });
            }
            Err(ReadError::Io(source)) => {
                return Err(SnapshotError::Io {
                    addr: addr.to_owned(),
                    stage,
                    source,
                });
            }
        };
        if n == 0 {
            return Err(rx.closed());
        }
        rx.accept(&buf[..n]).await?;
    }
    drop(conn);
    let info = rx.finish(server_version).await?;
    info!(
        addr,
        bytes = info.bytes,
        rdb_version = info.rdb_version,
        transfer = ?info.transfer,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "snapshot streamed"
    );
    Ok(info)
}

/// Opens the TCP connection, and the TLS session over it when configured.
async fn dial(addr: &str, config: &ClientConfig) -> Result<Box<dyn Io>, SnapshotError> {
    let (host, port) = split_addr(addr).map_err(|e| SnapshotError::Config(e.to_string()))?;
    let connect_err = |source| SnapshotError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let timeout = |stage| SnapshotError::Timeout {
        addr: addr.to_owned(),
        stage,
        after: config.connect_timeout,
    };
    let tcp = || async {
        let s = tokio::time::timeout(config.connect_timeout, TcpStream::connect((&*host, port)))
            .await
            .map_err(|_| timeout(Stage::Connect))?
            .map_err(connect_err)?;
        let _ = s.set_nodelay(true);
        Ok::<_, SnapshotError>(s)
    };
    let Some(tls) = &config.tls else {
        return Ok(Box::new(tcp().await?));
    };
    let tls_config = crate::tls::verifying_client_config(&tls.ca_pem)
        .map_err(|e| SnapshotError::Config(format!("TLS: {e}")))?;
    let mut names = Vec::new();
    for n in tls.server_names.iter().filter(|n| !n.is_empty()) {
        names.push(
            ServerName::try_from(n.clone())
                .map_err(|e| SnapshotError::Config(format!("TLS server name {n:?}: {e}")))?,
        );
    }
    names.push(match host.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.clone())
            .map_err(|e| SnapshotError::Config(format!("TLS server name {host:?}: {e}")))?,
    });
    let connector = TlsConnector::from(Arc::clone(&tls_config));
    let mut last = None;
    for name in names {
        let stream = tcp().await?;
        match tokio::time::timeout(config.connect_timeout, connector.connect(name, stream)).await {
            Err(_) => return Err(timeout(Stage::Connect)),
            Ok(Ok(s)) => return Ok(Box::new(s)),
            Ok(Err(e)) if crate::tls::is_name_mismatch(&e) => last = Some(e),
            Ok(Err(e)) => return Err(connect_err(e)),
        }
    }
    Err(connect_err(last.unwrap_or_else(|| {
        std::io::Error::other("no TLS server name to try")
    })))
}

enum ReadError {
    Timeout,
    Io(std::io::Error),
}

/// One read; `Ok(0)` at the end of the stream (also a TLS peer that closed without
/// `close_notify`, which a server that closes right after the payload may do).
async fn read_some(
    io: &mut Box<dyn Io>,
    buf: &mut [u8],
    timeout: Duration,
) -> Result<usize, ReadError> {
    match tokio::time::timeout(timeout, io.read(buf)).await {
        Err(_) => Err(ReadError::Timeout),
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
        Ok(Err(e)) => Err(ReadError::Io(e)),
    }
}

/// A RESP2 reply to a command before `PSYNC`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

/// Parses one RESP2 reply at the start of `buf`: the reply and its length, `None` when
/// `buf` does not hold all of it yet.
fn parse_reply(buf: &[u8], depth: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(nl) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let line = &buf[1..nl];
    let text = || String::from_utf8_lossy(line).into_owned();
    let int = || -> Result<i64, String> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad length or integer {:?}", text()))
    };
    let after = nl + 2;
    match buf.first() {
        Some(b'+') => Ok(Some((Reply::Simple(text()), after))),
        Some(b'-') => Ok(Some((Reply::Error(text()), after))),
        Some(b':') => Ok(Some((Reply::Int(int()?), after))),
        Some(b'$') => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Reply::Bulk(None), after)));
            }
            let end = after + n as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            Ok(Some((Reply::Bulk(Some(buf[after..end].to_vec())), end + 2)))
        }
        Some(b'*') => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Reply::Array(None), after)));
            }
            if depth >= 8 {
                return Err("reply nested too deeply".into());
            }
            let mut items = Vec::new();
            let mut at = after;
            for _ in 0..n {
                match parse_reply(&buf[at..], depth + 1)? {
                    None => return Ok(None),
                    Some((r, used)) => {
                        items.push(r);
                        at += used;
                    }
                }
            }
            Ok(Some((Reply::Array(Some(items)), at)))
        }
        _ => Err(format!(
            "not a RESP reply: {}",
            buf[..buf.len().min(64)].escape_ascii()
        )),
    }
}

fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The connection during the handshake.
struct Conn {
    addr: String,
    io: Box<dyn Io>,
    /// Received, not yet parsed.
    pending: Vec<u8>,
    /// Time allowed for each reply.
    timeout: Duration,
}

impl Conn {
    async fn send(&mut self, args: &[&[u8]]) -> Result<(), SnapshotError> {
        let bytes = encode(args);
        let write = async {
            self.io.write_all(&bytes).await?;
            self.io.flush().await
        };
        match tokio::time::timeout(self.timeout, write).await {
            Err(_) => Err(SnapshotError::Timeout {
                addr: self.addr.clone(),
                stage: Stage::Handshake,
                after: self.timeout,
            }),
            Ok(Err(source)) => Err(SnapshotError::Io {
                addr: self.addr.clone(),
                stage: Stage::Handshake,
                source,
            }),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// Sends one command and reads its reply (error replies are returned, not raised).
    async fn command(&mut self, args: &[&[u8]]) -> Result<Reply, SnapshotError> {
        self.send(args).await?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut buf = [0u8; 4096];
        loop {
            match parse_reply(&self.pending, 0) {
                Err(detail) => return Err(self.protocol(detail)),
                Ok(Some((reply, used))) => {
                    self.pending.drain(..used);
                    return Ok(reply);
                }
                Ok(None) if self.pending.len() > MAX_REPLY => {
                    return Err(self.protocol(format!("a reply of more than {MAX_REPLY} bytes")));
                }
                Ok(None) => {}
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let n = match read_some(&mut self.io, &mut buf, left).await {
                Ok(0) => Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed by the server",
                )),
                Ok(n) => Ok(n),
                Err(ReadError::Io(e)) => Err(e),
                Err(ReadError::Timeout) => {
                    return Err(SnapshotError::Timeout {
                        addr: self.addr.clone(),
                        stage: Stage::Handshake,
                        after: self.timeout,
                    });
                }
            }
            .map_err(|source| SnapshotError::Io {
                addr: self.addr.clone(),
                stage: Stage::Handshake,
                source,
            })?;
            self.pending.extend_from_slice(&buf[..n]);
        }
    }

    fn protocol(&self, detail: String) -> SnapshotError {
        SnapshotError::Protocol {
            addr: self.addr.clone(),
            detail,
        }
    }

    fn expect_ok(&self, command: &str, reply: Reply) -> Result<(), SnapshotError> {
        match reply {
            Reply::Simple(s) if s.eq_ignore_ascii_case("OK") => Ok(()),
            Reply::Error(message) => Err(SnapshotError::Server {
                addr: self.addr.clone(),
                command: command.to_owned(),
                message,
            }),
            other => Err(self.protocol(format!("{command} answered {other:?}"))),
        }
    }

    /// The `version` field of a `HELLO` reply (RESP2: a flat list of names and values).
    fn hello_version(&self, reply: Reply) -> Result<String, SnapshotError> {
        let items = match reply {
            Reply::Error(message) => {
                return Err(SnapshotError::Server {
                    addr: self.addr.clone(),
                    command: "HELLO".into(),
                    message,
                });
            }
            Reply::Array(Some(items)) => items,
            other => return Err(self.protocol(format!("HELLO answered {other:?}"))),
        };
        items
            .chunks_exact(2)
            .find_map(|kv| match kv {
                [Reply::Bulk(Some(k)), Reply::Bulk(Some(v))] if k == b"version" => {
                    String::from_utf8(v.clone()).ok()
                }
                _ => None,
            })
            .ok_or_else(|| self.protocol("HELLO reply without a version".into()))
    }
}

/// The receiving side after `PSYNC`: parser, digest, sink.
struct Receiver<'w, W: ?Sized> {
    addr: String,
    stream: SyncStream,
    digest: RdbDigest,
    sink: &'w mut W,
    /// Payload bytes held until the RDB header is complete and checked.
    staged: Vec<u8>,
    header_checked: Option<(RdbMagic, u32)>,
    resync: Option<(String, u64)>,
    transfer: Option<Transfer>,
    keepalives: u64,
}

impl<W: AsyncWrite + Unpin + ?Sized> Receiver<'_, W> {
    fn stage(&self) -> Stage {
        if self.stream.in_payload() {
            Stage::Payload
        } else if self.resync.is_some() {
            Stage::PayloadHeader
        } else {
            Stage::PsyncReply
        }
    }

    /// The error for a connection closed before the payload ended.
    fn closed(&self) -> SnapshotError {
        if self.stream.in_payload() {
            return SnapshotError::Incomplete {
                addr: self.addr.clone(),
                received: self.digest.len(),
                expected: match self.transfer {
                    Some(Transfer::Disk { len }) => Some(len),
                    _ => None,
                },
            };
        }
        SnapshotError::Io {
            addr: self.addr.clone(),
            stage: self.stage(),
            source: std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed by the server",
            ),
        }
    }

    /// Handles received bytes (all of them, unless the payload ends within them).
    async fn accept(&mut self, input: &[u8]) -> Result<(), SnapshotError> {
        let mut at = 0;
        while at < input.len() && !self.stream.is_done() {
            let fed = self.stream.feed(&input[at..]).map_err(|e| match e {
                StreamError::Server(message) => SnapshotError::Server {
                    addr: self.addr.clone(),
                    command: "PSYNC".into(),
                    message,
                },
                StreamError::Protocol(detail) => SnapshotError::Protocol {
                    addr: self.addr.clone(),
                    detail,
                },
            })?;
            at += fed.consumed;
            match fed.event {
                Some(Event::KeepAlive) => self.keepalives += 1,
                Some(Event::FullResync { replid, offset }) => {
                    debug!(addr = %self.addr, replid, offset, "full resync");
                    self.resync = Some((replid, offset));
                }
                Some(Event::Header(t)) => {
                    debug!(addr = %self.addr, transfer = ?t, "payload begins");
                    self.transfer = Some(t);
                }
                Some(Event::End) | None => {}
            }
            self.payload(fed.data.held()).await?;
            self.payload(fed.data.body).await?;
        }
        Ok(())
    }

    async fn payload(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.digest.update(bytes);
        if self.header_checked.is_some() {
            return self
                .sink
                .write_all(bytes)
                .await
                .map_err(SnapshotError::Sink);
        }
        self.staged.extend_from_slice(bytes);
        if self.staged.len() < RDB_HEADER_LEN {
            return Ok(());
        }
        let header = parse_header(&self.staged[..RDB_HEADER_LEN]).map_err(|detail| {
            SnapshotError::InvalidRdb {
                addr: self.addr.clone(),
                detail,
            }
        })?;
        self.header_checked = Some(header);
        let staged = std::mem::take(&mut self.staged);
        self.sink
            .write_all(&staged)
            .await
            .map_err(SnapshotError::Sink)
    }

    async fn finish(self, server_version: String) -> Result<SnapshotInfo, SnapshotError> {
        let invalid = |detail| SnapshotError::InvalidRdb {
            addr: self.addr.clone(),
            detail,
        };
        let Some((rdb_magic, rdb_version)) = self.header_checked else {
            return Err(invalid(
                parse_header(self.digest.head())
                    .err()
                    .unwrap_or_else(|| "payload too short".into()),
            ));
        };
        let keys = match self.digest.prelude() {
            Prelude::FirstDb { keys, .. } => Some(keys),
            Prelude::Empty => Some(0),
            Prelude::Incomplete | Prelude::Unknown(_) => None,
        };
        let trailer = self.digest.finish().map_err(invalid)?;
        if trailer.stored_crc != 0 && trailer.stored_crc != trailer.computed_crc {
            return Err(SnapshotError::Checksum {
                addr: self.addr,
                stored: trailer.stored_crc,
                computed: trailer.computed_crc,
            });
        }
        self.sink.flush().await.map_err(SnapshotError::Sink)?;
        let (Some((replid, offset)), Some(transfer)) = (self.resync, self.transfer) else {
            unreachable!("a payload follows +FULLRESYNC and its header");
        };
        Ok(SnapshotInfo {
            replid,
            offset,
            bytes: trailer.len,
            sha256: hex::encode(trailer.sha256),
            rdb_magic,
            rdb_version,
            rdb_checksum: (trailer.stored_crc != 0).then_some(trailer.stored_crc),
            transfer,
            server_version,
            keepalives: self.keepalives,
            keys,
        })
    }
}

#[cfg(test)]
mod tests;
