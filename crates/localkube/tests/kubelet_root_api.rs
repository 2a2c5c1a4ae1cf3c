//! The kubelet API through the real API server, driven by the real `kubectl` (needs root for
//! pods): `kubectl logs` of the current and the previous instance of a restarted container,
//! `--tail`, `--limit-bytes`, and `-f` that streams new lines as they are written; `kubectl
//! attach` is refused with a message saying it is not emulated (`kubectl exec`:
//! `kubelet_root_exec.rs`).

#[macro_use]
mod support;
use support::*;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::json;

fn kubectl(kubeconfig: &Path) -> Command {
    let mut c = Command::new(localkube::runtime::images::default_bin_cache().join("kubectl"));
    c.arg("--kubeconfig").arg(kubeconfig).args(["-n", "api"]);
    c
}

/// `kubectl <args>`: (success, stdout, stderr).
fn run(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = kubectl(kubeconfig).args(args).output().expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `N` of every `second N` line.
fn seconds(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.strip_prefix("second ")?.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_api_logs_through_kubectl() {
    let Some((env, _, pods)) = support::start_env_in("api").await else {
        return;
    };
    let kubeconfig = env.kubeconfig_path();

    // First instance prints three lines and fails; the second counts forever.
    let script = "if [ ! -e /data/ran ]; then touch /data/ran; for i in 1 2 3; do echo first $i; \
                  done; exit 1; fi; i=0; while true; do i=$((i+1)); echo second $i; sleep 0.2; done";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "talker"},
        "spec": {
            "containers": [{
                "name": "main", "image": "busybox",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for(
        "talker restarted once and running",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("talker").await.ok()?;
                let cs = p.status?.container_statuses?.into_iter().next()?;
                (cs.restart_count == 1 && cs.state?.running.is_some()).then_some(())
            }
        },
    )
    .await;

    // The previous instance.
    let t = Instant::now();
    let (ok, out, err) = run(&kubeconfig, &["logs", "talker", "--previous"]);
    eprintln!(
        "MEASURE kubectl logs --previous: {} ms",
        t.elapsed().as_millis()
    );
    assert!(ok, "kubectl logs --previous: {err}");
    assert_eq!(out, "first 1\nfirst 2\nfirst 3\n");

    // The current one: its own lines only, counting up.
    let current = wait_for(
        "a few lines of the second instance",
        Duration::from_secs(20),
        || {
            let (ok, out, _) = run(&kubeconfig, &["logs", "talker"]);
            async move { (ok && seconds(&out).len() >= 3).then_some(out) }
        },
    )
    .await;
    assert!(!current.contains("first"), "{current}");
    let n = seconds(&current);
    assert_eq!(n, (1..=n.len() as u32).collect::<Vec<_>>(), "{current}");

    // --tail and --limit-bytes.
    let (ok, out, err) = run(&kubeconfig, &["logs", "talker", "--tail", "2"]);
    assert!(ok, "{err}");
    let tail = seconds(&out);
    assert_eq!(tail.len(), 2, "{out:?}");
    assert_eq!(tail[1], tail[0] + 1, "{out:?}");
    assert!(tail[1] >= n[n.len() - 1], "{out:?} after {current:?}");
    let (ok, out, err) = run(&kubeconfig, &["logs", "talker", "--limit-bytes", "5"]);
    assert!(ok, "{err}");
    assert_eq!(out, "secon");

    // -f: the lines so far, then new ones as they are written.
    let mut follow = kubectl(&kubeconfig)
        .args(["logs", "-f", "talker", "--tail", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let stdout = follow.stdout.take().expect("stdout");
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .take(6)
            .collect::<Result<Vec<_>, _>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(20), lines)
        .await
        .expect("kubectl logs -f streams six lines within 20 s")
        .expect("join")
        .expect("read");
    let _ = follow.kill();
    let _ = follow.wait();
    let followed = seconds(&lines.join("\n"));
    assert_eq!(followed.len(), 6, "{lines:?}");
    assert!(
        followed.windows(2).all(|w| w[1] == w[0] + 1),
        "{followed:?}"
    );
    eprintln!("kubectl logs -f streamed {followed:?}");

    // attach is not emulated, and says so.
    let (ok, _, err) = run(&kubeconfig, &["attach", "talker"]);
    assert!(!ok);
    assert!(err.contains("attach is not emulated"), "{err}");
    eprintln!("kubectl attach: {}", err.trim());

    env.stop().await;
}
