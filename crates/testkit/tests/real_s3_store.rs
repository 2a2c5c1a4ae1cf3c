//! The `object_store` crate's S3 client against a real S3-compatible server (SeaweedFS, started
//! by [`S3Server`]): a streamed multipart upload read back and compared by SHA-256, listing by
//! prefix and deletion; wrong credentials refused with the store's own error; an unreachable
//! endpoint and one that never answers failing within a bounded time.

use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart,
};
use sha2::{Digest, Sha256};
use valkey_testkit::{S3_REGION, S3Server, free_port};

const MIB: usize = 1024 * 1024;
/// The part size of the multipart upload (S3's minimum for all parts but the last).
const PART: usize = 5 * MIB;
/// About 20 MiB, not a multiple of the part size: four full parts and a short last one.
const OBJECT_SIZE: usize = 20 * MIB + 123 * 1024;

/// A client for `endpoint` with path-style requests over plain HTTP, whose failures are
/// bounded: connect within 2 s, each request within 30 s, at most 2 retries started within
/// 5 s of the first attempt, so a hung store fails after about one request timeout. With
/// `object_store`'s defaults (connect 5 s, request 30 s, 10 retries started within 3 min) a
/// refused connection fails in about 3 s, but a store that accepts and never answers holds
/// a PUT for 181 s.
fn client(endpoint: &str, bucket: &str, access_key: &str, secret_key: &str) -> AmazonS3 {
    client_with_timeout(
        endpoint,
        bucket,
        access_key,
        secret_key,
        Duration::from_secs(30),
    )
}

/// [`client`] with another per-request timeout.
fn client_with_timeout(
    endpoint: &str,
    bucket: &str,
    access_key: &str,
    secret_key: &str,
    request_timeout: Duration,
) -> AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_client_options(
            ClientOptions::new()
                .with_allow_http(true)
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(request_timeout),
        )
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_millis(500),
                base: 2.0,
            },
            max_retries: 2,
            retry_timeout: Duration::from_secs(5),
        })
        .with_virtual_hosted_style_request(false)
        .with_region(S3_REGION)
        .with_bucket_name(bucket)
        .with_access_key_id(access_key)
        .with_secret_access_key(secret_key)
        .build()
        .expect("an S3 client")
}

fn client_for(server: &S3Server) -> AmazonS3 {
    client(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    )
}

/// An error with its sources, one after the other.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(" <- ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// Deterministic, incompressible-looking bytes (xorshift64).
struct Bytes(u64);

impl Bytes {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            chunk.copy_from_slice(&self.0.to_le_bytes()[..chunk.len()]);
        }
    }
}

#[tokio::test]
async fn multipart_upload_read_back_list_and_delete() {
    let server = S3Server::start();
    let rss_idle = server.rss_kib();
    println!(
        "SeaweedFS ready in {:?}, RSS {:?} KiB, endpoint {}, pid {:?}\nweed {}",
        server.startup,
        rss_idle,
        server.endpoint(),
        server.pid(),
        server.args.join(" ")
    );
    let store = client_for(&server);
    let big = Path::from("cluster-a/2026-11-09/dump-1.rdb");

    // Streamed: the data is generated 1 MiB at a time and written as 5 MiB parts, at most
    // two parts in flight, so the client never holds the whole object.
    let t0 = Instant::now();
    let mut upload = WriteMultipart::new_with_chunk_size(
        store
            .put_multipart(&big)
            .await
            .expect("create multipart upload"),
        PART,
    );
    let mut source = Bytes(0x5eed_cafe_f00d_d00d);
    let mut sent = Sha256::new();
    let mut buf = vec![0u8; MIB];
    let mut remaining = OBJECT_SIZE;
    while remaining > 0 {
        let n = remaining.min(buf.len());
        source.fill(&mut buf[..n]);
        sent.update(&buf[..n]);
        upload.wait_for_capacity(2).await.expect("a part uploaded");
        upload.write(&buf[..n]);
        remaining -= n;
    }
    let put = upload.finish().await.expect("complete multipart upload");
    let sent = hex::encode(sent.finalize());
    println!(
        "uploaded {OBJECT_SIZE} bytes in {} parts of {PART} in {:?}: e_tag {:?}, sha256 {sent}",
        OBJECT_SIZE.div_ceil(PART),
        t0.elapsed(),
        put.e_tag
    );

    let meta = store.head(&big).await.expect("head");
    assert_eq!(meta.size, OBJECT_SIZE as u64);
    let mut received = Sha256::new();
    let mut len = 0usize;
    let mut body = store.get(&big).await.expect("get").into_stream();
    while let Some(chunk) = body.try_next().await.expect("read the body") {
        len += chunk.len();
        received.update(&chunk);
    }
    assert_eq!(len, OBJECT_SIZE);
    assert_eq!(
        hex::encode(received.finalize()),
        sent,
        "the object read back differs"
    );

    let small_a = Path::from("cluster-a/2026-11-09/dump-2.rdb");
    let small_b = Path::from("cluster-b/2026-11-09/dump-1.rdb");
    for p in [&small_a, &small_b] {
        store
            .put(p, b"REDIS0011 small".as_slice().into())
            .await
            .expect("put");
    }
    let mut listed: Vec<(String, u64)> = store
        .list(Some(&Path::from("cluster-a")))
        .map_ok(|m| (m.location.to_string(), m.size))
        .try_collect()
        .await
        .expect("list cluster-a");
    listed.sort();
    assert_eq!(
        listed,
        vec![
            (big.to_string(), OBJECT_SIZE as u64),
            (small_a.to_string(), 15),
        ]
    );
    let top = store
        .list_with_delimiter(None)
        .await
        .expect("list the top level");
    let mut prefixes: Vec<String> = top.common_prefixes.iter().map(Path::to_string).collect();
    prefixes.sort();
    assert_eq!(prefixes, ["cluster-a", "cluster-b"]);
    println!(
        "RSS after the upload and read: {:?} KiB (idle {rss_idle:?} KiB)",
        server.rss_kib()
    );

    for p in [&big, &small_a, &small_b] {
        store.delete(p).await.expect("delete");
    }
    match store.get(&big).await {
        Err(object_store::Error::NotFound { .. }) => {}
        other => panic!("a deleted object is still readable: {other:?}"),
    }
    let left: Vec<_> = store
        .list(None)
        .try_collect()
        .await
        .expect("list after delete");
    assert!(left.is_empty(), "objects left after delete: {left:?}");
}

#[tokio::test]
async fn wrong_credentials_are_refused_with_the_stores_own_error() {
    let server = S3Server::start();
    let payload = || b"must not be stored".as_slice().into();
    let key = Path::from("refused.rdb");

    let wrong_secret = client(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        "not-the-secret",
    );
    let e = wrong_secret
        .put(&key, payload())
        .await
        .expect_err("a wrong secret key must be refused");
    let text = chain(&e);
    println!("wrong secret key: {text}");
    assert!(text.contains("403"), "{text}");
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");

    let unknown_key = client(
        &server.endpoint(),
        &server.bucket,
        "no-such-access-key",
        &server.secret_key,
    );
    let e = unknown_key
        .get(&key)
        .await
        .expect_err("an unknown access key must be refused");
    let text = chain(&e);
    println!("unknown access key: {text}");
    assert!(text.contains("InvalidAccessKeyId"), "{text}");

    // Nothing was written.
    match client_for(&server).head(&key).await {
        Err(object_store::Error::NotFound { .. }) => {}
        other => panic!("the refused object exists: {other:?}"),
    }
}

#[tokio::test]
async fn unreachable_endpoint_fails_within_a_bounded_time() {
    // A loopback port nothing listens on: every connection is refused.
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let store = client(&endpoint, "backups", "key", "secret");
    let t0 = Instant::now();
    let e = store
        .put(&Path::from("x.rdb"), b"x".as_slice().into())
        .await
        .expect_err("nothing listens there");
    let elapsed = t0.elapsed();
    let text = chain(&e);
    println!("unreachable endpoint, failed after {elapsed:?}: {text}");
    assert!(
        elapsed < Duration::from_secs(10),
        "took {elapsed:?}: {text}"
    );
    assert!(text.contains(&endpoint), "{text}");
    assert!(text.to_lowercase().contains("connect"), "{text}");
}

#[tokio::test]
async fn silent_endpoint_fails_within_a_bounded_time() {
    // Accepts connections (the kernel completes the handshake; nothing reads) and never
    // answers, like a hung server: only the request timeout ends each attempt.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
    let store = client_with_timeout(
        &endpoint,
        "backups",
        "key",
        "secret",
        Duration::from_secs(1),
    );
    let t0 = Instant::now();
    let e = store
        .put(&Path::from("x.rdb"), b"x".as_slice().into())
        .await
        .expect_err("nothing answers");
    let elapsed = t0.elapsed();
    let text = chain(&e);
    println!("silent endpoint, failed after {elapsed:?}: {text}");
    assert!(
        elapsed < Duration::from_secs(10),
        "took {elapsed:?}: {text}"
    );
    assert!(text.contains(&endpoint), "{text}");
    assert!(text.contains("timed out"), "{text}");
    drop(listener);
}
