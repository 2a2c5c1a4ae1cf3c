//! The bytes a node sends after `PSYNC ? -1` (sans I/O): keep-alive newlines,
//! `+FULLRESYNC <replid> <offset>`, more keep-alives, the payload header, the payload.
//!
//! The payload comes in one of two forms:
//! - `$<len>\r\n` and `len` bytes (an RDB file the server saved to disk first);
//! - `$EOF:<mark>\r\n` and bytes up to the same 40-byte mark (diskless: the RDB is written to
//!   the socket as it is produced). The mark is recognised as the server's own replicas do:
//!   when the last 40 bytes received so far are the mark. The server sends nothing after it
//!   until the replica acknowledges, so the mark is always at the end of a read; the last 40
//!   bytes are held back until more arrive, and the mark itself is never passed on.

/// Length of the diskless transfer's end mark.
pub const EOF_MARK_LEN: usize = 40;
/// Longest line accepted before the payload (the server's own limit for these lines is
/// 1024 bytes; error replies are shorter).
const MAX_LINE: usize = 4096;

/// How the payload is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    /// `$<len>`: the server saved an RDB file to disk and sends it (`repl-diskless-sync no`).
    Disk {
        /// Announced payload length.
        len: u64,
    },
    /// `$EOF:<mark>`: the server's fork writes the RDB to the socket as it produces it
    /// (`repl-diskless-sync yes`); the length is known only at the end.
    Diskless,
}

/// Something the stream said (other than payload bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An empty line: the server is alive, preparing the RDB.
    KeepAlive,
    /// `+FULLRESYNC <replid> <offset>`: the snapshot's replication id and offset.
    FullResync {
        /// Replication id of the serving node's history.
        replid: String,
        /// Replication offset the snapshot corresponds to.
        offset: u64,
    },
    /// The payload header.
    Header(Transfer),
    /// The payload is complete.
    End,
}

/// What the stream did wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    /// The server answered with an error reply (its words, without the `-`).
    Server(String),
    /// Something that is not this protocol.
    Protocol(String),
}

/// Payload bytes released by one [`SyncStream::feed`] call: held-back bytes first, then a
/// slice of the input.
#[derive(Debug)]
pub struct Released<'a> {
    held: [u8; EOF_MARK_LEN],
    held_len: usize,
    /// Bytes of the input that are payload (after [`Released::held`]).
    pub body: &'a [u8],
}

impl Default for Released<'_> {
    fn default() -> Self {
        Self {
            held: [0; EOF_MARK_LEN],
            held_len: 0,
            body: &[],
        }
    }
}

impl Released<'_> {
    /// Earlier-held payload bytes released now (they come before [`Released::body`]).
    pub fn held(&self) -> &[u8] {
        &self.held[..self.held_len]
    }
}

/// Result of one [`SyncStream::feed`] call.
#[derive(Debug, Default)]
pub struct Fed<'a> {
    /// Input bytes consumed (the rest is to be fed again, unless the stream is done).
    pub consumed: usize,
    /// What the stream said, if anything.
    pub event: Option<Event>,
    /// Payload bytes, in order.
    pub data: Released<'a>,
}

#[derive(Debug)]
enum State {
    /// Waiting for `+FULLRESYNC`.
    Reply,
    /// Waiting for `$...`.
    Header,
    /// In a `$<len>` payload.
    Sized { remaining: u64 },
    /// In a `$EOF:` payload; `held` are the latest bytes (at most 40), not yet released.
    Marked {
        mark: [u8; EOF_MARK_LEN],
        held: Vec<u8>,
    },
    /// The payload ended.
    Done,
}

/// Parser of the stream after `PSYNC ? -1`.
#[derive(Debug)]
pub struct SyncStream {
    state: State,
    line: Vec<u8>,
}

impl Default for SyncStream {
    fn default() -> Self {
        Self::new()
    }
}

impl SyncStream {
    /// A parser expecting the `PSYNC` reply.
    pub fn new() -> Self {
        Self {
            state: State::Reply,
            line: Vec::new(),
        }
    }

    /// Whether the payload is complete.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether the payload has begun (its header was read).
    pub fn in_payload(&self) -> bool {
        matches!(self.state, State::Sized { .. } | State::Marked { .. })
    }

    /// Feeds received bytes; handles one line or one run of payload bytes per call, so call
    /// again with the unconsumed rest. In a diskless payload, all the input is consumed (the
    /// end mark is looked for at the end of each input, i.e. of each read).
    pub fn feed<'a>(&mut self, input: &'a [u8]) -> Result<Fed<'a>, StreamError> {
        match &mut self.state {
            State::Done => Ok(Fed::default()),
            State::Reply | State::Header => self.feed_line(input),
            State::Sized { remaining } => {
                let take = (*remaining).min(input.len() as u64) as usize;
                *remaining -= take as u64;
                let done = *remaining == 0;
                if done {
                    self.state = State::Done;
                }
                Ok(Fed {
                    consumed: take,
                    event: done.then_some(Event::End),
                    data: Released {
                        body: &input[..take],
                        ..Released::default()
                    },
                })
            }
            State::Marked { mark, held } => {
                let total = held.len() + input.len();
                let mut data = Released::default();
                if total > EOF_MARK_LEN {
                    let release = total - EOF_MARK_LEN;
                    let from_held = release.min(held.len());
                    data.held[..from_held].copy_from_slice(&held[..from_held]);
                    data.held_len = from_held;
                    held.drain(..from_held);
                    let from_input = release - from_held;
                    data.body = &input[..from_input];
                    held.extend_from_slice(&input[from_input..]);
                } else {
                    held.extend_from_slice(input);
                }
                let done = held.as_slice() == mark.as_slice();
                if done {
                    self.state = State::Done;
                }
                Ok(Fed {
                    consumed: input.len(),
                    event: done.then_some(Event::End),
                    data,
                })
            }
        }
    }

    fn feed_line<'a>(&mut self, input: &'a [u8]) -> Result<Fed<'a>, StreamError> {
        let Some(nl) = input.iter().position(|&b| b == b'\n') else {
            self.push_line(input)?;
            return Ok(Fed {
                consumed: input.len(),
                ..Fed::default()
            });
        };
        self.push_line(&input[..nl])?;
        let mut line = std::mem::take(&mut self.line);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        let event = self.on_line(&line)?;
        Ok(Fed {
            consumed: nl + 1,
            event: Some(event),
            ..Fed::default()
        })
    }

    fn push_line(&mut self, part: &[u8]) -> Result<(), StreamError> {
        if self.line.len() + part.len() > MAX_LINE {
            return Err(StreamError::Protocol(format!(
                "a line of more than {MAX_LINE} bytes where a replication reply belongs: {}...",
                self.line[..self.line.len().min(64)].escape_ascii()
            )));
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn on_line(&mut self, line: &[u8]) -> Result<Event, StreamError> {
        if line.is_empty() {
            return Ok(Event::KeepAlive);
        }
        if let Some(err) = line.strip_prefix(b"-") {
            return Err(StreamError::Server(
                String::from_utf8_lossy(err).into_owned(),
            ));
        }
        let unexpected = |what: &str| {
            StreamError::Protocol(format!(
                "expected {what}, got {:?}",
                String::from_utf8_lossy(&line[..line.len().min(200)])
            ))
        };
        match self.state {
            State::Reply => {
                let text = std::str::from_utf8(line).map_err(|_| unexpected("+FULLRESYNC"))?;
                let mut words = text.split(' ');
                match (words.next(), words.next(), words.next(), words.next()) {
                    (Some("+FULLRESYNC"), Some(replid), Some(offset), None)
                        if !replid.is_empty() =>
                    {
                        let offset = offset
                            .parse()
                            .map_err(|_| unexpected("+FULLRESYNC <replid> <offset>"))?;
                        self.state = State::Header;
                        Ok(Event::FullResync {
                            replid: replid.to_owned(),
                            offset,
                        })
                    }
                    _ => Err(unexpected("+FULLRESYNC <replid> <offset>")),
                }
            }
            State::Header => {
                if let Some(mark) = line.strip_prefix(b"$EOF:") {
                    let mark: [u8; EOF_MARK_LEN] = mark
                        .get(..EOF_MARK_LEN)
                        .and_then(|m| m.try_into().ok())
                        .ok_or_else(|| unexpected("$EOF:<40-byte mark>"))?;
                    self.state = State::Marked {
                        mark,
                        held: Vec::with_capacity(EOF_MARK_LEN),
                    };
                    return Ok(Event::Header(Transfer::Diskless));
                }
                let len = line
                    .strip_prefix(b"$")
                    .and_then(|d| std::str::from_utf8(d).ok())
                    .and_then(|d| d.parse::<u64>().ok())
                    .ok_or_else(|| unexpected("$<length> or $EOF:<mark>"))?;
                if len == 0 {
                    return Err(StreamError::Protocol("an empty payload ($0)".into()));
                }
                self.state = State::Sized { remaining: len };
                Ok(Event::Header(Transfer::Disk { len }))
            }
            State::Sized { .. } | State::Marked { .. } | State::Done => {
                unreachable!("lines are read only before the payload")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const REPLID: &str = "8a857c1a1e81d306c55d8ca800b70fbc3e4ff8d7";
    const MARK: &[u8; 40] = b"db345542ae52c4f333f8ab0e915caee48cc305ac";

    /// Everything a stream said, from feeding it in the given pieces.
    #[derive(Debug, Default, PartialEq)]
    struct Outcome {
        events: Vec<Event>,
        payload: Vec<u8>,
        /// Input bytes not consumed when the payload ended.
        unconsumed: usize,
    }

    fn run(pieces: &[&[u8]]) -> Result<Outcome, StreamError> {
        let mut s = SyncStream::new();
        let mut out = Outcome::default();
        for (i, piece) in pieces.iter().enumerate() {
            let mut at = 0;
            while at < piece.len() && !s.is_done() {
                let fed = s.feed(&piece[at..])?;
                assert!(fed.consumed > 0 || fed.event.is_some(), "no progress");
                at += fed.consumed;
                out.payload.extend_from_slice(fed.data.held());
                out.payload.extend_from_slice(fed.data.body);
                out.events.extend(fed.event);
            }
            if s.is_done() {
                out.unconsumed =
                    piece.len() - at + pieces[i + 1..].iter().map(|p| p.len()).sum::<usize>();
                break;
            }
        }
        Ok(out)
    }

    fn split_at_all(stream: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut at = 0;
        let mut v = Vec::new();
        for &c in cuts.iter().chain([&stream.len()]) {
            v.push(stream[at..c].to_vec());
            at = c;
        }
        v
    }

    fn sized_stream(payload: &[u8], keepalives: (usize, usize)) -> Vec<u8> {
        let mut s = b"\n".repeat(keepalives.0);
        s.extend_from_slice(format!("+FULLRESYNC {REPLID} 1234\r\n").as_bytes());
        s.extend_from_slice(&b"\n".repeat(keepalives.1));
        s.extend_from_slice(format!("${}\r\n", payload.len()).as_bytes());
        s.extend_from_slice(payload);
        s
    }

    fn marked_stream(payload: &[u8], keepalives: (usize, usize)) -> Vec<u8> {
        let mut s = b"\n".repeat(keepalives.0);
        s.extend_from_slice(format!("+FULLRESYNC {REPLID} 0\r\n").as_bytes());
        s.extend_from_slice(&b"\n".repeat(keepalives.1));
        s.extend_from_slice(b"$EOF:");
        s.extend_from_slice(MARK);
        s.extend_from_slice(b"\r\n");
        s.extend_from_slice(payload);
        s.extend_from_slice(MARK);
        s
    }

    fn expected(transfer: Transfer, offset: u64, keepalives: (usize, usize)) -> Vec<Event> {
        let mut e = vec![Event::KeepAlive; keepalives.0];
        e.push(Event::FullResync {
            replid: REPLID.into(),
            offset,
        });
        e.extend(vec![Event::KeepAlive; keepalives.1]);
        e.push(Event::Header(transfer));
        e.push(Event::End);
        e
    }

    /// Payload bytes that look like protocol: newlines, `$`, CRLF, part of the mark.
    fn tricky_payload() -> Vec<u8> {
        let mut p = b"REDIS0011\n\r\n$EOF:\r\n+FULLRESYNC x 1\r\n".to_vec();
        p.extend_from_slice(&MARK[..39]);
        p.extend_from_slice(b"\xff\x00");
        p.extend_from_slice(&MARK[1..]);
        p.extend_from_slice(b"\xffabcdefgh");
        p
    }

    #[test]
    fn sized_payload_at_every_single_split() {
        let payload = tricky_payload();
        let stream = sized_stream(&payload, (2, 3));
        let want = expected(
            Transfer::Disk {
                len: payload.len() as u64,
            },
            1234,
            (2, 3),
        );
        parses_at_every_single_split(&stream, &payload, &want);
    }

    /// `stream` cut in two at every position gives `payload` and the events `want`.
    fn parses_at_every_single_split(stream: &[u8], payload: &[u8], want: &[Event]) {
        for cut in 0..=stream.len() {
            let pieces = split_at_all(stream, &[cut]);
            let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let out = run(&refs).unwrap();
            assert_eq!(out.payload, payload, "cut at {cut}");
            assert_eq!(out.events, want, "cut at {cut}");
        }
    }

    #[test]
    fn marked_payload_at_every_single_split() {
        let payload = tricky_payload();
        let stream = marked_stream(&payload, (1, 0));
        let want = expected(Transfer::Diskless, 0, (1, 0));
        parses_at_every_single_split(&stream, &payload, &want);
    }

    #[test]
    fn byte_at_a_time() {
        let payload = tricky_payload();
        for stream in [
            sized_stream(&payload, (0, 1)),
            marked_stream(&payload, (3, 2)),
        ] {
            let refs: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(run(&refs).unwrap().payload, payload);
        }
    }

    #[test]
    fn mark_is_split_across_reads() {
        let payload = b"REDIS0011 some rdb bytes \xff12345678".to_vec();
        let stream = marked_stream(&payload, (0, 0));
        let body_end = stream.len() - EOF_MARK_LEN;
        for k in 1..EOF_MARK_LEN {
            let pieces = split_at_all(&stream, &[body_end, body_end + k]);
            let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let out = run(&refs).unwrap();
            assert_eq!(out.payload, payload, "mark split after {k} bytes");
        }
    }

    #[test]
    fn a_sized_payload_stops_at_its_length() {
        // What follows the payload (the command stream of a non-rdb-only replica) is not
        // consumed.
        let mut stream = sized_stream(b"REDIS0011xyz", (0, 0));
        stream.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        let out = run(&[&stream]).unwrap();
        assert_eq!(out.payload, b"REDIS0011xyz");
        assert_eq!(out.unconsumed, 14);
    }

    #[test]
    fn an_unterminated_marked_payload_is_not_done() {
        let stream = marked_stream(b"REDIS0011xyz", (0, 0));
        let cut = &stream[..stream.len() - 1];
        let mut s = SyncStream::new();
        let mut at = 0;
        while at < cut.len() {
            at += s.feed(&cut[at..]).unwrap().consumed;
        }
        assert!(!s.is_done());
        assert!(s.in_payload());
    }

    #[test]
    fn errors_and_junk() {
        let e = run(&[b"\n-NOPERM User b has no permissions to run the 'psync' command\r\n"])
            .unwrap_err();
        assert_eq!(
            e,
            StreamError::Server(
                "NOPERM User b has no permissions to run the 'psync' command".into()
            )
        );
        let e =
            run(&[b"-NOMASTERLINK Can't SYNC while not connected with my master\r\n"]).unwrap_err();
        assert!(matches!(e, StreamError::Server(m) if m.starts_with("NOMASTERLINK")));
        let e = run(&[format!("+FULLRESYNC {REPLID} 5\r\n-ERR BGSAVE failed\r\n").as_bytes()])
            .unwrap_err();
        assert!(matches!(e, StreamError::Server(m) if m == "ERR BGSAVE failed"));
        for junk in [
            &b"+CONTINUE abc\r\n"[..],
            b"+DUALCHANNELSYNC\r\n",
            b"+FULLRESYNC abc\r\n",
            b"+FULLRESYNC abc -1\r\n",
            b"HTTP/1.1 400 Bad Request\r\n",
        ] {
            let e = run(&[junk]).unwrap_err();
            assert!(matches!(e, StreamError::Protocol(_)), "{junk:?}: {e:?}");
        }
        for header in [
            &b"$EOF:short\r\n"[..],
            b"$-1\r\n",
            b"$0\r\n",
            b"$12a\r\n",
            b"*1\r\n",
        ] {
            let mut s = format!("+FULLRESYNC {REPLID} 5\r\n").into_bytes();
            s.extend_from_slice(header);
            let e = run(&[&s]).unwrap_err();
            assert!(matches!(e, StreamError::Protocol(_)), "{header:?}: {e:?}");
        }
        let long = vec![b'x'; MAX_LINE + 1];
        assert!(matches!(
            run(&[&long]).unwrap_err(),
            StreamError::Protocol(_)
        ));
    }

    proptest! {
        #[test]
        fn any_payload_any_splits(
            payload in proptest::collection::vec(
                prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'$'), Just(MARK[0]), any::<u8>()],
                1..400,
            ),
            diskless in any::<bool>(),
            keepalives in (0usize..4, 0usize..4),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..16),
        ) {
            let stream = if diskless {
                marked_stream(&payload, keepalives)
            } else {
                sized_stream(&payload, keepalives)
            };
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
            cuts.sort_unstable();
            let pieces = split_at_all(&stream, &cuts);
            let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let out = run(&refs).unwrap();
            prop_assert_eq!(&out.payload, &payload);
            let (transfer, offset) = if diskless {
                (Transfer::Diskless, 0)
            } else {
                (Transfer::Disk { len: payload.len() as u64 }, 1234)
            };
            prop_assert_eq!(out.events, expected(transfer, offset, keepalives));
            prop_assert_eq!(out.unconsumed, 0);
        }
    }
}
