//! End-to-end tests of localkube's kubelet: init containers, restart
//! policies and phases, CrashLoopBackOff, liveness restarts, lifecycle
//! hooks, and fault injection (pause/resume, network cut/restore, node
//! stop → NotReady → start). Needs root; CI runs as root.

#[macro_use]
mod support;
use support::*;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn sh_pod(name: &str, policy: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": policy,
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap()
}

fn main_status(p: &Pod) -> Option<k8s_openapi::api::core::v1::ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_faults_and_lifecycle() {
    let ns = "ft";
    let Some((env, client, pods)) = support::start_env_in(ns).await else {
        return;
    };
    let dir = env.dir().to_path_buf();
    let faults = env.faults().unwrap();
    let pp = PostParams::default();

    // --- Init containers run in order, to completion, before the containers.
    let init: Pod = serde_json::from_value(json!({
        "metadata": {"name": "init"},
        "spec": {
            "initContainers": [
                {"name": "one", "image": "busybox", "command": ["sh", "-c", "echo one >> /work/order"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
                {"name": "two", "image": "busybox", "command": ["sh", "-c", "sleep 0.5; echo two >> /work/order"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
            ],
            "containers": [{"name": "main", "image": "busybox",
                "command": ["sh", "-c", "echo ORDER $(cat /work/order | tr '\\n' ' '); sleep 3600"],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&pp, &init).await.unwrap();
    let init = ready(&pods, "init", Duration::from_secs(60)).await;
    let statuses = init
        .status
        .as_ref()
        .unwrap()
        .init_container_statuses
        .clone()
        .unwrap();
    for s in &statuses {
        let t = s.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (t.exit_code, t.reason.as_deref()),
            (0, Some("Completed")),
            "{}",
            s.name
        );
    }
    wait_for_main_log(&dir, &init, "ORDER one two", Duration::from_secs(10)).await;

    // --- hostNetwork pods run in the host's network; podIP = hostIP.
    let hostnet: Pod = serde_json::from_value(json!({
        "metadata": {"name": "hostnet"},
        "spec": {
            "hostNetwork": true,
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "sleep 3600"]}],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&pp, &hostnet).await.unwrap();
    let hostnet = ready(&pods, "hostnet", Duration::from_secs(60)).await;
    let st = hostnet.status.unwrap();
    assert_eq!(st.pod_ip, st.host_ip);
    pods.delete("hostnet", &DeleteParams::default())
        .await
        .unwrap();

    // --- Restart policies and phases.
    pods.create(&pp, &sh_pod("never-fails", "Never", "exit 3"))
        .await
        .unwrap();
    pods.create(&pp, &sh_pod("onfailure-ok", "OnFailure", "exit 0"))
        .await
        .unwrap();
    pods.create(&pp, &sh_pod("crashloop", "Always", "exit 1"))
        .await
        .unwrap();
    let failed = wait_for("Failed phase", Duration::from_secs(30), || async {
        pods.get("never-fails")
            .await
            .ok()
            .filter(|p| phase(p) == "Failed")
    })
    .await;
    let t = main_status(&failed)
        .unwrap()
        .state
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
    wait_for("Succeeded phase", Duration::from_secs(30), || async {
        pods.get("onfailure-ok")
            .await
            .ok()
            .filter(|p| phase(p) == "Succeeded")
    })
    .await;
    let crash = wait_for("CrashLoopBackOff", Duration::from_secs(40), || async {
        pods.get("crashloop").await.ok().filter(|p| {
            main_status(p).is_some_and(|s| {
                s.restart_count >= 1
                    && s.state
                        .as_ref()
                        .and_then(|st| st.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        == Some("CrashLoopBackOff")
            })
        })
    })
    .await;
    assert_eq!(phase(&crash), "Running");
    let cs = main_status(&crash).unwrap();
    assert_eq!(cs.last_state.unwrap().terminated.unwrap().exit_code, 1);
    let msg = cs.state.unwrap().waiting.unwrap().message.unwrap();
    assert!(
        msg.starts_with("back-off 10s restarting failed container=main pod=crashloop_ft("),
        "{msg}"
    );

    // --- Liveness failure restarts the container; postStart/preStop hooks run.
    let live: Pod = serde_json::from_value(json!({
        "metadata": {"name": "live"},
        "spec": {
            "containers": [{
                "name": "main", "image": "busybox",
                "command": ["sh", "-c", "trap 'echo TERM' TERM; touch /tmp/alive; (sleep 2; rm -f /tmp/alive) & while true; do test -f /tmp/hooked && echo HOOKED; test -f /tmp/prestop && echo PRESTOP; sleep 0.3; done"],
                "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 1, "failureThreshold": 2},
                "lifecycle": {
                    "postStart": {"exec": {"command": ["touch", "/tmp/hooked"]}},
                    "preStop": {"exec": {"command": ["touch", "/tmp/prestop"]}},
                },
            }],
            "terminationGracePeriodSeconds": 2,
        }
    }))
    .unwrap();
    pods.create(&pp, &live).await.unwrap();
    let live = wait_for("liveness restart", Duration::from_secs(60), || async {
        pods.get("live")
            .await
            .ok()
            .filter(|p| main_status(p).is_some_and(|s| s.restart_count >= 1))
    })
    .await;
    let first = log_of(&dir, &live, "main", 0);
    assert!(first.contains("HOOKED"), "postStart ran: {first}");
    assert!(
        first.contains("PRESTOP"),
        "preStop ran before the kill: {first}"
    );
    assert!(first.contains("TERM"), "SIGTERM delivered: {first}");

    // --- Pause/resume and network cut/restore of a Valkey pod.
    let valkey: Pod = serde_json::from_value(json!({
        "metadata": {"name": "kv"},
        "spec": {
            "containers": [{
                "name": "valkey", "image": "valkey/valkey:9.0.0",
                "args": ["--save", "", "--appendonly", "no", "--protected-mode", "no"],
                "readinessProbe": {"tcpSocket": {"port": 6379}, "periodSeconds": 1},
            }],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&pp, &valkey).await.unwrap();
    let kv = ready(&pods, "kv", Duration::from_secs(60)).await;
    let ip = kv.status.as_ref().unwrap().pod_ip.clone().unwrap();
    assert!(ping(&ip, 6379));
    let out = faults
        .exec(
            ns,
            "kv",
            "valkey",
            &["valkey-cli", "ping"],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!((out.exit_code, out.output.trim()), (0, "PONG"));
    let out = faults
        .exec(
            ns,
            "kv",
            "valkey",
            &["sh", "-c", "echo $HOSTNAME"],
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(out.output.trim(), "kv");
    faults.pause(ns, "kv", "valkey").unwrap();
    assert!(!ping(&ip, 6379), "a paused server does not answer");
    faults.resume(ns, "kv", "valkey").unwrap();
    assert!(ping(&ip, 6379), "a resumed server answers");
    faults.cut_network(ns, "kv").unwrap();
    assert!(!ping(&ip, 6379), "a cut-off pod is unreachable");
    faults.restore_network(ns, "kv").unwrap();
    wait_for("network restored", Duration::from_secs(10), || async {
        ping(&ip, 6379).then_some(())
    })
    .await;

    // --- Stopping a node: its pods die, the node goes NotReady; starting it brings it back.
    let node = kv.spec.as_ref().unwrap().node_name.clone().unwrap();
    faults.stop_node(&node).await.unwrap();
    assert!(!ping(&ip, 6379), "pods of a stopped node are dead");
    let nodes: Api<Node> = Api::all(client.clone());
    let t = Instant::now();
    wait_for("node NotReady", Duration::from_secs(120), || async {
        let n = nodes.get(&node).await.ok()?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (ready.status != "True").then_some(())
    })
    .await;
    eprintln!(
        "MEASURE stopped node NotReady after {} s",
        t.elapsed().as_secs()
    );
    faults.start_node(&node).await.unwrap();
    let kv = wait_for(
        "kv Ready again after node start",
        Duration::from_secs(90),
        || async {
            pods.get("kv")
                .await
                .ok()
                .filter(|p| pod_ready(p) && main_status(p).is_some_and(|s| s.restart_count >= 1))
        },
    )
    .await;
    let ip = kv.status.as_ref().unwrap().pod_ip.clone().unwrap();
    wait_for("kv answers again", Duration::from_secs(10), || async {
        ping(&ip, 6379).then_some(())
    })
    .await;

    pods.delete("kv", &DeleteParams::default()).await.unwrap();
    wait_for("kv gone", Duration::from_secs(30), || async {
        matches!(pods.get_opt("kv").await, Ok(None)).then_some(())
    })
    .await;
    env.stop().await;
}
