//! A real S3-compatible object store for tests: SeaweedFS (`weed mini`: master, volume
//! server, filer, S3 gateway and admin server in one process) on free loopback ports, its
//! data in a temporary directory, one bucket and one access key allowed everything. Killed
//! (its whole process group) on drop.
//!
//! `weed mini` rather than `weed server -filer -s3`: the same memory, but ready in about 5 s
//! instead of 10 (`weed server`'s filer waits out a membership check of a multi-node cluster
//! before S3 writes are accepted; mini, a single node, skips it).
//!
//! The binary is found by [`bins::weed`](crate::bins::weed) (`hack/install-deps.sh seaweedfs`).
//! The server is ready when a bucket can be created and an object written and deleted
//! through the S3 API: that needs the master, the volume server, the filer and the gateway.
//! The harness signs those few requests itself (AWS Signature Version 4, path-style), so it
//! depends on no S3 client; the tests use the client under test against [`S3Server::endpoint`].

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::bins;
use crate::store_process::{StoreProcess, require, start_with_retries};

/// The region the store's clients sign for (SeaweedFS accepts any; AWS clients need one).
pub const S3_REGION: &str = "us-east-1";
/// Access key id of the store's one identity (every action, every bucket).
pub const S3_ACCESS_KEY: &str = "testkit-access-key";
/// Its secret key.
pub const S3_SECRET_KEY: &str = "testkit-secret-key-0123456789";
/// The bucket [`S3Server::start`] creates.
pub const S3_BUCKET: &str = "backups";

/// How long a start may take before it is retried (on free ports, a fresh directory).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The object the readiness probe writes and deletes.
const PROBE_KEY: &str = ".testkit-ready";

/// A running SeaweedFS with its S3 gateway on `127.0.0.1:port`.
pub struct S3Server {
    process: StoreProcess,
    /// Its data, the S3 identities file (`s3.json`) and its log (`weed.log`).
    pub dir: tempfile::TempDir,
    /// The S3 API port (loopback).
    pub port: u16,
    /// The bucket created at start ([`S3_BUCKET`]).
    pub bucket: String,
    /// Access key id ([`S3_ACCESS_KEY`]).
    pub access_key: String,
    /// Secret key ([`S3_SECRET_KEY`]).
    pub secret_key: String,
    /// From spawning the process to ready (bucket created, an object written and deleted).
    pub startup: Duration,
    /// The command line it was started with (without the binary).
    pub args: Vec<String>,
    /// The gRPC Unix sockets that weed always creates at fixed paths under /tmp (one per
    /// component, named by its gRPC port): removed on drop.
    sockets: Vec<PathBuf>,
}

/// The loopback ports of one server: every component's HTTP and gRPC port.
struct Ports {
    s3: u16,
    s3_grpc: u16,
    master: u16,
    master_grpc: u16,
    volume: u16,
    volume_grpc: u16,
    filer: u16,
    filer_grpc: u16,
    admin: u16,
    admin_grpc: u16,
}

impl Ports {
    /// Ten distinct free loopback ports (all held at once while they are picked).
    fn free() -> Self {
        let listeners: Vec<TcpListener> = (0..10)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().expect("its address").port())
            .collect();
        Self {
            s3: ports[0],
            s3_grpc: ports[1],
            master: ports[2],
            master_grpc: ports[3],
            volume: ports[4],
            volume_grpc: ports[5],
            filer: ports[6],
            filer_grpc: ports[7],
            admin: ports[8],
            admin_grpc: ports[9],
        }
    }

    fn sockets(&self) -> Vec<PathBuf> {
        [
            ("master", self.master_grpc),
            ("volume", self.volume_grpc),
            ("filer", self.filer_grpc),
            ("s3", self.s3_grpc),
            ("admin", self.admin_grpc),
        ]
        .iter()
        .map(|(name, port)| PathBuf::from(format!("/tmp/seaweedfs-{name}-grpc-{port}.sock")))
        .collect()
    }
}

/// `weed` arguments for one server in `dir`: `weed mini` (master, volume server, filer, S3
/// gateway and the admin server in one process), every listener on 127.0.0.1 at an explicit
/// port (mini refuses to start rather than move an explicit port), WebDAV, the admin UI and
/// the S3 gateway's Iceberg and Lance servers off.
fn weed_args(dir: &Path, p: &Ports) -> Vec<String> {
    let d = dir.display();
    [
        // Logs to stderr only (no log files in the temp directory of the machine).
        "-logtostderr".to_owned(),
        "mini".into(),
        format!("-dir={d}"),
        // Bound to loopback; an explicit -ip.bind also turns off the extra localhost
        // listeners weed opens next to each port.
        "-ip=127.0.0.1".into(),
        "-ip.bind=127.0.0.1".into(),
        format!("-master.port={}", p.master),
        format!("-master.port.grpc={}", p.master_grpc),
        "-master.telemetry=false".into(),
        format!("-volume.port={}", p.volume),
        format!("-volume.port.grpc={}", p.volume_grpc),
        format!("-filer.port={}", p.filer),
        format!("-filer.port.grpc={}", p.filer_grpc),
        format!("-filer.localSocket={d}/filer.sock"),
        // The filer's HTTP port stays (mini waits for it), without its web UI.
        "-filer.exposeDirectoryData=false".into(),
        format!("-s3.port={}", p.s3),
        format!("-s3.port.grpc={}", p.s3_grpc),
        "-s3.port.iceberg=0".into(),
        "-s3.port.lance=0".into(),
        format!("-s3.localSocket={d}/s3.sock"),
        format!("-s3.config={d}/s3.json"),
        "-webdav=false".into(),
        // mini always runs its admin server (with a maintenance worker that scans every
        // 30 min); only the UI can be turned off.
        "-admin.ui=false".into(),
        format!("-admin.port={}", p.admin),
        format!("-admin.port.grpc={}", p.admin_grpc),
        "-admin.port.legacy=0".into(),
    ]
    .into()
}

impl S3Server {
    /// Starts a server, creates [`S3_BUCKET`] and waits until an object can be written.
    /// Retries on fresh ports when a start fails (a port taken in between); panics with the
    /// server's log when none succeeds, or naming the install step when `weed` is missing.
    pub fn start() -> Self {
        let bin = require(bins::weed(), "weed", "WEED_BIN", "seaweedfs");
        start_with_retries(&format!("SeaweedFS ({})", bin.display()), || {
            Self::try_start(&bin)
        })
    }

    fn try_start(bin: &Path) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let ports = Ports::free();
        let identities = serde_json::json!({
            "identities": [{
                "name": "testkit",
                "credentials": [{ "accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY }],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }]
        });
        std::fs::write(dir.path().join("s3.json"), identities.to_string())
            .map_err(|e| e.to_string())?;
        let args = weed_args(dir.path(), &ports);
        let t0 = Instant::now();
        let mut process = StoreProcess::spawn(
            Command::new(bin)
                .args(&args)
                .current_dir(dir.path())
                // Configuration files are looked up in the working directory and
                // $HOME/.seaweedfs; temporary files go to TMPDIR: all in its own directory.
                .env("HOME", dir.path())
                .env("TMPDIR", dir.path()),
            dir.path().join("weed.log"),
        )?;
        let sockets = ports.sockets();
        // Ready when the bucket is created and a probe object written and deleted.
        let ready = process.wait_ready(t0, START_TIMEOUT, || probe(ports.s3));
        if ready.is_err() {
            remove_sockets(&sockets);
        }
        ready?;
        Ok(Self {
            process,
            dir,
            port: ports.s3,
            bucket: S3_BUCKET.to_owned(),
            access_key: S3_ACCESS_KEY.to_owned(),
            secret_key: S3_SECRET_KEY.to_owned(),
            startup: t0.elapsed(),
            args,
            sockets,
        })
    }

    /// Creates a bucket (an existing one of the same owner is fine).
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        create_bucket(self.port, name)
    }

    /// `http://127.0.0.1:<port>`: the S3 endpoint (path-style requests).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id of `weed`.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The resident memory of the `weed` process (all components are in it), in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// Its log (stdout and stderr).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Sends one request signed with the server's key (AWS Signature Version 4, path-style,
    /// no query string) and returns the HTTP status and the body. `path` is `/bucket` or
    /// `/bucket/key` of unreserved characters. Errors are transport errors only.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> Result<(u16, String), String> {
        let (status, body) = self.request_bytes(method, path, body)?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// [`Self::request`] with the response body as bytes (an object's content), a chunked
    /// body decoded.
    pub fn request_bytes(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), String> {
        request_bytes(self.port, method, path, body)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.process.kill();
        remove_sockets(&self.sockets);
    }
}

fn remove_sockets(sockets: &[PathBuf]) {
    for socket in sockets {
        let _ = std::fs::remove_file(socket);
    }
}

/// The readiness probe: the bucket is created, an object written and deleted.
fn probe(port: u16) -> Result<(), String> {
    create_bucket(port, S3_BUCKET)?;
    let key = format!("/{S3_BUCKET}/{PROBE_KEY}");
    match request_bytes(port, "PUT", &key, b"ready")? {
        (200, _) => {}
        (status, body) => {
            return Err(format!(
                "PUT {key}: {status} {}",
                String::from_utf8_lossy(&body)
            ));
        }
    }
    match request_bytes(port, "DELETE", &key, b"")? {
        (200 | 204, _) => Ok(()),
        (status, body) => Err(format!(
            "DELETE {key}: {status} {}",
            String::from_utf8_lossy(&body)
        )),
    }
}

/// Creates a bucket (an existing one of the same owner is fine).
fn create_bucket(port: u16, name: &str) -> Result<(), String> {
    match request_bytes(port, "PUT", &format!("/{name}"), b"")? {
        (200, _) => Ok(()),
        (409, body) if String::from_utf8_lossy(&body).contains("BucketAlreadyOwnedByYou") => Ok(()),
        (status, body) => Err(format!(
            "create bucket {name}: {status} {}",
            String::from_utf8_lossy(&body)
        )),
    }
}

/// One request to the server on `port`, signed with its key (AWS Signature Version 4,
/// path-style, no query string): the HTTP status and the body, a chunked body decoded. `path`
/// is `/bucket` or `/bucket/key` of unreserved characters. Errors are transport errors only.
fn request_bytes(
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    assert!(
        path.starts_with('/')
            && path
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/-_.~".contains(&b)),
        "path {path:?} needs no URI encoding"
    );
    let host = format!("127.0.0.1:{port}");
    let now = jiff::Timestamp::now();
    let headers = sigv4_headers(
        &SigV4 {
            access_key: S3_ACCESS_KEY,
            secret_key: S3_SECRET_KEY,
            region: S3_REGION,
            amz_date: &now.strftime("%Y%m%dT%H%M%SZ").to_string(),
        },
        method,
        &host,
        path,
        body,
    );
    crate::http1::send(&host, method, path, &headers, body)
}

/// What a SigV4 signature covers besides the request.
struct SigV4<'a> {
    access_key: &'a str,
    secret_key: &'a str,
    region: &'a str,
    /// `YYYYMMDDTHHMMSSZ` (UTC).
    amz_date: &'a str,
}

/// The headers of a request signed for S3 with AWS Signature Version 4: `host`,
/// `x-amz-content-sha256`, `x-amz-date` and `authorization`, in that order.
fn sigv4_headers(
    sig: &SigV4<'_>,
    method: &str,
    host: &str,
    path: &str,
    body: &[u8],
) -> Vec<(&'static str, String)> {
    let payload_hash = hex::encode(Sha256::digest(body));
    let date = &sig.amz_date[..8];
    let scope = format!("{date}/{}/s3/aws4_request", sig.region);
    let signed_headers = "host;x-amz-content-sha256;x-amz-date";
    let canonical_request = format!(
        "{method}\n{path}\n\nhost:{host}\nx-amz-content-sha256:{payload_hash}\nx-amz-date:{}\n\n{signed_headers}\n{payload_hash}",
        sig.amz_date
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        sig.amz_date,
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let mut key = hmac_sha256(
        format!("AWS4{}", sig.secret_key).as_bytes(),
        date.as_bytes(),
    );
    for part in [sig.region, "s3", "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac_sha256(&key, string_to_sign.as_bytes()));
    vec![
        ("host", host.to_owned()),
        ("x-amz-content-sha256", payload_hash),
        ("x-amz-date", sig.amz_date.to_owned()),
        (
            "authorization",
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
                sig.access_key
            ),
        ),
    ]
}

/// HMAC-SHA256 (the `hmac` crate).
pub(crate) fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    use hmac::Mac;
    let mut mac =
        hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test cases 2 (a short key) and 6 (a key longer than the block).
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
