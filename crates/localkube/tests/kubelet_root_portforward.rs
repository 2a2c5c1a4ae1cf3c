//! `kubectl port-forward` through the real API server (kubectl tunnels SPDY over WebSockets,
//! the API server speaks SPDY to localkube's kubelet), driven by the real `kubectl` (needs root
//! for pods): a Valkey bound to the pod's loopback address answers through the forwarded port,
//! several connections (one after the other and at once, with a megabyte each way), and a port
//! nothing listens on is reported by kubectl.

#[macro_use]
mod support;
use support::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::json;

fn kubectl(kubeconfig: &Path) -> Command {
    let mut c = Command::new(localkube::runtime::images::default_bin_cache().join("kubectl"));
    c.arg("--kubeconfig").arg(kubeconfig).args(["-n", "pf"]);
    c
}

/// `kubectl port-forward pod/kv :<remote>`: the process and the local port it listens on.
fn port_forward(kubeconfig: &Path, remote: u16) -> (Child, u16) {
    let t = Instant::now();
    let mut child = kubectl(kubeconfig)
        .args(["port-forward", "pod/kv", &format!(":{remote}")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl port-forward");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read kubectl output");
    // Keep reading ("Handling connection for ..."): a closed pipe would kill kubectl.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    // "Forwarding from 127.0.0.1:40123 -> 7777"
    let local = line
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected kubectl output {line:?}"));
    eprintln!(
        "MEASURE kubectl port-forward ready: {} ms",
        t.elapsed().as_millis()
    );
    (child, local)
}

/// Sends `request` on a new connection to `port`, half-closes, reads the whole answer.
fn exchange(port: u16, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to kubectl");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).expect("send");
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("read");
    answer
}

/// A RESP command.
fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend(b"\r\n");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_port_forward_through_kubectl() {
    let Some((env, _, pods)) = support::start_env_in("pf").await else {
        return;
    };
    let kubeconfig = env.kubeconfig_path();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "kv"},
        "spec": {
            "containers": [{
                "name": "valkey",
                "image": "valkey/valkey:9.0.0",
                // Only on the pod's loopback: reachable through port-forward alone.
                "args": [
                    "--port", "7777", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                ],
                "readinessProbe": {
                    "exec": {"command": ["valkey-cli", "-p", "7777", "ping"]},
                    "periodSeconds": 1,
                },
            }],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    ready(&pods, "kv", Duration::from_secs(60)).await;

    let (mut pf, port) = port_forward(&kubeconfig, 7777);
    let t = Instant::now();
    assert_eq!(exchange(port, b"PING\r\nQUIT\r\n"), b"+PONG\r\n+OK\r\n");
    eprintln!("MEASURE first PING: {} ms", t.elapsed().as_millis());
    assert_eq!(exchange(port, b"PING\r\nQUIT\r\n"), b"+PONG\r\n+OK\r\n");

    // A megabyte each way, on connections at once.
    let value = vec![b'x'; 1 << 20];
    let mut set = resp(&[b"SET", b"big", &value]);
    set.extend(resp(&[b"QUIT"]));
    assert_eq!(exchange(port, &set), b"+OK\r\n+OK\r\n");
    let handles: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                let mut get = resp(&[b"GET", b"big"]);
                get.extend(resp(&[b"QUIT"]));
                exchange(port, &get)
            })
        })
        .collect();
    let mut expected = format!("${}\r\n", value.len()).into_bytes();
    expected.extend_from_slice(&value);
    expected.extend(b"\r\n+OK\r\n");
    for h in handles {
        let got = h.join().unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "GET big answered something else");
    }
    let _ = pf.kill();
    let _ = pf.wait();

    // Nothing listens on 7778: kubectl says so (from the error stream).
    let (mut pf, port) = port_forward(&kubeconfig, 7778);
    let answer = exchange(port, b"PING\r\n");
    assert!(answer.is_empty(), "{answer:?}");
    let mut stderr = pf.stderr.take().expect("stderr");
    let waited = tokio::task::spawn_blocking(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    // kubectl gives up on the connection after such an error; kill it if it does not.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = pf.kill();
    let _ = pf.wait();
    let err = waited.await.unwrap();
    eprintln!("closed port: {}", err.trim());
    assert!(err.contains("error forwarding port 7778"), "{err}");
    assert!(err.contains("refused"), "{err}");

    env.stop().await;
}
