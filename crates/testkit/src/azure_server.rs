//! An Azure Blob Storage emulator for tests: Azurite's blob service (npm package `azurite`,
//! `hack/install-deps.sh azurite`, run by Node.js) on a free loopback port, its data in a
//! temporary directory, telemetry off, one container. Killed (its process group) on drop.
//!
//! Azurite serves the emulator's well-known account ([`AZURE_ACCOUNT`], [`AZURE_KEY`]) at
//! `http://127.0.0.1:<port>/<account>` ([`AzureServer::endpoint`]). The harness signs its one
//! set-up request (Shared Key) itself, so it depends on no Azure client.

use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::s3_server::hmac_sha256;
use crate::store_process::{StoreProcess, require, start_with_retries};
use crate::{bins, free_port};

/// The emulator's account (Azurite's built-in development account).
pub const AZURE_ACCOUNT: &str = "devstoreaccount1";
/// Its account key (Azurite's published development key).
pub const AZURE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The container [`AzureServer::start`] creates.
pub const AZURE_CONTAINER: &str = "backups";
/// The REST API version the set-up request asks for.
const API_VERSION: &str = "2021-08-06";

/// How long a start may take before it is retried on another port.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running Azurite blob service on `127.0.0.1:port`.
pub struct AzureServer {
    process: StoreProcess,
    /// Its data and its log (`azurite.log`).
    pub dir: tempfile::TempDir,
    /// The blob service's port (loopback).
    pub port: u16,
    /// From spawning the process to ready (the container created).
    pub startup: Duration,
}

impl AzureServer {
    /// Starts the blob service and creates [`AZURE_CONTAINER`]; panics with its log when no
    /// start succeeds, or naming the install step when `azurite-blob` is missing.
    pub fn start() -> Self {
        let bin = require(
            bins::azurite_blob(),
            "azurite-blob",
            "AZURITE_BLOB_BIN",
            "azurite",
        );
        start_with_retries(&format!("Azurite ({})", bin.display()), || {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let port = free_port();
            let t0 = Instant::now();
            let mut process = StoreProcess::spawn(
                Command::new(&bin)
                    .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                    .arg("--location")
                    .arg(dir.path().join("data"))
                    // No telemetry (it would leave loopback); any API version the client
                    // asks for.
                    .args(["--disableTelemetry", "--skipApiVersionCheck", "--loose"])
                    .current_dir(dir.path())
                    .env("HOME", dir.path()),
                dir.path().join("azurite.log"),
            )?;
            process.wait_ready(t0, START_TIMEOUT, || {
                create_container(port, AZURE_CONTAINER)
            })?;
            Ok(Self {
                process,
                dir,
                port,
                startup: t0.elapsed(),
            })
        })
    }

    /// Creates a container (an existing one is fine), signed with the account key.
    pub fn create_container(&self, name: &str) -> Result<(), String> {
        create_container(self.port, name)
    }

    /// `http://127.0.0.1:<port>/devstoreaccount1`: the account's blob endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{AZURE_ACCOUNT}", self.port)
    }

    /// Its log.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// Creates a container on the server on `port` (an existing one is fine), signed with the
/// account key (Shared Key).
fn create_container(port: u16, name: &str) -> Result<(), String> {
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
        "container name {name:?}"
    );
    let host = format!("127.0.0.1:{port}");
    let date = jiff::Timestamp::now()
        .strftime("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    // Shared Key: the verb, eleven empty standard headers (no body), the x-ms- headers and
    // the resource, the account twice (path-style: the account is the path's first part).
    let to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{API_VERSION}\n\
         /{AZURE_ACCOUNT}/{AZURE_ACCOUNT}/{name}\nrestype:container"
    );
    let key = STANDARD.decode(AZURE_KEY).expect("the key is base64");
    let signature = STANDARD.encode(hmac_sha256(&key, to_sign.as_bytes()));
    let headers = [
        ("host", host.clone()),
        ("x-ms-date", date),
        ("x-ms-version", API_VERSION.to_owned()),
        (
            "authorization",
            format!("SharedKey {AZURE_ACCOUNT}:{signature}"),
        ),
    ];
    let path = format!("/{AZURE_ACCOUNT}/{name}?restype=container");
    match crate::http1::send(&host, "PUT", &path, &headers, b"")? {
        (201, _) => Ok(()),
        (409, body) if String::from_utf8_lossy(&body).contains("ContainerAlreadyExists") => Ok(()),
        (status, body) => Err(format!(
            "create container {name}: {status} {}",
            String::from_utf8_lossy(&body)
        )),
    }
}
