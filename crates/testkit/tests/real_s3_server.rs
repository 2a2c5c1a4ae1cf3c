//! [`S3Server`] runs a real S3-compatible store (SeaweedFS): an object written with a signed
//! `PUT` is read back whole and deleted.

use std::time::Instant;

use valkey_testkit::S3Server;

#[test]
fn an_object_is_written_read_back_and_deleted() {
    let t0 = Instant::now();
    let s3 = S3Server::start();
    println!(
        "S3 store ready in {:.1}s at {}, {} KiB resident",
        t0.elapsed().as_secs_f64(),
        s3.endpoint(),
        s3.rss_kib().unwrap_or_default()
    );
    let key = format!("/{}/backups/one.rdb", s3.bucket);
    let body = "x".repeat(300_000);
    let (status, reply) = s3.request("PUT", &key, body.as_bytes()).unwrap();
    assert_eq!(status, 200, "PUT: {reply}");
    let (status, got) = s3.request("GET", &key, b"").unwrap();
    assert_eq!(status, 200);
    assert_eq!(got.len(), body.len());
    assert!(got == body, "read back differs");
    let (status, reply) = s3.request("DELETE", &key, b"").unwrap();
    assert!(status == 200 || status == 204, "DELETE: {status} {reply}");
    let (status, _) = s3.request("GET", &key, b"").unwrap();
    assert_eq!(status, 404, "a deleted object is gone");
}
