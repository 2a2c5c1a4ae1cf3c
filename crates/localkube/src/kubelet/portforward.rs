//! `kubectl port-forward` on the kubelet side: the protocol `portforward.k8s.io` over a SPDY/3.1
//! connection ([`super::spdy`]) that the API server opened with an HTTP upgrade.
//!
//! For every forwarded connection the client opens two streams with the same `requestID` and
//! `port` headers: `streamType: error` (which it half-closes at once) and `streamType: data`.
//! Once both are there, the kubelet connects to `localhost:port` in the pod's network namespace
//! (as a runtime does: servers bound to the loopback address are reachable) and copies bytes
//! both ways: the data stream's `FIN` half-closes the TCP connection, the end of the TCP
//! connection closes the data stream, then the error stream. If the connection cannot be made,
//! the error stream carries the message (kubectl then reports it and gives up). The SPDY
//! connection lasts until the client closes it; closing it drops every forwarded connection.

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::spdy::{self, FLAG_FIN, Frame};

/// The port-forward protocols served.
pub const PROTOCOLS: &[&str] = &["portforward.k8s.io"];

/// How long connecting to the pod's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest data frame written.
const CHUNK: usize = 32 * 1024;

/// Where the forwarded connections go.
#[derive(Debug, Clone)]
pub struct Target {
    /// `namespace/name`, for messages.
    pub pod: String,
    /// The pod's network namespace; `None`: the host's (`hostNetwork` pods).
    pub netns: Option<PathBuf>,
}

/// The streams of one `requestID` seen so far.
#[derive(Debug, Default)]
struct Pair {
    error: Option<u32>,
    data: Option<u32>,
    port: Option<u16>,
}

/// A running forward, as the session sees it.
struct Forward {
    /// Client → pod bytes; dropped on the data stream's `FIN` or reset.
    to_pod: Option<mpsc::Sender<Vec<u8>>>,
    /// Fired when the client resets the data stream.
    reset: Option<oneshot::Sender<()>>,
}

/// Serves port forwarding on an upgraded connection until the client closes it.
pub async fn serve<IO>(io: IO, target: Target)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = spdy::Connection::start(io);
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut forwards: HashMap<u32, Forward> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(frame) = conn.frames.recv().await {
        match frame {
            Frame::SynStream {
                stream_id, headers, ..
            } => {
                let ty = spdy::header(&headers, "streamtype").unwrap_or_default();
                let port = spdy::header(&headers, "port").and_then(|p| p.parse::<u16>().ok());
                let request = spdy::header(&headers, "requestid")
                    .unwrap_or_default()
                    .to_string();
                let valid = matches!(ty, "error" | "data") && port.is_some_and(|p| p > 0);
                let frame = if valid {
                    Frame::SynReply {
                        stream_id,
                        flags: 0,
                        headers: vec![],
                    }
                } else {
                    tracing::debug!(stream_id, ty, "port-forward: invalid stream refused");
                    Frame::RstStream {
                        stream_id,
                        status: spdy::RST_REFUSED_STREAM,
                    }
                };
                if conn.out.send(frame).await.is_err() || !valid {
                    continue;
                }
                let pair = pairs.entry(request.clone()).or_default();
                pair.port = port;
                if ty == "error" {
                    pair.error = Some(stream_id);
                } else {
                    pair.data = Some(stream_id);
                }
                if let (Some(error), Some(data), Some(port)) = (pair.error, pair.data, pair.port) {
                    pairs.remove(&request);
                    let (to_pod, from_client) = mpsc::channel(16);
                    let (reset, on_reset) = oneshot::channel();
                    forwards.insert(
                        data,
                        Forward {
                            to_pod: Some(to_pod),
                            reset: Some(reset),
                        },
                    );
                    tasks.spawn(forward(
                        target.clone(),
                        port,
                        error,
                        data,
                        from_client,
                        on_reset,
                        conn.out.clone(),
                    ));
                }
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let Some(f) = forwards.get_mut(&stream_id) else {
                    continue;
                };
                if !data.is_empty()
                    && let Some(tx) = &f.to_pod
                    && tx.send(data).await.is_err()
                {
                    f.to_pod = None;
                }
                if flags & FLAG_FIN != 0 {
                    f.to_pod = None;
                }
            }
            Frame::RstStream { stream_id, .. } => {
                if let Some(mut f) = forwards.remove(&stream_id) {
                    f.to_pod = None;
                    if let Some(reset) = f.reset.take() {
                        let _ = reset.send(());
                    }
                }
            }
            _ => {}
        }
        // Forget finished forwards.
        while tasks.try_join_next().is_some() {}
        forwards.retain(|_, f| f.reset.as_ref().is_some_and(|r| !r.is_closed()));
    }
    // The client is gone: so are its forwarded connections.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    conn.close(None).await;
}

/// One forwarded connection: connect, copy both ways, close the streams.
async fn forward(
    target: Target,
    port: u16,
    error_id: u32,
    data_id: u32,
    mut from_client: mpsc::Receiver<Vec<u8>>,
    mut on_reset: oneshot::Receiver<()>,
    out: mpsc::Sender<Frame>,
) {
    let stream = match connect(target.netns.clone(), port).await {
        Ok(s) => s,
        Err(e) => {
            let msg = format!(
                "error forwarding port {port} to pod {}: cannot connect to localhost:{port} in \
                 its network namespace: {e}",
                target.pod
            );
            let _ = out
                .send(Frame::Data {
                    stream_id: error_id,
                    flags: 0,
                    data: msg.into_bytes(),
                })
                .await;
            let _ = out.send(Frame::fin(data_id)).await;
            let _ = out.send(Frame::fin(error_id)).await;
            return;
        }
    };
    let (mut rd, mut wr) = stream.into_split();
    let upstream = tokio::spawn(async move {
        while let Some(chunk) = from_client.recv().await {
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // The client is done sending: half-close, the server may still answer.
        let _ = wr.shutdown().await;
    });
    let downstream = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let frame = Frame::Data {
                        stream_id: data_id,
                        flags: 0,
                        data: buf[..n].to_vec(),
                    };
                    if out.send(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = downstream => {}
        _ = &mut on_reset => {}
    }
    upstream.abort();
    let _ = out.send(Frame::fin(data_id)).await;
    let _ = out.send(Frame::fin(error_id)).await;
}

/// A TCP connection to `localhost:port` in `netns` (IPv4, then IPv6).
async fn connect(netns: Option<PathBuf>, port: u16) -> std::io::Result<tokio::net::TcpStream> {
    let (tx, rx) = oneshot::channel();
    // A thread of its own: it enters the namespace and ends, the socket stays in it.
    std::thread::Builder::new()
        .name("port-forward".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let _ = tx.send(connect_in(netns, port));
        })?;
    let stream = rx
        .await
        .map_err(|_| std::io::Error::other("connect thread died"))??;
    stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(stream)
}

fn connect_in(netns: Option<PathBuf>, port: u16) -> std::io::Result<TcpStream> {
    if let Some(ns) = netns {
        let f = std::fs::File::open(&ns)?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| std::io::Error::other(format!("enter {}: {e}", ns.display())))?;
    }
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT).or_else(|e4| {
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| e4)
    })
}
