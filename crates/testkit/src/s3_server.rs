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

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

use crate::bins;

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
    child: Option<Child>,
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
        let bin = bins::weed().unwrap_or_else(|| {
            panic!(
                "no `weed` binary (WEED_BIN, {}, PATH): install it with `bash hack/install-deps.sh seaweedfs`",
                bins::bin_dir().display()
            )
        });
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(&bin) {
                Ok(s) => return s,
                Err(e) => last = e,
            }
        }
        panic!("SeaweedFS ({}) did not start:\n{last}", bin.display());
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
        let log = File::create(dir.path().join("weed.log")).map_err(|e| e.to_string())?;
        let args = weed_args(dir.path(), &ports);
        let t0 = Instant::now();
        let child = Command::new(bin)
            .args(&args)
            .current_dir(dir.path())
            // Configuration files are looked up in the working directory and $HOME/.seaweedfs;
            // temporary files go to TMPDIR: all in the server's own directory.
            .env("HOME", dir.path())
            .env("TMPDIR", dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        let mut server = Self {
            child: Some(child),
            dir,
            port: ports.s3,
            bucket: S3_BUCKET.to_owned(),
            access_key: S3_ACCESS_KEY.to_owned(),
            secret_key: S3_SECRET_KEY.to_owned(),
            startup: Duration::ZERO,
            args,
            sockets: ports.sockets(),
        };
        server.wait_ready(t0)?;
        server.startup = t0.elapsed();
        Ok(server)
    }

    /// Waits until the bucket is created and a probe object written and deleted; on timeout
    /// or exit, the error is the server's log.
    fn wait_ready(&mut self, t0: Instant) -> Result<(), String> {
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("exited with {status}:\n{}", self.log_tail()));
            }
            let last = match self.probe() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if t0.elapsed() > START_TIMEOUT {
                self.kill();
                return Err(format!(
                    "not ready after {START_TIMEOUT:?} (last probe: {last}):\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn probe(&self) -> Result<(), String> {
        self.create_bucket(&self.bucket)?;
        let key = format!("/{}/{PROBE_KEY}", self.bucket);
        match self.request("PUT", &key, b"ready")? {
            (200, _) => {}
            (status, body) => return Err(format!("PUT {key}: {status} {body}")),
        }
        match self.request("DELETE", &key, b"")? {
            (200 | 204, _) => Ok(()),
            (status, body) => Err(format!("DELETE {key}: {status} {body}")),
        }
    }

    /// Creates a bucket (an existing one of the same owner is fine).
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        match self.request("PUT", &format!("/{name}"), b"")? {
            (200, _) => Ok(()),
            (409, body) if body.contains("BucketAlreadyOwnedByYou") => Ok(()),
            (status, body) => Err(format!("create bucket {name}: {status} {body}")),
        }
    }

    /// `http://127.0.0.1:<port>`: the S3 endpoint (path-style requests).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The process id of `weed`.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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
        std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
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
        assert!(
            path.starts_with('/')
                && path
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/-_.~".contains(&b)),
            "path {path:?} needs no URI encoding"
        );
        let host = format!("127.0.0.1:{}", self.port);
        let now = jiff::Timestamp::now();
        let headers = sigv4_headers(
            &SigV4 {
                access_key: &self.access_key,
                secret_key: &self.secret_key,
                region: S3_REGION,
                amz_date: &now.strftime("%Y%m%dT%H%M%SZ").to_string(),
            },
            method,
            &host,
            path,
            body,
        );
        let addr: SocketAddr = host.parse().map_err(|e| format!("{host}: {e}"))?;
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("connect {host}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(10))))
            .map_err(|e| e.to_string())?;
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        for (name, value) in &headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!(
            "content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        ));
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body))
            .map_err(|e| format!("{method} {path}: {e}"))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .map_err(|e| format!("{method} {path}: reading the response: {e}"))?;
        let split = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| format!("{method} {path}: no end of headers"))?;
        let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("{method} {path}: not an HTTP response: {head:?}"))?;
        let body = &response[split + 4..];
        if head.contains("transfer-encoding: chunked") {
            return dechunk(body)
                .map(|b| (status, b))
                .ok_or_else(|| format!("{method} {path}: bad chunked body"));
        }
        Ok((status, body.to_vec()))
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Its own process group (spawned with process_group(0)): the group id is its pid.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// Decodes an HTTP/1.1 chunked body.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..eol]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
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
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
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
