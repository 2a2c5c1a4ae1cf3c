//! SPDY/3.1 framing, the server's side of what the API server speaks to a kubelet for `exec`
//! (and `attach`, `port-forward`) after an HTTP/1.1 `Upgrade: SPDY/3.1`.
//!
//! Hand-written: no maintained Rust crate implements SPDY (it was superseded by HTTP/2 and only
//! survives in Kubernetes' streaming APIs), and only the framing is needed here: an 8-byte
//! header, control frames (`SYN_STREAM`, `SYN_REPLY`, `RST_STREAM`, `SETTINGS`, `PING`,
//! `GOAWAY`, `HEADERS`, `WINDOW_UPDATE`) and data frames. Name/value header blocks are
//! zlib-compressed with the protocol's preset [`dictionary`], one compression context per
//! direction for the whole connection, each block ending with a sync flush. Flow control is
//! not implemented (Kubernetes' SPDY peer, `github.com/moby/spdystream`, ignores
//! `WINDOW_UPDATE` and sends none); unknown control frames decode as [`Frame::Unknown`].
//!
//! Reference: the SPDY Protocol Draft 3.1 (chromium.org), checked against the Go framer
//! Kubernetes uses (`github.com/moby/spdystream/spdy`), whose output is a test vector here.
//!
//! [`Connection`] runs a server connection: a reader task (answering pings) and a writer task
//! (owning the compression context), with channels of frames for the protocol on top.

use std::io;
use std::sync::LazyLock;
use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The protocol version in every control frame.
pub const VERSION: u16 = 3;
/// `FLAG_FIN` of data frames and of `SYN_STREAM`/`SYN_REPLY`/`HEADERS`: the sender's half of
/// the stream is closed.
pub const FLAG_FIN: u8 = 0x01;
/// `RST_STREAM` status `PROTOCOL_ERROR`.
pub const RST_PROTOCOL_ERROR: u32 = 1;
/// `RST_STREAM` status `REFUSED_STREAM`.
pub const RST_REFUSED_STREAM: u32 = 3;
/// Largest payload a frame can carry (24-bit length).
pub const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// Largest decompressed header block accepted.
const MAX_HEADER_BLOCK: usize = 1 << 20;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// Header names (lower case) and values; several values of one name are joined by NUL.
pub type Headers = Vec<(String, String)>;

/// The value of header `name` (lower case), if present.
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Opens a stream.
    SynStream {
        /// Stream id (odd: opened by the client).
        stream_id: u32,
        /// The stream it is associated to (0: none).
        associated_to: u32,
        /// Priority, 0 (highest) to 7.
        priority: u8,
        /// [`FLAG_FIN`] and/or `FLAG_UNIDIRECTIONAL` (2).
        flags: u8,
        /// Its headers.
        headers: Headers,
    },
    /// Accepts a stream.
    SynReply {
        /// Stream id.
        stream_id: u32,
        /// [`FLAG_FIN`] or 0.
        flags: u8,
        /// Its headers.
        headers: Headers,
    },
    /// Aborts a stream.
    RstStream {
        /// Stream id.
        stream_id: u32,
        /// Why (`RST_*`).
        status: u32,
    },
    /// Connection settings (their content is not needed here).
    Settings,
    /// Liveness check; the receiver of a ping with the peer's parity echoes it.
    Ping {
        /// Ping id (odd: from the client).
        id: u32,
    },
    /// The sender opens no more streams.
    GoAway {
        /// The last stream id the sender accepted.
        last_good_stream_id: u32,
        /// 0 OK, 1 protocol error, 2 internal error.
        status: u32,
    },
    /// More headers for a stream.
    Headers {
        /// Stream id.
        stream_id: u32,
        /// [`FLAG_FIN`] or 0.
        flags: u8,
        /// The headers.
        headers: Headers,
    },
    /// Flow-control window increase (ignored here).
    WindowUpdate {
        /// Stream id (0: connection).
        stream_id: u32,
        /// Bytes added.
        delta: u32,
    },
    /// Stream payload.
    Data {
        /// Stream id.
        stream_id: u32,
        /// [`FLAG_FIN`] or 0.
        flags: u8,
        /// The bytes.
        data: Vec<u8>,
    },
    /// A control frame of a type this module does not know (to be ignored, per the spec).
    Unknown {
        /// Its type.
        frame_type: u16,
    },
}

impl Frame {
    /// An empty data frame closing the sender's half of `stream_id`.
    pub fn fin(stream_id: u32) -> Frame {
        Frame::Data {
            stream_id,
            flags: FLAG_FIN,
            data: Vec::new(),
        }
    }
}

/// The SPDY/3 header compression dictionary (1423 bytes): length-prefixed header names and
/// values, then a run of status codes, reason phrases, dates and common header values.
pub fn dictionary() -> &'static [u8] {
    static DICT: LazyLock<Vec<u8>> = LazyLock::new(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
            "502504505",
            "203 Non-Authoritative Information",
            "204 No Content",
            "301 Moved Permanently",
            "400 Bad Request",
            "401 Unauthorized",
            "403 Forbidden",
            "404 Not Found",
            "500 Internal Server Error",
            "501 Not Implemented",
            "503 Service Unavailable",
            "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec",
            " 00:00:00",
            " Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
            "chunked,text/html,image/png,image/jpg,image/gif,application/xml,",
            "application/xhtml+xml,text/plain,text/javascript,public",
            "privatemax-age=gzip,deflate,sdch",
            "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    });
    &DICT
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("spdy: {}", msg.into()))
}

/// An uncompressed name/value header block.
pub fn encode_header_block(headers: &Headers) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Parses an uncompressed name/value header block.
pub fn decode_header_block(block: &[u8]) -> io::Result<Headers> {
    let mut rest = block;
    let mut take = |n: usize| -> io::Result<&[u8]> {
        if rest.len() < n {
            return Err(invalid("truncated header block"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = be32(take(4)?);
    if count > block.len() / 8 {
        return Err(invalid(format!("header block claims {count} headers")));
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let n = be32(take(4)?);
        let name = String::from_utf8_lossy(take(n)?).to_ascii_lowercase();
        let n = be32(take(4)?);
        let value = String::from_utf8_lossy(take(n)?).into_owned();
        headers.push((name, value));
    }
    Ok(headers)
}

/// Writes frames: owns the compression context of the sending direction.
pub struct Encoder {
    z: Compress,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    /// A fresh context (one per connection).
    pub fn new() -> Self {
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(dictionary())
            .expect("a fresh zlib stream accepts a dictionary");
        Self { z }
    }

    fn compress(&mut self, headers: &Headers) -> Vec<u8> {
        let input = encode_header_block(headers);
        let mut out = Vec::with_capacity(input.len() + 64);
        let mut pos = 0;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(input.len() + 256);
            }
            let before = self.z.total_in();
            self.z
                .compress_vec(&input[pos..], &mut out, FlushCompress::Sync)
                .expect("deflate into a buffer cannot fail");
            pos += (self.z.total_in() - before) as usize;
            // A sync flush is complete once it leaves output space unused.
            if pos == input.len() && out.len() < out.capacity() {
                return out;
            }
        }
    }

    /// The bytes of `frame` (data frames must carry at most [`MAX_PAYLOAD`] bytes).
    pub fn encode(&mut self, frame: &Frame) -> Vec<u8> {
        let control = |ty: u16, flags: u8, payload: &[u8]| {
            let mut out = Vec::with_capacity(8 + payload.len());
            out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
            out.extend_from_slice(&ty.to_be_bytes());
            out.extend_from_slice(&((u32::from(flags) << 24) | payload.len() as u32).to_be_bytes());
            out.extend_from_slice(payload);
            out
        };
        let mut p = Vec::new();
        match frame {
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                p.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
                p.extend_from_slice(&(associated_to & 0x7fff_ffff).to_be_bytes());
                p.push((priority & 7) << 5);
                p.push(0);
                p.extend(self.compress(headers));
                control(TYPE_SYN_STREAM, *flags, &p)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            }
            | Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                let ty = if matches!(frame, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                p.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
                p.extend(self.compress(headers));
                control(ty, *flags, &p)
            }
            Frame::RstStream { stream_id, status } => {
                p.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
                p.extend_from_slice(&status.to_be_bytes());
                control(TYPE_RST_STREAM, 0, &p)
            }
            Frame::Settings => control(TYPE_SETTINGS, 0, &0u32.to_be_bytes()),
            Frame::Ping { id } => control(TYPE_PING, 0, &id.to_be_bytes()),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                p.extend_from_slice(&(last_good_stream_id & 0x7fff_ffff).to_be_bytes());
                p.extend_from_slice(&status.to_be_bytes());
                control(TYPE_GOAWAY, 0, &p)
            }
            Frame::WindowUpdate { stream_id, delta } => {
                p.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
                p.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
                control(TYPE_WINDOW_UPDATE, 0, &p)
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                assert!(data.len() <= MAX_PAYLOAD, "SPDY data frame too large");
                let mut out = Vec::with_capacity(8 + data.len());
                out.extend_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
                out.extend_from_slice(
                    &((u32::from(*flags) << 24) | data.len() as u32).to_be_bytes(),
                );
                out.extend_from_slice(data);
                out
            }
            Frame::Unknown { frame_type } => control(*frame_type, 0, &[]),
        }
    }
}

/// Reads frames: owns the decompression context of the receiving direction.
pub struct Decoder {
    z: Decompress,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A fresh context (one per connection).
    pub fn new() -> Self {
        Self {
            z: Decompress::new(true),
        }
    }

    fn decompress(&mut self, input: &[u8]) -> io::Result<Headers> {
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let mut pos = 0;
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(256));
            }
            let (in_before, out_before) = (self.z.total_in(), self.z.total_out());
            let result = self
                .z
                .decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync);
            pos += (self.z.total_in() - in_before) as usize;
            let progressed = self.z.total_in() != in_before || self.z.total_out() != out_before;
            if let Err(e) = result {
                match e.needs_dictionary() {
                    Some(_) => {
                        self.z
                            .set_dictionary(dictionary())
                            .map_err(|e| invalid(format!("header dictionary: {e}")))?;
                        continue;
                    }
                    None => return Err(invalid(format!("header block: {e}"))),
                }
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(invalid("header block too large"));
            }
            if pos == input.len() && out.len() < out.capacity() {
                break;
            }
            if !progressed {
                return Err(invalid("header block does not decompress"));
            }
        }
        decode_header_block(&out)
    }

    /// Decodes a frame from its 8-byte header and its payload (of the length the header says).
    pub fn decode(&mut self, head: [u8; 8], payload: &[u8]) -> io::Result<Frame> {
        let be32 = |b: &[u8], at: usize| -> io::Result<u32> {
            b.get(at..at + 4)
                .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
                .ok_or_else(|| invalid("control frame too short"))
        };
        let flags = head[4];
        if head[0] & 0x80 == 0 {
            return Ok(Frame::Data {
                stream_id: be32(&head, 0)? & 0x7fff_ffff,
                flags,
                data: payload.to_vec(),
            });
        }
        let frame_type = u16::from_be_bytes([head[2], head[3]]);
        let id = |at| Ok::<_, io::Error>(be32(payload, at)? & 0x7fff_ffff);
        Ok(match frame_type {
            TYPE_SYN_STREAM => {
                if payload.len() < 10 {
                    return Err(invalid("SYN_STREAM too short"));
                }
                Frame::SynStream {
                    stream_id: id(0)?,
                    associated_to: id(4)?,
                    priority: payload[8] >> 5,
                    flags,
                    headers: self.decompress(&payload[10..])?,
                }
            }
            TYPE_SYN_REPLY => Frame::SynReply {
                stream_id: id(0)?,
                flags,
                headers: self.decompress(&payload[4..])?,
            },
            TYPE_HEADERS => Frame::Headers {
                stream_id: id(0)?,
                flags,
                headers: self.decompress(&payload[4..])?,
            },
            TYPE_RST_STREAM => Frame::RstStream {
                stream_id: id(0)?,
                status: be32(payload, 4)?,
            },
            TYPE_SETTINGS => Frame::Settings,
            TYPE_PING => Frame::Ping {
                id: be32(payload, 0)?,
            },
            TYPE_GOAWAY => Frame::GoAway {
                last_good_stream_id: id(0)?,
                status: be32(payload, 4)?,
            },
            TYPE_WINDOW_UPDATE => Frame::WindowUpdate {
                stream_id: id(0)?,
                delta: be32(payload, 4)? & 0x7fff_ffff,
            },
            other => Frame::Unknown { frame_type: other },
        })
    }
}

/// Reads the next frame; `None` on a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    decoder: &mut Decoder,
) -> io::Result<Option<Frame>> {
    let mut head = [0u8; 8];
    if r.read(&mut head[..1]).await? == 0 {
        return Ok(None);
    }
    r.read_exact(&mut head[1..]).await?;
    let len = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
    let mut payload = vec![0; len];
    r.read_exact(&mut payload).await?;
    decoder.decode(head, &payload).map(Some)
}

/// How long a client has to close the connection after `GOAWAY`.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A server connection: a task reads frames (answering pings itself) into [`Self::frames`], a
/// task writes what is sent to [`Self::out`] (batching, flushing when idle).
pub struct Connection {
    /// Frames from the client other than pings; `None` once the connection has ended.
    pub frames: mpsc::Receiver<Frame>,
    /// Frames to the client.
    pub out: mpsc::Sender<Frame>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl Connection {
    /// Starts the reader and the writer on `io` (the upgraded connection).
    pub fn start<IO>(io: IO) -> Self
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out, out_rx) = mpsc::channel::<Frame>(64);
        let (in_tx, frames) = mpsc::channel::<Frame>(64);
        Self {
            frames,
            reader: tokio::spawn(read_frames(rd, in_tx, out.clone())),
            writer: tokio::spawn(write_frames(wr, out_rx)),
            out,
        }
    }

    /// Ends the connection: with `Some(last_stream_id)` sends `GOAWAY` and lets the client
    /// close first (for at most [`CLOSE_TIMEOUT`]: closing with unread data would make the
    /// kernel reset the connection and lose what is in flight); with `None` (the client is
    /// gone) just stops. Every other sender of [`Self::out`] must be gone for the writer to
    /// finish.
    pub async fn close(self, last_stream_id: Option<u32>) {
        let Self {
            frames,
            out,
            mut reader,
            writer,
        } = self;
        drop(frames);
        if let Some(last) = last_stream_id {
            let _ = out
                .send(Frame::GoAway {
                    last_good_stream_id: last,
                    status: 0,
                })
                .await;
        }
        if last_stream_id.is_none()
            || tokio::time::timeout(CLOSE_TIMEOUT, &mut reader)
                .await
                .is_err()
        {
            reader.abort();
            let _ = reader.await;
        }
        // The reader's ping sender is gone: the writer sends what is queued and closes.
        drop(out);
        let _ = writer.await;
    }
}

/// Reads frames: answers pings, passes the rest on (while someone listens).
async fn read_frames<R: AsyncRead>(rd: R, to: mpsc::Sender<Frame>, out: mpsc::Sender<Frame>) {
    let mut rd = std::pin::pin!(rd);
    let mut decoder = Decoder::new();
    loop {
        match read_frame(&mut rd, &mut decoder).await {
            Ok(Some(Frame::Ping { id })) => {
                let _ = out.send(Frame::Ping { id }).await;
            }
            Ok(Some(frame)) => {
                let _ = to.send(frame).await;
            }
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "reading SPDY frames");
                return;
            }
        }
    }
}

/// Writes frames until every sender is gone, then shuts the connection down.
async fn write_frames<W: AsyncWrite>(wr: W, mut frames: mpsc::Receiver<Frame>) {
    let mut wr = std::pin::pin!(wr);
    let mut encoder = Encoder::new();
    while let Some(frame) = frames.recv().await {
        if wr.write_all(&encoder.encode(&frame)).await.is_err() {
            return;
        }
        // Batch what is queued, flush when idle.
        while let Ok(frame) = frames.try_recv() {
            if wr.write_all(&encoder.encode(&frame)).await.is_err() {
                return;
            }
        }
        if wr.flush().await.is_err() {
            return;
        }
    }
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hx(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn h(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    async fn read_all(bytes: &[u8]) -> Vec<Frame> {
        let mut r = bytes;
        let mut d = Decoder::new();
        let mut frames = Vec::new();
        while let Some(f) = read_frame(&mut r, &mut d).await.unwrap() {
            frames.push(f);
        }
        frames
    }

    #[test]
    fn dictionary_is_the_spdy3_one() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        // Its Adler-32, as zlib streams using it announce (FDICT), e.g. the Go framer's.
        let mut z = Compress::new(Compression::default(), true);
        assert_eq!(z.set_dictionary(d).unwrap(), 0xe3c6_a7c2);
        assert!(d.starts_with(b"\0\0\0\x07options\0\0\0\x04head"));
        assert!(d.ends_with(b"utf-,*,enq=0."));
    }

    #[test]
    fn header_block_round_trip() {
        let headers = h(&[("streamtype", "error"), ("port", "8080"), ("empty", "")]);
        let block = encode_header_block(&headers);
        assert_eq!(&block[..4], &[0, 0, 0, 3]);
        assert_eq!(decode_header_block(&block).unwrap(), headers);
        assert_eq!(
            decode_header_block(&encode_header_block(&h(&[("StreamType", "x")]))).unwrap(),
            h(&[("streamtype", "x")])
        );
        assert!(decode_header_block(&block[..block.len() - 1]).is_err());
        assert!(decode_header_block(&[0, 0, 1, 0]).is_err());
    }

    /// Frames written by `github.com/moby/spdystream/spdy` (the Go framer of Kubernetes):
    /// SYN_STREAM 1 `streamType: error`, SYN_STREAM 3 `streamType: stdout` (same compression
    /// context), DATA 3 "hi" FIN, PING 1, SYN_REPLY 2 (no headers), GOAWAY 3.
    const GO_FRAMES: &str = "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2\
        d4c45c6851c29a0a0a6800000000ffff800300010000001900000003000000000000c22ac5565c92925f5a02\
        000000ffff00000003010000026869800300060000000400000001800300020000000e000000026260606000\
        000000ffff80030007000000080000000300000000";

    #[tokio::test]
    async fn decodes_frames_of_the_go_framer() {
        let frames = read_all(&hx(GO_FRAMES)).await;
        assert_eq!(
            frames,
            vec![
                Frame::SynStream {
                    stream_id: 1,
                    associated_to: 0,
                    priority: 0,
                    flags: 0,
                    headers: h(&[("streamtype", "error")]),
                },
                Frame::SynStream {
                    stream_id: 3,
                    associated_to: 0,
                    priority: 0,
                    flags: 0,
                    headers: h(&[("streamtype", "stdout")]),
                },
                Frame::Data {
                    stream_id: 3,
                    flags: FLAG_FIN,
                    data: b"hi".to_vec(),
                },
                Frame::Ping { id: 1 },
                // Written by the same framer, so in the same compression context.
                Frame::SynReply {
                    stream_id: 2,
                    flags: 0,
                    headers: vec![],
                },
                Frame::GoAway {
                    last_good_stream_id: 3,
                    status: 0,
                },
            ]
        );
    }

    #[tokio::test]
    async fn frames_round_trip_through_one_context_per_direction() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 2,
                flags: 0,
                headers: h(&[("streamtype", "error")]),
            },
            Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: vec![],
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 1,
                priority: 0,
                flags: FLAG_FIN,
                headers: h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::Headers {
                stream_id: 3,
                flags: 0,
                headers: h(&[("a", "b\0c")]),
            },
            Frame::Data {
                stream_id: 3,
                flags: 0,
                data: vec![7; 70_000],
            },
            Frame::fin(3),
            Frame::RstStream {
                stream_id: 5,
                status: RST_REFUSED_STREAM,
            },
            Frame::Ping { id: 2 },
            Frame::WindowUpdate {
                stream_id: 0,
                delta: 65536,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: 0,
            },
            Frame::Settings,
            Frame::Unknown { frame_type: 42 },
        ];
        let mut e = Encoder::new();
        let mut bytes = Vec::new();
        for f in &frames {
            bytes.extend(e.encode(f));
        }
        // The first header block announces the dictionary (zlib FDICT + its Adler-32).
        assert_eq!(bytes[18] & 0x0f, 8, "deflate");
        assert_ne!(bytes[19] & 0x20, 0, "FDICT");
        assert_eq!(&bytes[20..24], &[0xe3, 0xc6, 0xa7, 0xc2]);
        assert_eq!(read_all(&bytes).await, frames);
    }

    #[test]
    fn control_frame_header_layout() {
        let mut e = Encoder::new();
        assert_eq!(
            e.encode(&Frame::Ping { id: 7 }),
            hx("800300060000000400000007")
        );
        assert_eq!(
            e.encode(&Frame::RstStream {
                stream_id: 3,
                status: RST_PROTOCOL_ERROR
            }),
            hx("80030003000000080000000300000001")
        );
        assert_eq!(
            e.encode(&Frame::Data {
                stream_id: 5,
                flags: FLAG_FIN,
                data: b"ok".to_vec()
            }),
            hx("00000005010000026f6b")
        );
    }

    #[tokio::test]
    async fn corrupt_header_block_is_an_error() {
        let mut bytes = hx(GO_FRAMES);
        bytes[30] ^= 0xff;
        let mut r = &bytes[..];
        assert!(read_frame(&mut r, &mut Decoder::new()).await.is_err());
        // Truncated frame.
        let bytes = hx("8003000600000004000000");
        let mut r = &bytes[..];
        assert!(read_frame(&mut r, &mut Decoder::new()).await.is_err());
    }
}
