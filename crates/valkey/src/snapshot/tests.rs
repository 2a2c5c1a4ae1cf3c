//! The I/O side against scripted fake servers on loopback (the real servers are in
//! `tests/real_valkey_snapshot.rs`).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const REPLID: &str = "8a857c1a1e81d306c55d8ca800b70fbc3e4ff8d7";
const MARK: &[u8; 40] = b"db345542ae52c4f333f8ab0e915caee48cc305ac";

/// A well-formed fake RDB of about `n` bytes.
fn fake_rdb(n: usize) -> Vec<u8> {
    let mut v = b"VALKEY080".to_vec();
    v.extend((0..n).map(|i| (i * 7 % 251) as u8));
    v.push(0xFF);
    let crc = rdb::RDB_CRC.checksum(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    v
}

fn hello_reply(version: &str) -> Vec<u8> {
    format!(
        "*14\r\n$6\r\nserver\r\n$6\r\nvalkey\r\n$7\r\nversion\r\n${}\r\n{version}\r\n\
         $5\r\nproto\r\n:2\r\n$2\r\nid\r\n:5\r\n$4\r\nmode\r\n$7\r\ncluster\r\n\
         $4\r\nrole\r\n$5\r\nslave\r\n$7\r\nmodules\r\n*1\r\n*8\r\n$4\r\nname\r\n$3\r\nlua\r\n\
         $3\r\nver\r\n:1\r\n$4\r\npath\r\n$3\r\nlua\r\n$4\r\nargs\r\n*0\r\n",
        version.len()
    )
    .into_bytes()
}

/// How the fake server answers the handshake.
#[derive(Clone)]
struct Script {
    auth: &'static str,
    replconf_version: &'static str,
}

impl Default for Script {
    fn default() -> Self {
        Self {
            auth: "+OK\r\n",
            replconf_version: "+OK\r\n",
        }
    }
}

/// Reads commands and answers them until `PSYNC` (or an error reply to `AUTH`); the
/// commands received.
async fn handshake(sock: &mut TcpStream, script: &Script) -> Vec<Vec<String>> {
    let mut seen = Vec::new();
    let mut pending = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let Some((Reply::Array(Some(args)), used)) = parse_reply(&pending, 0).unwrap() else {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                return seen;
            }
            pending.extend_from_slice(&buf[..n]);
            continue;
        };
        pending.drain(..used);
        let args: Vec<String> = args
            .into_iter()
            .map(|a| match a {
                Reply::Bulk(Some(b)) => String::from_utf8(b).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        let reply: Vec<u8> = match args[0].as_str() {
            "AUTH" => script.auth.into(),
            "HELLO" => hello_reply("9.1.2"),
            "REPLCONF" if args[1] == "version" => script.replconf_version.into(),
            "REPLCONF" => b"+OK\r\n".to_vec(),
            "PSYNC" => {
                seen.push(args);
                return seen;
            }
            other => panic!("unexpected command {other}"),
        };
        let stop = args[0] == "AUTH" && reply.starts_with(b"-");
        seen.push(args);
        sock.write_all(&reply).await.unwrap();
        if stop {
            return seen;
        }
    }
}

/// Serves one connection: the handshake, then `after_psync`. Returns the address and the
/// commands the server received.
async fn fake_server<F, Fut>(
    script: Script,
    after_psync: F,
) -> (String, tokio::task::JoinHandle<Vec<Vec<String>>>)
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let seen = handshake(&mut sock, &script).await;
        if seen.last().is_some_and(|c| c[0] == "PSYNC") {
            tokio::spawn(after_psync(sock));
        }
        seen
    });
    (addr, task)
}

fn config() -> ClientConfig {
    ClientConfig::new("backup", "secret")
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(2))
}

fn options(idle_ms: u64, chunk: usize) -> SnapshotOptions {
    SnapshotOptions {
        idle_timeout: Duration::from_millis(idle_ms),
        chunk_size: chunk,
    }
}

/// A sink that records the size of each write.
#[derive(Default)]
struct Recorder {
    data: Vec<u8>,
    writes: Vec<usize>,
    flushed: bool,
}

impl AsyncWrite for Recorder {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.data.extend_from_slice(buf);
        self.writes.push(buf.len());
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.flushed = true;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[test]
fn parses_replies() {
    let hello = hello_reply("9.1.2");
    let (r, used) = parse_reply(&hello, 0).unwrap().unwrap();
    assert_eq!(used, hello.len());
    let Reply::Array(Some(items)) = &r else {
        panic!("{r:?}")
    };
    assert_eq!(items.len(), 14);
    for cut in 0..hello.len() {
        assert_eq!(parse_reply(&hello[..cut], 0).unwrap(), None, "cut {cut}");
    }
    assert_eq!(
        parse_reply(b"-NOPERM no\r\n+OK\r\n", 0).unwrap(),
        Some((Reply::Error("NOPERM no".into()), 12))
    );
    assert_eq!(
        parse_reply(b"$-1\r\n", 0).unwrap(),
        Some((Reply::Bulk(None), 5))
    );
    assert_eq!(
        parse_reply(b":12\r\n", 0).unwrap(),
        Some((Reply::Int(12), 5))
    );
    assert!(parse_reply(b"HTTP/1.1 400\r\n", 0).is_err());
    assert!(parse_reply(b"$x\r\n", 0).is_err());
    let deep = "*1\r\n".repeat(9) + "*0\r\n";
    assert!(parse_reply(deep.as_bytes(), 0).is_err());
}

#[tokio::test]
async fn announces_only_what_is_implemented_and_streams_in_bounded_writes() {
    let rdb = fake_rdb(100_000);
    let payload = rdb.clone();
    let (addr, server) = fake_server(Script::default(), move |mut sock| async move {
        let mut s = format!("\n\n+FULLRESYNC {REPLID} 42\r\n\n$EOF:").into_bytes();
        s.extend_from_slice(MARK);
        s.extend_from_slice(b"\r\n");
        s.extend_from_slice(&payload);
        s.extend_from_slice(MARK);
        for piece in s.chunks(7_919) {
            sock.write_all(piece).await.unwrap();
        }
        // The client closes as soon as the mark arrived: it does not wait for this.
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let mut sink = Recorder::default();
    let info = stream_snapshot(&addr, &config(), &options(5_000, 1_000), &mut sink)
        .await
        .unwrap();
    let seen = server.await.unwrap();
    assert_eq!(
        seen,
        vec![
            vec!["AUTH", "backup", "secret"],
            vec!["HELLO"],
            vec!["REPLCONF", "capa", "eof", "rdb-only", "1"],
            vec!["REPLCONF", "version", "9.1.2"],
            vec!["PSYNC", "?", "-1"],
        ]
    );
    assert_eq!(sink.data, rdb);
    assert!(sink.flushed);
    assert!(
        sink.writes.iter().all(|&w| w <= 1_000 + RDB_HEADER_LEN),
        "{:?}",
        sink.writes.iter().max()
    );
    assert_eq!(info.replid, REPLID);
    assert_eq!(info.offset, 42);
    assert_eq!(info.bytes, rdb.len() as u64);
    assert_eq!(info.sha256, hex::encode(sha2::Sha256::digest(&rdb)));
    assert_eq!((info.rdb_magic, info.rdb_version), (RdbMagic::Valkey, 80));
    assert_eq!(info.transfer, Transfer::Diskless);
    assert_eq!(info.server_version, "9.1.2");
    assert_eq!(info.keepalives, 3);
    assert_eq!(
        info.rdb_checksum,
        Some(u64::from_le_bytes(rdb[rdb.len() - 8..].try_into().unwrap()))
    );
}

use sha2::Digest as _;

#[tokio::test]
async fn keepalives_restart_the_idle_timer() {
    let rdb = fake_rdb(1_000);
    let payload = rdb.clone();
    let (addr, _server) = fake_server(Script::default(), move |mut sock| async move {
        // 1.2 s of preparation, a newline every 100 ms, against an idle timeout of 400 ms.
        for _ in 0..6 {
            sock.write_all(b"\n").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sock.write_all(format!("+FULLRESYNC {REPLID} 7\r\n").as_bytes())
            .await
            .unwrap();
        for _ in 0..6 {
            sock.write_all(b"\n").await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sock.write_all(format!("${}\r\n", payload.len()).as_bytes())
            .await
            .unwrap();
        sock.write_all(&payload).await.unwrap();
        // A non-rdb-only server would go on with the command stream.
        sock.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let mut sink = Vec::new();
    let info = stream_snapshot(&addr, &config(), &options(400, 64 * 1024), &mut sink)
        .await
        .unwrap();
    assert_eq!(sink, rdb);
    assert_eq!(info.keepalives, 12);
    assert_eq!(
        info.transfer,
        Transfer::Disk {
            len: rdb.len() as u64
        }
    );
}

#[tokio::test]
async fn a_silent_server_times_out() {
    let (addr, _server) = fake_server(Script::default(), |sock| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(sock);
    })
    .await;
    let e = stream_snapshot(&addr, &config(), &options(300, 1024), &mut Vec::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            SnapshotError::Timeout {
                stage: Stage::PsyncReply,
                ..
            }
        ),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_connection_closed_mid_payload_is_incomplete() {
    for diskless in [false, true] {
        let rdb = fake_rdb(10_000);
        let payload = rdb.clone();
        let (addr, _server) = fake_server(Script::default(), move |mut sock| async move {
            let mut s = format!("+FULLRESYNC {REPLID} 0\r\n").into_bytes();
            if diskless {
                s.extend_from_slice(b"$EOF:");
                s.extend_from_slice(MARK);
                s.extend_from_slice(b"\r\n");
            } else {
                s.extend_from_slice(format!("${}\r\n", payload.len()).as_bytes());
            }
            s.extend_from_slice(&payload[..5_000]);
            sock.write_all(&s).await.unwrap();
        })
        .await;
        let e = stream_snapshot(&addr, &config(), &options(5_000, 1024), &mut Vec::new())
            .await
            .unwrap_err();
        match e {
            SnapshotError::Incomplete {
                received, expected, ..
            } => {
                // Diskless: the last 40 bytes received might have been the mark.
                let want = if diskless { 5_000 - 40 } else { 5_000 };
                assert_eq!(received, want);
                assert_eq!(expected, (!diskless).then_some(rdb.len() as u64));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_payload_that_is_not_an_rdb_reaches_no_sink() {
    let (addr, _server) = fake_server(Script::default(), |mut sock| async move {
        let s = format!("+FULLRESYNC {REPLID} 0\r\n$20\r\nGARBAGE-NOT-AN-RDB!!");
        sock.write_all(s.as_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    let mut sink = Vec::new();
    let e = stream_snapshot(&addr, &config(), &options(5_000, 1024), &mut sink)
        .await
        .unwrap_err();
    assert!(matches!(e, SnapshotError::InvalidRdb { .. }), "{e:?}");
    assert!(e.to_string().contains("GARBAGE-"), "{e}");
    assert!(sink.is_empty());
}

/// A fake server that sends `rdb` in the disk-based form after `PSYNC`, then stays open.
async fn serve_sized(rdb: Vec<u8>) -> (String, tokio::task::JoinHandle<Vec<Vec<String>>>) {
    fake_server(Script::default(), move |mut sock| async move {
        let mut s = format!("+FULLRESYNC {REPLID} 0\r\n${}\r\n", rdb.len()).into_bytes();
        s.extend_from_slice(&rdb);
        sock.write_all(&s).await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await
}

#[tokio::test]
async fn a_damaged_rdb_fails_its_checksum() {
    let mut rdb = fake_rdb(5_000);
    rdb[100] ^= 1;
    let (addr, _server) = serve_sized(rdb).await;
    let e = stream_snapshot(&addr, &config(), &options(5_000, 1024), &mut Vec::new())
        .await
        .unwrap_err();
    assert!(matches!(e, SnapshotError::Checksum { .. }), "{e:?}");
}

#[tokio::test]
async fn without_a_checksum_none_is_reported() {
    let mut rdb = fake_rdb(500);
    let n = rdb.len();
    rdb[n - 8..].fill(0);
    let (addr, _server) = serve_sized(rdb).await;
    let info = stream_snapshot(&addr, &config(), &options(5_000, 1024), &mut Vec::new())
        .await
        .unwrap();
    assert_eq!(info.rdb_checksum, None);
}

#[tokio::test]
async fn errors_carry_the_servers_words() {
    let script = Script {
        auth: "-WRONGPASS invalid username-password pair or user is disabled.\r\n",
        ..Script::default()
    };
    let (addr, _server) = fake_server(script, |_| async {}).await;
    let e = stream_snapshot(&addr, &config(), &options(5_000, 1024), &mut Vec::new())
        .await
        .unwrap_err();
    assert!(matches!(e, SnapshotError::Auth { .. }), "{e:?}");
    assert_eq!(
        e.server_message(),
        Some("WRONGPASS invalid username-password pair or user is disabled.")
    );

    let (addr, _server) = fake_server(Script::default(), |mut sock| async move {
        sock.write_all(b"\n-NOMASTERLINK Can't SYNC while not connected with my master\r\n")
            .await
            .unwrap();
    })
    .await;
    let e = stream_snapshot(&addr, &config(), &options(5_000, 1024), &mut Vec::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, SnapshotError::Server { command, .. } if command == "PSYNC"),
        "{e:?}"
    );
    assert!(e.to_string().contains("NOMASTERLINK Can't SYNC"), "{e}");
}

#[tokio::test]
async fn an_older_server_without_replconf_version_is_fine() {
    let rdb = fake_rdb(100);
    let script = Script {
        replconf_version: "-ERR Unrecognized REPLCONF option: version\r\n",
        ..Script::default()
    };
    let (addr, _server) = fake_server(script, move |mut sock| async move {
        let mut s = format!("+FULLRESYNC {REPLID} 0\r\n${}\r\n", rdb.len()).into_bytes();
        s.extend_from_slice(&rdb);
        sock.write_all(&s).await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    })
    .await;
    stream_snapshot(&addr, &config(), &options(5_000, 1024), &mut Vec::new())
        .await
        .unwrap();
}

#[tokio::test]
async fn refuses_empty_credentials_and_reports_refused_connections() {
    let e = stream_snapshot(
        "127.0.0.1:1",
        &ClientConfig::new("", ""),
        &SnapshotOptions::default(),
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, SnapshotError::Config(_)), "{e:?}");
    let e = stream_snapshot(
        "127.0.0.1:1",
        &config(),
        &SnapshotOptions::default(),
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, SnapshotError::Connect { .. }), "{e:?}");
}

/// The client's own ceiling: a 256 MB payload from a fake server that has it ready in
/// memory, over loopback, into a discarding sink (`cargo test -p valkey-ops --lib
/// client_side_rate -- --ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn client_side_rate() {
    let rdb = Arc::new(fake_rdb(256 << 20));
    for diskless in [false, true] {
        let payload = Arc::clone(&rdb);
        let (addr, _server) = fake_server(Script::default(), move |mut sock| async move {
            let mut head = format!("+FULLRESYNC {REPLID} 0\r\n").into_bytes();
            if diskless {
                head.extend_from_slice(b"$EOF:");
                head.extend_from_slice(MARK);
                head.extend_from_slice(b"\r\n");
            } else {
                head.extend_from_slice(format!("${}\r\n", payload.len()).as_bytes());
            }
            sock.write_all(&head).await.unwrap();
            sock.write_all(&payload).await.unwrap();
            if diskless {
                sock.write_all(MARK).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
        let t = Instant::now();
        let info = stream_snapshot(
            &addr,
            &config(),
            &SnapshotOptions::default(),
            &mut tokio::io::sink(),
        )
        .await
        .unwrap();
        let secs = t.elapsed().as_secs_f64();
        println!(
            "diskless={diskless}: {} bytes in {secs:.2} s = {:.0} MB/s",
            info.bytes,
            info.bytes as f64 / secs / 1e6
        );
    }
}
