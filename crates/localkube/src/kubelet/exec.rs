//! `kubectl exec` on the kubelet side: the remote command protocol `v4.channel.k8s.io` over a
//! SPDY/3.1 connection ([`super::spdy`]) that the API server opened with an HTTP upgrade.
//!
//! The client opens one stream per channel, each with a `streamType` header: `error` always,
//! `stdin`, `stdout`, `stderr` as requested (`stderr` not with a TTY), `resize` with a TTY.
//! Every stream is accepted (`SYN_REPLY`); once all are there the command starts in the
//! container ([`RunningContainer::exec_spawn`]). Its stdout and stderr go out as data frames,
//! stdin data frames are written to it (a `FIN` or reset of the stdin stream closes its
//! stdin). When it has exited (and its output is read, for at most [`OUTPUT_DRAIN`] after the
//! exit, in case a background process keeps the pipes open) the `error` stream carries a JSON
//! `metav1.Status` (`Success`, or `Failure` with reason `NonZeroExitCode` and the exit code as
//! cause `ExitCode`), every stream is closed, then the connection (`GOAWAY`). If the
//! connection ends first the command is killed.
//!
//! A TTY (`kubectl exec -t`) is not emulated: the command gets pipes, its stderr goes to the
//! stdout stream, and resize messages are ignored.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::spdy::{self, FLAG_FIN, Frame};
use crate::runtime::RunningContainer;

/// The remote command protocols served, preferred first (what a kubelet serves: v5 only adds
/// a close signal for WebSockets).
pub const PROTOCOLS: &[&str] = &["v4.channel.k8s.io"];

/// How long the client has to open every stream.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long output is still read after the command has exited.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);
/// Largest data frame written.
const CHUNK: usize = 32 * 1024;

/// What the request asks for: the kubelet's query parameters `command` (repeated), `input`,
/// `output`, `error` and `tty` (flags `1`), as the API server sends them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    /// `command`.
    pub argv: Vec<String>,
    /// `input`.
    pub stdin: bool,
    /// `output`.
    pub stdout: bool,
    /// `error`.
    pub stderr: bool,
    /// `tty`.
    pub tty: bool,
}

impl ExecOptions {
    /// From the query's name/value pairs (flags are `1` or `true`).
    pub fn from_query(pairs: &[(String, String)]) -> Self {
        let flag = |name: &str| {
            pairs
                .iter()
                .any(|(n, v)| n == name && (v == "1" || v.eq_ignore_ascii_case("true")))
        };
        Self {
            argv: pairs
                .iter()
                .filter(|(n, _)| n == "command")
                .map(|(_, v)| v.clone())
                .collect(),
            stdin: flag("input"),
            stdout: flag("output"),
            stderr: flag("error"),
            tty: flag("tty"),
        }
    }

    /// The stream types the client will open.
    fn expected(&self) -> Vec<&'static str> {
        let mut t = vec!["error"];
        if self.stdin {
            t.push("stdin");
        }
        if self.stdout {
            t.push("stdout");
        }
        if self.stderr && !self.tty {
            t.push("stderr");
        }
        if self.tty {
            t.push("resize");
        }
        t
    }
}

/// The `metav1.Status` the `error` stream carries for an exit code (`None`: unknown).
pub fn exit_status_json(code: Option<i32>) -> String {
    match code {
        Some(0) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Some(c) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {c}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": c.to_string()}]},
        }),
        None => failure_json("command terminated abnormally"),
    }
    .to_string()
}

fn failure_json(message: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    })
}

/// The ids of the streams of one exec.
#[derive(Debug, Default)]
struct Streams {
    error: Option<u32>,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<u32>,
    last: u32,
}

impl Streams {
    fn slot(&mut self, ty: &str) -> Option<&mut Option<u32>> {
        Some(match ty {
            "error" => &mut self.error,
            "stdin" => &mut self.stdin,
            "stdout" => &mut self.stdout,
            "stderr" => &mut self.stderr,
            "resize" => &mut self.resize,
            _ => return None,
        })
    }

    fn all(&self) -> impl Iterator<Item = u32> {
        [
            self.stdin,
            self.stdout,
            self.stderr,
            self.resize,
            self.error,
        ]
        .into_iter()
        .flatten()
    }
}

/// Runs one exec on an upgraded connection, until it is done or the connection ends.
pub async fn serve<IO>(
    io: IO,
    opts: ExecOptions,
    running: RunningContainer,
    env: Vec<(String, String)>,
) where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = spdy::Connection::start(io);
    let last = session(&opts, &running, &env, &mut conn.frames, &conn.out).await;
    conn.close(last).await;
}

/// Accepts the streams, runs the command, reports its status and closes the streams. Returns
/// the last stream id accepted, or `None` if the connection ended first.
async fn session(
    opts: &ExecOptions,
    running: &RunningContainer,
    env: &[(String, String)],
    frames: &mut mpsc::Receiver<Frame>,
    out: &mpsc::Sender<Frame>,
) -> Option<u32> {
    let mut streams = Streams::default();
    let expected = opts.expected();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION_TIMEOUT;
    let mut missing: Vec<&str> = expected.clone();
    while !missing.is_empty() {
        let frame = match tokio::time::timeout_at(deadline, frames.recv()).await {
            Ok(Some(f)) => f,
            Ok(None) => return None,
            Err(_) => {
                tracing::debug!(?missing, "exec: streams not created in time");
                return Some(streams.last);
            }
        };
        if let Frame::SynStream {
            stream_id, headers, ..
        } = frame
        {
            let ty = spdy::header(&headers, "streamtype").unwrap_or_default();
            streams.last = streams.last.max(stream_id);
            match streams.slot(ty) {
                Some(slot) if slot.is_none() && expected.contains(&ty) => {
                    *slot = Some(stream_id);
                    missing.retain(|t| *t != ty);
                    out.send(Frame::SynReply {
                        stream_id,
                        flags: 0,
                        headers: vec![],
                    })
                    .await
                    .ok()?;
                }
                _ => {
                    tracing::debug!(stream_id, ty, "exec: unexpected stream refused");
                    out.send(Frame::RstStream {
                        stream_id,
                        status: spdy::RST_REFUSED_STREAM,
                    })
                    .await
                    .ok()?;
                }
            }
        }
    }

    running.wait_setup(std::time::Duration::from_secs(10)).await;
    let status = match running.exec_spawn(&opts.argv, env, opts.stdin) {
        Ok(child) => run(child, opts, &streams, frames, out).await?,
        Err(e) => {
            failure_json(&format!("cannot run {:?} in the container: {e}", opts.argv)).to_string()
        }
    };
    if let Some(id) = streams.error {
        out.send(Frame::Data {
            stream_id: id,
            flags: 0,
            data: status.into_bytes(),
        })
        .await
        .ok()?;
    }
    for id in streams.all() {
        out.send(Frame::fin(id)).await.ok()?;
    }
    Some(streams.last)
}

/// Copies the command's output and input until it exits; its status JSON, or `None` if the
/// connection ended first (the command is then killed, by dropping it).
async fn run(
    mut child: tokio::process::Child,
    opts: &ExecOptions,
    streams: &Streams,
    frames: &mut mpsc::Receiver<Frame>,
    out: &mpsc::Sender<Frame>,
) -> Option<String> {
    let stdout_id = streams.stdout;
    // With a TTY the client has no stderr stream: stderr goes to stdout.
    let stderr_id = if opts.tty { stdout_id } else { streams.stderr };
    let mut pumps = tokio::task::JoinSet::new();
    if let Some(pipe) = child.stdout.take() {
        pumps.spawn(pump(pipe, stdout_id, out.clone()));
    }
    if let Some(pipe) = child.stderr.take() {
        pumps.spawn(pump(pipe, stderr_id, out.clone()));
    }
    let (stdin_tx, stdin_rx) = mpsc::channel::<Vec<u8>>(16);
    let mut stdin_tx = Some(stdin_tx);
    if let Some(stdin) = child.stdin.take() {
        tokio::spawn(feed_stdin(stdin, stdin_rx));
    }
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            frame = frames.recv() => match frame {
                None => return None,
                Some(Frame::Data { stream_id, flags, data })
                    if Some(stream_id) == streams.stdin =>
                {
                    if !data.is_empty()
                        && let Some(tx) = &stdin_tx
                        && tx.send(data).await.is_err()
                    {
                        stdin_tx = None;
                    }
                    if flags & FLAG_FIN != 0 {
                        stdin_tx = None;
                    }
                }
                Some(Frame::RstStream { stream_id, .. }) if Some(stream_id) == streams.stdin => {
                    stdin_tx = None;
                }
                Some(_) => {}
            },
        }
    };
    drop(stdin_tx);
    let drained = tokio::time::timeout(OUTPUT_DRAIN, async {
        while pumps.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        pumps.abort_all();
    }
    let code = status.map(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
    });
    Some(exit_status_json(code))
}

/// Sends what `pipe` yields as data frames on `stream` (discarded without a stream).
async fn pump<R: AsyncRead + Unpin>(mut pipe: R, stream: Option<u32>, out: mpsc::Sender<Frame>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Some(stream_id) = stream {
                    let frame = Frame::Data {
                        stream_id,
                        flags: 0,
                        data: buf[..n].to_vec(),
                    };
                    if out.send(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Writes stdin data to the command; closes its stdin when the channel ends.
async fn feed_stdin(mut stdin: tokio::process::ChildStdin, mut data: mpsc::Receiver<Vec<u8>>) {
    while let Some(chunk) = data.recv().await {
        if stdin.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_from_the_query() {
        let o = ExecOptions::from_query(&q(&[
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo hi"),
            ("input", "1"),
            ("output", "true"),
            ("error", "0"),
        ]));
        assert_eq!(o.argv, ["sh", "-c", "echo hi"]);
        assert!(o.stdin && o.stdout && !o.stderr && !o.tty);
        assert_eq!(o.expected(), ["error", "stdin", "stdout"]);
        let o = ExecOptions::from_query(&q(&[("output", "1"), ("error", "1"), ("tty", "1")]));
        assert_eq!(o.expected(), ["error", "stdout", "resize"]);
    }

    #[test]
    fn status_json_is_what_the_v4_client_decodes() {
        let ok: serde_json::Value = serde_json::from_str(&exit_status_json(Some(0))).unwrap();
        assert_eq!(ok, serde_json::json!({"metadata": {}, "status": "Success"}));
        let failed: serde_json::Value = serde_json::from_str(&exit_status_json(Some(3))).unwrap();
        assert_eq!(failed["status"], "Failure");
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(
            failed["details"]["causes"],
            serde_json::json!([{"reason": "ExitCode", "message": "3"}])
        );
        let abnormal: serde_json::Value = serde_json::from_str(&exit_status_json(None)).unwrap();
        assert_eq!(abnormal["reason"], "InternalError");
    }
}
