//! `kubectl exec` through the real API server (WebSockets from kubectl, SPDY from the API
//! server to localkube's kubelet), driven by the real `kubectl` (needs root for pods): stdout
//! and stderr kept apart, the exit code passed on, stdin with `-i`, the container's
//! environment and file system, a second container chosen with `-c`, the command killed when
//! kubectl goes away, and clear errors for a missing pod or container and for a container that
//! has exited.

#[macro_use]
mod support;
use support::*;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::json;

fn kubectl(kubeconfig: &Path) -> Command {
    let mut c = Command::new(localkube::runtime::images::default_bin_cache().join("kubectl"));
    c.arg("--kubeconfig").arg(kubeconfig).args(["-n", "exec"]);
    c
}

/// `kubectl <args>` with `stdin` as its standard input: (exit code, stdout, stderr).
fn run_with_stdin(kubeconfig: &Path, args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    let t = Instant::now();
    let mut child = kubectl(kubeconfig)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(data).expect("write stdin");
    }
    let out = child.wait_with_output().expect("kubectl");
    eprintln!(
        "MEASURE kubectl {}: {} ms",
        args.join(" "),
        t.elapsed().as_millis()
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    run_with_stdin(kubeconfig, args, None)
}

/// `kubectl exec shell <options> -- sh -c <script>`: (exit code, stdout, stderr).
fn exec_sh(kubeconfig: &Path, options: &[&str], script: &str) -> (i32, String, String) {
    let mut args = vec!["exec", "shell"];
    args.extend_from_slice(options);
    args.extend(["--", "sh", "-c", script]);
    run(kubeconfig, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_exec_through_kubectl() {
    let Some((env, _, pods)) = support::start_env_in("exec").await else {
        return;
    };
    let kubeconfig = env.kubeconfig_path();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "shell",
            "annotations": {"kubectl.kubernetes.io/default-container": "main"},
        },
        "spec": {
            "containers": [
                {
                    "name": "main", "image": "busybox",
                    "command": ["sh", "-c", "echo ready > /tmp/marker; exec sleep 3600"],
                    "env": [{"name": "GREETING", "value": "hello from main"}],
                    "workingDir": "/work",
                },
                {
                    "name": "side", "image": "busybox",
                    "command": ["sleep", "3600"],
                },
                {
                    "name": "done", "image": "busybox",
                    "command": ["true"],
                },
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for(
        "main and side running, done terminated",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let st = pods.get("shell").await.ok()?.status?.container_statuses?;
                let state = |name: &str| {
                    st.iter()
                        .find(|c| c.name == name)
                        .and_then(|c| c.state.clone())
                };
                (state("main")?.running.is_some()
                    && state("side")?.running.is_some()
                    && state("done")?.terminated.is_some())
                .then_some(())
            }
        },
    )
    .await;

    // stdout and stderr stay apart; the exit code is kubectl's.
    let (code, out, err) = exec_sh(&kubeconfig, &[], "echo out; echo err >&2; exit 3");
    assert_eq!(code, 3, "stdout {out:?} stderr {err:?}");
    assert_eq!(out, "out\n");
    assert!(err.starts_with("err\n"), "{err:?}");
    assert!(
        err.contains("command terminated with exit code 3"),
        "{err:?}"
    );

    // Success: exit 0, the container's environment, working dir and file system.
    let (code, out, err) = exec_sh(
        &kubeconfig,
        &["-c", "main"],
        "echo $GREETING; pwd; cat /tmp/marker",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "hello from main\n/work\nready\n");
    assert_eq!(err, "");

    // More output than a pipe buffer or a frame holds.
    let (code, out, err) = exec_sh(&kubeconfig, &[], "seq 1 100000");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 100_000);
    assert_eq!(out.lines().last(), Some("100000"));

    // stdin with -i, closed at its end.
    let (code, out, err) = run_with_stdin(
        &kubeconfig,
        &["exec", "-i", "shell", "--", "cat"],
        Some(b"hi\n"),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "hi\n");
    let (code, out, err) = run_with_stdin(
        &kubeconfig,
        &["exec", "-i", "shell", "--", "wc", "-l"],
        Some(b"a\nb\nc\n"),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "3");

    // kubectl going away kills the command.
    let mut long = kubectl(&kubeconfig)
        .args(["exec", "shell", "--", "sleep", "4242"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl exec sleep");
    let sleeping = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == b"sleep\x004242\x00")
        })
    };
    wait_for("the exec'd sleep runs", Duration::from_secs(10), || {
        let s = sleeping();
        async move { s.then_some(()) }
    })
    .await;
    long.kill().unwrap();
    let _ = long.wait();
    wait_for(
        "the exec'd sleep is killed with its connection",
        Duration::from_secs(10),
        || {
            let s = sleeping();
            async move { (!s).then_some(()) }
        },
    )
    .await;

    // The other container: its own file system (no marker there).
    let (code, _, _) = run(
        &kubeconfig,
        &[
            "exec",
            "shell",
            "-c",
            "side",
            "--",
            "test",
            "-e",
            "/tmp/marker",
        ],
    );
    assert_eq!(code, 1);

    // A command that does not exist: the runtime's 127 and its message.
    let (code, _, err) = run(&kubeconfig, &["exec", "shell", "--", "no-such-command"]);
    assert_eq!(code, 127, "{err}");
    assert!(err.contains("no-such-command"), "{err}");

    // Errors: a missing pod, a missing container (both the API server's), a stopped one.
    let (code, _, err) = run(&kubeconfig, &["exec", "nope", "--", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("\"nope\" not found"), "{err}");
    eprintln!("missing pod: {}", err.trim());
    let (code, _, err) = run(&kubeconfig, &["exec", "shell", "-c", "nope", "--", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("container nope is not valid"), "{err}");
    eprintln!("missing container: {}", err.trim());

    let (code, _, err) = run(&kubeconfig, &["exec", "shell", "-c", "done", "--", "true"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("container done in pod exec/shell is not running"),
        "{err}"
    );
    eprintln!("stopped container: {}", err.trim());

    env.stop().await;
}
