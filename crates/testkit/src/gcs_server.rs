//! A Google Cloud Storage emulator for tests: `fake-gcs-server` (Go module
//! `github.com/fsouza/fake-gcs-server`, `hack/install-deps.sh fakegcs`) serving plain HTTP on a
//! free loopback port, objects in memory, one bucket. Killed (its process group) on drop.
//!
//! Clients reach it with a service account key that carries the emulator's address and turns
//! OAuth off ([`GcsServer::service_account_key`]), the form `object_store`'s GCS client
//! documents for it; or with the store's `endpoint` set to [`GcsServer::endpoint`].

use std::process::Command;
use std::time::{Duration, Instant};

use crate::store_process::{StoreProcess, require, start_with_retries};
use crate::{bins, free_port};

/// The bucket [`GcsServer::start`] creates.
pub const GCS_BUCKET: &str = "backups";

/// How long a start may take before it is retried on another port.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running `fake-gcs-server` on `127.0.0.1:port`.
pub struct GcsServer {
    process: StoreProcess,
    /// Its log (`fake-gcs.log`).
    pub dir: tempfile::TempDir,
    /// The HTTP port (loopback).
    pub port: u16,
    /// From spawning the process to ready (the bucket created).
    pub startup: Duration,
}

impl GcsServer {
    /// Starts a server and creates [`GCS_BUCKET`]; panics with the server's log when no start
    /// succeeds, or naming the install step when the binary is missing.
    pub fn start() -> Self {
        let bin = require(
            bins::fake_gcs_server(),
            "fake-gcs-server",
            "FAKE_GCS_SERVER_BIN",
            "fakegcs",
        );
        start_with_retries(&format!("fake-gcs-server ({})", bin.display()), || {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let port = free_port();
            let t0 = Instant::now();
            let mut process = StoreProcess::spawn(
                Command::new(&bin)
                    .args([
                        "-scheme",
                        "http",
                        "-host",
                        "127.0.0.1",
                        "-backend",
                        "memory",
                    ])
                    .args(["-log-level", "warn", "-port", &port.to_string()])
                    // Upload URLs it returns point back at it, and it serves the XML API
                    // (object reads) to requests for this host, not only Google's.
                    .args(["-external-url", &format!("http://127.0.0.1:{port}")])
                    .args(["-public-host", &format!("127.0.0.1:{port}")])
                    .current_dir(dir.path()),
                dir.path().join("fake-gcs.log"),
            )?;
            process.wait_ready(t0, START_TIMEOUT, || create_bucket(port, GCS_BUCKET))?;
            Ok(Self {
                process,
                dir,
                port,
                startup: t0.elapsed(),
            })
        })
    }

    /// Creates a bucket through the JSON API (an existing one is fine).
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        create_bucket(self.port, name)
    }

    /// Stores an object through the JSON API's media upload. (The emulator lacks the XML API
    /// object upload, `PUT /<bucket>/<object>`, that `object_store`'s GCS client writes with:
    /// it answers `400 invalid uploadType`; reads, lists and deletes it serves.)
    pub fn put_object(&self, name: &str, body: &[u8]) -> Result<(), String> {
        let host = format!("127.0.0.1:{}", self.port);
        let encoded: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let path = format!("/upload/storage/v1/b/{GCS_BUCKET}/o?uploadType=media&name={encoded}");
        let headers = [
            ("host", host.clone()),
            ("content-type", "application/octet-stream".to_owned()),
        ];
        match crate::http1::send(&host, "POST", &path, &headers, body)? {
            (200, _) => Ok(()),
            (status, body) => Err(format!(
                "upload {name}: {status} {}",
                String::from_utf8_lossy(&body)
            )),
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A service account key file for the emulator: its address as `gcs_base_url` and OAuth
    /// off (the emulator checks no token).
    pub fn service_account_key(&self) -> String {
        serde_json::json!({
            "gcs_base_url": self.endpoint(),
            "disable_oauth": true,
            "client_email": "testkit@example.invalid",
            "private_key": "",
            "private_key_id": "",
        })
        .to_string()
    }

    /// Its log.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// Creates a bucket through the JSON API of the server on `port` (an existing one is fine).
fn create_bucket(port: u16, name: &str) -> Result<(), String> {
    let host = format!("127.0.0.1:{port}");
    let body = serde_json::json!({ "name": name }).to_string();
    let headers = [
        ("host", host.clone()),
        ("content-type", "application/json".to_owned()),
    ];
    match crate::http1::send(
        &host,
        "POST",
        "/storage/v1/b?project=testkit",
        &headers,
        body.as_bytes(),
    )? {
        (200, _) | (409, _) => Ok(()),
        (status, body) => Err(format!(
            "create bucket {name}: {status} {}",
            String::from_utf8_lossy(&body)
        )),
    }
}
