//! Real-process tests of the localkube container runtime. They need root (network and mount
//! namespaces, bridges); CI runs as root. Each test uses its own bridge (`lkt<pid><n>`), its own
//! /24 slice of 10.250.0.0/16 and its own state dir, and removes everything it created.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use localkube::runtime::{
    ContainerSpec, ImageTable, Mount, Network, NetworkConfig, RunningContainer, RuntimeError,
    Sandbox, Signal, cleanup_leftovers, default_bin_cache, spawn,
};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

macro_rules! require_root {
    () => {
        if !is_root() {
            eprintln!("skipped: needs root for network/mount namespaces and bridges");
            return;
        }
    };
}

/// A test environment: network + state dir; cleans everything on drop (even on panic).
struct TestEnv {
    bridge: String,
    state: tempfile::TempDir,
    net: Option<Network>,
    images: ImageTable,
}

impl TestEnv {
    fn new() -> Self {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let bridge = format!("lkt{}x{n}", pid % 1_000_000);
        let third = (pid.wrapping_mul(7).wrapping_add(n * 13)) % 250 + 1;
        let cidr = format!("10.250.{third}.0/24").parse().unwrap();
        let state = tempfile::Builder::new().prefix("lkrt").tempdir().unwrap();
        // Traversable by anyone, as localkube's own state dir: the valkey image's entrypoint
        // runs the server as uid 999, which must reach the image bin dirs under it.
        std::fs::set_permissions(
            state.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .unwrap();
        let net = Network::create(NetworkConfig {
            bridge: bridge.clone(),
            cidr,
        })
        .expect("create network");
        let images =
            ImageTable::default_table(&default_bin_cache(), &state.path().join("images")).unwrap();
        Self {
            bridge,
            state,
            net: Some(net),
            images,
        }
    }

    fn net(&self) -> &Network {
        self.net.as_ref().unwrap()
    }

    fn spec(&self, name: &str, image: &str, args: &[&str], sb: Option<&Sandbox>) -> ContainerSpec {
        let img = self.images.resolve(image).unwrap_or_else(|e| panic!("{e}"));
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        ContainerSpec {
            id: name.to_string(),
            argv: img.argv(&[], &args),
            env: img.env.clone(),
            working_dir: img.working_dir.clone(),
            mounts: vec![],
            netns_path: sb.map(|s| s.netns_path.clone()),
            hostname: Some(name.to_string()),
            state_dir: self.state.path().join("containers").join(name),
            log_path: self.state.path().join("logs").join(format!("{name}.log")),
            user: None,
            read_only_root: false,
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.state.path().join("logs").join(format!("{name}.log")))
            .unwrap_or_default()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let _ = cleanup_leftovers(self.state.path(), &self.bridge);
        if let Some(net) = self.net.take() {
            let _ = net.teardown();
        }
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Sends a RESP PING; true on `+PONG`.
fn ping(ip: Ipv4Addr, port: u16, timeout: Duration) -> bool {
    let addr = SocketAddr::from((ip, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// Creates `dir` and mounts a fresh tmpfs on it.
fn mount_tmpfs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success());
}

fn netns_inode(pid: i32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .unwrap()
        .display()
        .to_string()
}

async fn stop(c: &RunningContainer) {
    let _ = c.signal(Signal::SIGKILL);
    c.wait().await;
}

#[tokio::test]
async fn root_netns_valkey_reachable_from_host_and_other_pod_and_link_fault() {
    require_root!();
    let env = TestEnv::new();
    let net = env.net();
    let sb1 = net.create_sandbox("pod-a").unwrap();
    let sb2 = net.create_sandbox("pod-b").unwrap();
    assert_ne!(sb1.ip, sb2.ip);
    assert!(net.config().cidr.contains(&sb1.ip));

    let started = Instant::now();
    let valkey = spawn(&env.spec(
        "valkey",
        "valkey/valkey:9.0.0",
        &[
            "--port",
            "6379",
            "--bind",
            "0.0.0.0",
            "--protected-mode",
            "no",
        ],
        Some(&sb1),
    ))
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || ping(
            sb1.ip,
            6379,
            Duration::from_millis(300)
        )),
        "valkey never answered PING at {}; log:\n{}",
        sb1.ip,
        env.log("valkey")
    );
    eprintln!("valkey spawn-to-PONG from host: {:?}", started.elapsed());
    // The main process is valkey-server itself (every wrapper exec'd), in the pod's netns.
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", valkey.pid())).unwrap();
    assert_eq!(comm.trim(), "valkey-server");
    assert_ne!(
        netns_inode(valkey.pid()),
        netns_inode(std::process::id() as i32)
    );
    assert!(env.log("valkey").contains("Ready to accept connections"));

    // Another pod reaches it; exec runs in that pod's namespaces.
    let client = spawn(&env.spec("client", "busybox", &["sleep", "60"], Some(&sb2))).unwrap();
    let timeout = Duration::from_secs(5);
    let r = client
        .exec_in(
            &s(&["valkey-cli", "-h", &sb1.ip.to_string(), "ping"]),
            &[],
            timeout,
        )
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.output.trim()), (0, "PONG"), "{r:?}");
    let r = client
        .exec_in(
            &s(&["ip", "-4", "-o", "addr", "show", "dev", "eth0"]),
            &[],
            timeout,
        )
        .await
        .unwrap();
    assert!(r.output.contains(&sb2.ip.to_string()), "{r:?}");
    // Loopback inside the valkey pod is the pod's own.
    let r = valkey
        .exec_in(&s(&["valkey-cli", "ping"]), &[], timeout)
        .await
        .unwrap();
    assert_eq!(r.output.trim(), "PONG");

    // Pods reach the host at the gateway address (where the API server listens).
    let listener = TcpListener::bind((net.gateway(), 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, peer) = listener.accept().unwrap();
        let mut buf = [0u8; 64];
        let _ = conn.read(&mut buf);
        conn.write_all(b"+PONG\r\n").unwrap();
        peer
    });
    let r = client
        .exec_in(
            &s(&[
                "valkey-cli",
                "-h",
                &net.gateway().to_string(),
                "-p",
                &port.to_string(),
                "ping",
            ]),
            &[],
            timeout,
        )
        .await
        .unwrap();
    assert_eq!(r.output.trim(), "PONG", "{r:?}");
    let peer = server.join().unwrap();
    assert_eq!(peer.ip(), std::net::IpAddr::V4(sb2.ip));

    // Cut the pod's network: unreachable from host and from the other pod; restore: back.
    net.set_link(&sb1, false).unwrap();
    assert!(!ping(sb1.ip, 6379, Duration::from_millis(500)));
    let r = client
        .exec_in(
            &s(&["valkey-cli", "-h", &sb1.ip.to_string(), "ping"]),
            &[],
            Duration::from_secs(1),
        )
        .await;
    assert!(
        matches!(&r, Err(RuntimeError::ExecTimeout(_)))
            || r.as_ref().is_ok_and(|r| !r.output.contains("PONG")),
        "{r:?}"
    );
    net.set_link(&sb1, true).unwrap();
    let restored = Instant::now();
    assert!(wait_until(Duration::from_secs(5), || ping(
        sb1.ip,
        6379,
        Duration::from_millis(300)
    )));
    eprintln!("reachable again {:?} after link up", restored.elapsed());

    // SIGTERM reaches valkey-server itself: it shuts down cleanly with exit code 0.
    valkey.signal(Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), valkey.wait())
        .await
        .unwrap();
    assert_eq!(status.code, Some(0), "{status}");
    assert!(env.log("valkey").contains("Received SIGTERM"));
    assert!(matches!(
        valkey.signal(Signal::SIGTERM),
        Err(RuntimeError::Exited(_))
    ));
    stop(&client).await;

    net.destroy_sandbox(&sb1).unwrap();
    net.destroy_sandbox(&sb2).unwrap();
    assert!(!Path::new("/run/netns").join(&sb1.netns).exists());
    assert!(!Path::new("/sys/class/net").join(&sb1.host_veth).exists());
}

#[tokio::test]
async fn root_netns_mounts_and_writes_stay_inside_the_container() {
    require_root!();
    let env = TestEnv::new();
    let sb = env.net().create_sandbox("pod-m").unwrap();
    let vol = env.state.path().join("volumes");
    std::fs::create_dir_all(vol.join("data")).unwrap();
    std::fs::write(vol.join("conf"), "secret-value\n").unwrap();
    let unique = format!(
        "lkrt-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let conf_target = PathBuf::from(format!("/etc/{unique}/conf"));
    let written = PathBuf::from(format!("/etc/{unique}-written"));
    let tmp_written = PathBuf::from(format!("/tmp/{unique}-tmp"));

    let script = format!(
        r#"set -u
echo "pwd=$(pwd) host=$(hostname) env=$(env | sort | tr '\n' ' ')"
cat {conf}
if echo x > {conf} 2>/dev/null; then echo RW-CONF; else echo RO-CONF; fi
echo persisted > /data/out
echo private > {written}
echo private > {tmp}
exec sleep 60
"#,
        conf = conf_target.display(),
        written = written.display(),
        tmp = tmp_written.display(),
    );
    let mut spec = env.spec("mounts", "busybox", &[], Some(&sb));
    spec.argv = s(&["sh", "-c", &script]);
    spec.env
        .push(("GREETING".into(), "hello world 'quoted' $HOME".into()));
    spec.working_dir = Some(PathBuf::from("/work/dir"));
    spec.mounts = vec![
        Mount {
            source: vol.join("conf"),
            target: conf_target.clone(),
            read_only: true,
        },
        Mount {
            source: vol.join("data"),
            target: PathBuf::from("/data"),
            read_only: false,
        },
    ];
    let c = spawn(&spec).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || vol.join("data/out").exists()),
        "log:\n{}",
        env.log("mounts")
    );
    // Give the script a moment to write its private files too.
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/comm", c.pid()))
            .is_ok_and(|comm| comm.trim() == "sleep")
    }));
    let log = env.log("mounts");
    assert!(log.contains("pwd=/work/dir host=mounts"), "{log}");
    assert!(log.contains("GREETING=hello world 'quoted' $HOME"), "{log}");
    assert!(log.contains("secret-value"), "{log}");
    assert!(log.contains("RO-CONF"), "{log}");
    assert_eq!(
        std::fs::read_to_string(vol.join("data/out")).unwrap(),
        "persisted\n"
    );
    assert_eq!(
        std::fs::read_to_string(vol.join("conf")).unwrap(),
        "secret-value\n"
    );
    // Nothing on the host: no mount target, no written files, no working dir.
    assert!(!Path::new(&format!("/etc/{unique}")).exists());
    assert!(!written.exists());
    assert!(!tmp_written.exists());
    // No mount of the container is visible in the host's mount namespace.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let state = env.state.path().canonicalize().unwrap();
    assert!(!mounts.contains(&*state.to_string_lossy()), "{mounts}");

    // exec_in sees the container's mounts, root, working dir and network namespace.
    let t = Duration::from_secs(5);
    let r = c
        .exec_in(&s(&["cat", &conf_target.to_string_lossy()]), &[], t)
        .await
        .unwrap();
    assert_eq!(r.output, "secret-value\n");
    let r = c
        .exec_in(&s(&["cat", &written.to_string_lossy()]), &[], t)
        .await
        .unwrap();
    assert_eq!(r.output, "private\n");
    let r = c.exec_in(&s(&["pwd"]), &[], t).await.unwrap();
    assert_eq!(r.output.trim(), "/work/dir");
    let r = c
        .exec_in(&s(&["readlink", "/proc/self/ns/net"]), &[], t)
        .await
        .unwrap();
    assert_eq!(r.output.trim(), netns_inode(c.pid()));
    let r = c
        .exec_in(
            &s(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
            &[("A".into(), "1".into())],
            t,
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 3);
    assert!(
        r.output.contains("out") && r.output.contains("err"),
        "{r:?}"
    );
    let r = c
        .exec_in(&s(&["sh", "-c", "echo $A"]), &[("A".into(), "1".into())], t)
        .await
        .unwrap();
    assert_eq!(r.output.trim(), "1");
    let began = Instant::now();
    let r = c
        .exec_in(&s(&["sleep", "5"]), &[], Duration::from_millis(300))
        .await;
    assert!(matches!(r, Err(RuntimeError::ExecTimeout(_))), "{r:?}");
    assert!(began.elapsed() < Duration::from_secs(2));
    stop(&c).await;
}

#[tokio::test]
async fn root_netns_read_only_root_filesystem_keeps_volumes_writable() {
    require_root!();
    let env = TestEnv::new();
    let vol = env.state.path().join("ro-volumes/data");
    std::fs::create_dir_all(&vol).unwrap();
    let unique = format!("lkro-{}", std::process::id());
    let script = format!(
        "if {{ echo x > /etc/{unique}; }} 2>/dev/null; then echo ROOT-RW; else echo ROOT-RO; fi\n\
         if echo y > /data/out; then echo DATA-RW; else echo DATA-RO; fi\n"
    );
    let mut spec = env.spec("ro", "busybox", &[], None);
    spec.argv = s(&["sh", "-c", &script]);
    spec.working_dir = Some(PathBuf::from("/work/ro"));
    spec.read_only_root = true;
    spec.mounts = vec![Mount {
        source: vol.clone(),
        target: PathBuf::from("/data"),
        read_only: false,
    }];
    let st = spawn(&spec).unwrap().wait().await;
    assert_eq!(st.code, Some(0), "{}", env.log("ro"));
    assert_eq!(env.log("ro"), "ROOT-RO\nDATA-RW\n");
    assert_eq!(std::fs::read_to_string(vol.join("out")).unwrap(), "y\n");
    assert!(!Path::new(&format!("/etc/{unique}")).exists());
}

#[tokio::test]
async fn root_netns_exit_codes_and_signals() {
    require_root!();
    let env = TestEnv::new();
    let sb = env.net().create_sandbox("pod-s").unwrap();
    let run = |name: &str, argv: &[&str]| {
        let mut spec = env.spec(name, "busybox", &[], Some(&sb));
        spec.argv = s(argv);
        spawn(&spec).unwrap()
    };

    let c = run("exit7", &["sh", "-c", "exit 7"]);
    let st = c.wait().await;
    assert_eq!((st.code, st.signal, st.exit_code()), (Some(7), None, 7));

    // A restart reuses the state dir and starts from a fresh writable layer.
    let mut spec = env.spec("restart", "busybox", &[], Some(&sb));
    spec.argv = s(&["sh", "-c", "test ! -e /marker && touch /marker"]);
    assert_eq!(spawn(&spec).unwrap().wait().await.code, Some(0));
    assert_eq!(spawn(&spec).unwrap().wait().await.code, Some(0));
    assert!(!Path::new("/marker").exists());

    let c = run("missing", &["no-such-binary-xyz"]);
    assert_eq!(c.wait().await.code, Some(127));

    // SIGTERM goes to the program itself: its trap runs and decides the exit code.
    let c = run(
        "trap",
        &[
            "sh",
            "-c",
            "trap 'echo got-term; exit 3' TERM; echo ready; while :; do sleep 0.05; done",
        ],
    );
    assert!(wait_until(Duration::from_secs(5), || env
        .log("trap")
        .contains("ready")));
    c.signal(Signal::SIGTERM).unwrap();
    let st = tokio::time::timeout(Duration::from_secs(5), c.wait())
        .await
        .unwrap();
    assert_eq!(st.code, Some(3), "{st}");
    assert!(env.log("trap").contains("got-term"));

    let c = run("sleeper", &["sleep", "60"]);
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/comm", c.pid()))
            .is_ok_and(|s| s.trim() == "sleep")
    }));
    let proc_state = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat[stat.rfind(')').unwrap() + 2..].chars().next().unwrap()
    };
    c.signal(Signal::SIGSTOP).unwrap();
    assert!(wait_until(Duration::from_secs(2), || proc_state(c.pid()) == 'T'));
    c.signal(Signal::SIGCONT).unwrap();
    assert!(wait_until(Duration::from_secs(2), || proc_state(c.pid()) == 'S'));
    assert!(c.try_status().is_none());
    c.signal(Signal::SIGTERM).unwrap();
    let st = c.wait().await;
    assert_eq!(
        (st.code, st.signal(), st.exit_code()),
        (None, Some(Signal::SIGTERM), 143)
    );

    let c = run("killed", &["sleep", "60"]);
    c.signal(Signal::SIGKILL).unwrap();
    let st = c.wait().await;
    assert_eq!((st.signal(), st.exit_code()), (Some(Signal::SIGKILL), 137));

    // A failing setup (mount onto an existing directory with a file) reports the setup code.
    let mut spec = env.spec("badmount", "busybox", &[], Some(&sb));
    spec.argv = s(&["true"]);
    let f = env.state.path().join("a-file");
    std::fs::write(&f, "x").unwrap();
    spec.mounts = vec![Mount {
        source: f,
        target: PathBuf::from("/usr"),
        read_only: true,
    }];
    let st = spawn(&spec).unwrap().wait().await;
    assert_eq!(st.code, Some(localkube::runtime::SETUP_FAILED_EXIT_CODE));
    assert!(env.log("badmount").contains("container setup failed"));
}

#[tokio::test]
async fn root_netns_cleanup_leftovers_removes_everything() {
    require_root!();
    let mut env = TestEnv::new();
    let bridge = env.bridge.clone();
    let net = env.net.take().unwrap();
    let sb1 = net.create_sandbox("pod-1").unwrap();
    let sb2 = net.create_sandbox("pod-2").unwrap();
    let mut spec = env.spec("daemon", "busybox", &[], Some(&sb1));
    // A background child that outlives nothing: it must be found through the netns.
    spec.argv = s(&["sh", "-c", "sleep 100 & echo started; exec sleep 100"]);
    let vol = env.state.path().join("vol");
    std::fs::create_dir_all(&vol).unwrap();
    spec.mounts = vec![Mount {
        source: vol,
        target: "/vol".into(),
        read_only: false,
    }];
    let c1 = spawn(&spec).unwrap();
    let c2 = spawn(&env.spec("other", "busybox", &["sleep", "100"], Some(&sb2))).unwrap();
    assert!(wait_until(Duration::from_secs(5), || env
        .log("daemon")
        .contains("started")));
    let in_ns = localkube::runtime::cleanup::netns_processes(&sb1.netns);
    assert!(in_ns.len() >= 2, "{in_ns:?}");
    // A host mount under the state dir, as a kubelet might leave (e.g. a tmpfs for secrets).
    let mnt = env.state.path().join("tmpfs");
    mount_tmpfs(&mnt);

    // "Crash": the runtime forgets everything.
    std::mem::forget(net);
    let began = Instant::now();
    let report = cleanup_leftovers(env.state.path(), &bridge).unwrap();
    eprintln!("cleanup took {:?}: {report:?}", began.elapsed());
    assert!(report.killed.contains(&c1.pid()) && report.killed.contains(&c2.pid()));
    assert_eq!(report.netns.len(), 2);
    for rec in &in_ns {
        assert!(wait_until(Duration::from_secs(2), || !alive(
            rec.pid,
            rec.start_time
        )));
    }
    assert_eq!(c1.wait().await.signal(), Some(Signal::SIGKILL));
    c2.wait().await;

    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let netns = String::from_utf8_lossy(&netns.stdout);
    assert!(!netns.contains(&format!("{bridge}-")), "{netns}");
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    assert!(!links.contains(&bridge), "{links}");
    assert!(
        !links.contains(&sb1.host_veth) && !links.contains(&sb2.host_veth),
        "{links}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let state = env.state.path().canonicalize().unwrap();
    assert!(!mounts.contains(&*state.to_string_lossy()), "{mounts}");
    // Idempotent.
    assert!(
        cleanup_leftovers(env.state.path(), &bridge)
            .unwrap()
            .is_empty()
    );
}

fn alive(pid: i32, start: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[19].parse::<u64>().ok() == Some(start) && fields[0] != "Z"
}

#[tokio::test]
async fn root_netns_default_images_run_their_binaries() {
    require_root!();
    let env = TestEnv::new();
    let run = |name: &str, image: &str, args: &[&str]| {
        let mut spec = env.spec(name, image, args, None);
        spec.working_dir = None;
        spawn(&spec).unwrap()
    };
    // Host network (no netns_path): the container shares the host's network namespace.
    let c = run("hostnet", "busybox", &["sleep", "30"]);
    assert!(wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/comm", c.pid()))
            .is_ok_and(|s| s.trim() == "sleep")
    }));
    assert_eq!(netns_inode(c.pid()), netns_inode(std::process::id() as i32));
    stop(&c).await;

    // The valkey entrypoint shim keeps an explicit `valkey-server` first argument.
    let c = run("v9", "valkey/valkey:9.0.0", &["valkey-server", "--version"]);
    assert_eq!(c.wait().await.code, Some(0), "{}", env.log("v9"));
    assert!(env.log("v9").contains("v=9."), "{}", env.log("v9"));
    let c = run("v8", "docker.io/valkey/valkey:8.0.1", &["--version"]);
    assert_eq!(c.wait().await.code, Some(0), "{}", env.log("v8"));
    assert!(env.log("v8").contains("v=8.0"), "{}", env.log("v8"));
    let c = run("cli", "valkey/valkey:9.0.0", &["valkey-cli", "--version"]);
    assert_eq!(c.wait().await.code, Some(0), "{}", env.log("cli"));
    let c = run(
        "exporter",
        "oliver006/redis_exporter:v1.80.0",
        &["--version"],
    );
    assert_eq!(c.wait().await.code, Some(0), "{}", env.log("exporter"));
    assert!(
        env.log("exporter").contains("Redis Metrics Exporter"),
        "{}",
        env.log("exporter")
    );
}

#[tokio::test]
async fn root_netns_binaries_on_other_mounts_are_visible() {
    require_root!();
    let env = TestEnv::new();
    // A separate file system (as a state dir or binary cache on another volume would be): the
    // overlay of the host root does not show it, the runtime must bind it in.
    let fs = env.state.path().join("other-fs");
    mount_tmpfs(&fs);
    std::fs::create_dir_all(fs.join("cache/v1")).unwrap();
    std::fs::create_dir_all(fs.join("cache/bin")).unwrap();
    let tool = fs.join("cache/v1/tool");
    std::fs::write(&tool, "#!/bin/sh\necho tool-ok \"$@\"\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&tool, fs.join("cache/bin/tool")).unwrap();
    let entry = localkube::runtime::ImageEntry {
        name: "tool".into(),
        patterns: vec!["example/tool:*".into()],
        links: [("tool".to_string(), fs.join("cache/bin/tool"))].into(),
        scripts: Default::default(),
        entrypoint: vec!["tool".into()],
        cmd: vec![],
        working_dir: None,
        env: Default::default(),
        user: None,
    };
    let table = ImageTable::new(vec![entry], &fs.join("images")).unwrap();
    let img = table.resolve("example/tool:1").unwrap();
    let mut spec = env.spec("tool", "busybox", &[], None);
    spec.argv = img.argv(&[], &s(&["x"]));
    spec.env = img.env.clone();
    let st = spawn(&spec).unwrap().wait().await;
    assert_eq!(st.code, Some(0), "{}", env.log("tool"));
    assert_eq!(env.log("tool"), "tool-ok x\n");
}

/// Two environments on one slot would put two pods on each IP of one bridge, and a
/// `CLUSTER MEET` could then merge Valkey clusters of different environments. A slot whose lock
/// file was deleted under a running environment (a temp-directory cleaner) is not taken
/// again: its bridge names its live owner.
#[tokio::test]
async fn root_netns_a_slot_whose_bridge_has_a_live_owner_is_not_taken() {
    require_root!();
    // A network made here names this process as its owner.
    let env = TestEnv::new();
    assert_eq!(
        localkube::runtime::network::bridge_owner(&env.bridge),
        Some(std::process::id())
    );
    drop(env);

    // Slot 249's bridge, owned by another live process (pid 1), its lock file free.
    let index = 249u8;
    let bridge = format!("lkbr{index}");
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ip(&["link", "show", "dev", &bridge]) {
        eprintln!("skipped: {bridge} exists (an environment uses slot {index})");
        return;
    }
    assert!(ip(&["link", "add", "name", &bridge, "type", "bridge"]));
    let aliased = ip(&["link", "set", "dev", &bridge, "alias", "localkube-owner:1"]);
    let taken = localkube::slot::Slot::acquire_index(index);
    ip(&["link", "del", "dev", &bridge]);
    assert!(aliased);
    let err = taken.expect_err("the slot of a live owner was taken");
    assert!(err.to_string().contains("owns its bridge"), "{err}");
    // Once the bridge is gone the slot is free again.
    assert!(localkube::slot::Slot::acquire_index(index).is_ok());
}
