//! Needs real `valkey-server` and `valkey-cli` binaries (see the `valkey-testkit` crate). The
//! server container's `preStop` hook (`render::handover`) against a real primary and its
//! replica: a replica stops at once, a primary owning slots waits for the operator's
//! coordinated hand-over (here a `CLUSTER FAILOVER` issued by the test) and returns soon after
//! it, and without a hand-over it gives up after its bound.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use valkey_api::defaults::VALKEY_PORT;
use valkey_operator::render::handover::{LINGER_SECONDS, handover_script};
use valkey_operator::render::paths::SYSTEM_DIR;
use valkey_operator::render::secrets::EXPORTER_PASSWORD_KEY;
use valkey_ops::commands::{self, FailoverMode};
use valkey_testkit::*;

/// Runs the hook against the server on `port` in a thread; returns its output and duration.
fn spawn_hook(
    dir: &std::path::Path,
    port: u16,
    wait_seconds: u32,
) -> std::thread::JoinHandle<(Output, Duration)> {
    let script = handover_script(false, wait_seconds)
        .replace(SYSTEM_DIR, &dir.display().to_string())
        .replace(&format!("-p {VALKEY_PORT}"), &format!("-p {port}"));
    let path = dir.join(format!("prestop-{port}-{wait_seconds}.sh"));
    std::fs::write(&path, script).expect("script");
    std::thread::spawn(move || {
        let started = Instant::now();
        let out = Command::new("sh")
            .arg(&path)
            .stdin(Stdio::null())
            .output()
            .expect("sh");
        (out, started.elapsed())
    })
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prestop_waits_for_the_hand_over_of_a_primary_only() {
    if !std::path::Path::new("/usr/bin/valkey-cli").exists() {
        eprintln!("skipped: valkey-cli not installed");
        return;
    }
    let flavor = [Flavor::V9, Flavor::V8]
        .into_iter()
        .find(|f| f.installed().is_some());
    let Some(flavor) = flavor else {
        eprintln!("skipped: no valkey-server installed");
        return;
    };
    let servers = start_servers(flavor, 2, None);
    let pool = operator_pool(None);
    let (p, r) = (servers[0].addr(), servers[1].addr());
    form_cluster(&pool, std::slice::from_ref(&p), std::slice::from_ref(&r)).await;
    // The replica must be online in the primary's INFO before the hook waits for anything.
    eventually("replica online", Duration::from_secs(20), || async {
        let mut c = pool.connection(&p).await.ok()?;
        let info: String = c.query(redis::cmd("INFO").arg("replication")).await.ok()?;
        info.contains("state=online").then_some(())
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join(EXPORTER_PASSWORD_KEY), EXPORTER_PASSWORD).expect("pw");

    // A replica has nothing to hand over.
    let (out, took) = spawn_hook(dir.path(), servers[1].port, 10)
        .join()
        .expect("hook");
    assert!(out.status.success(), "{out:?}");
    assert!(took < Duration::from_secs(2), "replica hook took {took:?}");
    assert_eq!(stdout(&out), "");

    // A primary without a hand-over gives up after its bound.
    let (out, took) = spawn_hook(dir.path(), servers[0].port, 1)
        .join()
        .expect("hook");
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains("no hand-over within 1s"),
        "{}",
        stdout(&out)
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );

    // A primary waits, and returns once the replica took its slots over.
    let hook = spawn_hook(dir.path(), servers[0].port, 10);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!hook.is_finished(), "the primary's hook must wait");
    let failed_over = Instant::now();
    assert!(
        commands::failover(&pool, &r, FailoverMode::Default, Duration::from_secs(10))
            .await
            .expect("failover")
    );
    let (out, _) = tokio::task::spawn_blocking(move || hook.join().expect("hook"))
        .await
        .expect("join");
    let after = failed_over.elapsed();
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("waiting up to 10s"), "{text}");
    assert!(text.contains("handed over"), "{text}");
    assert!(
        after >= Duration::from_secs(u64::from(LINGER_SECONDS))
            && after < Duration::from_secs(u64::from(LINGER_SECONDS) + 3),
        "returned {after:?} after the failover"
    );
}
