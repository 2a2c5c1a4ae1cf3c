//! End-to-end tests of localkube's kubelet against the real control plane:
//! pod content (ConfigMap, Secret, downward API, env, `$(VAR)`), readiness
//! and create-to-Ready latency, crash restarts, graceful deletion, unknown
//! images, PVC data surviving pod re-creation, and a clean teardown.
//! Needs root (network and mount namespaces); CI runs as root.

#[macro_use]
mod support;
use support::*;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn valkey_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [{
                "name": "valkey",
                "image": "valkey/valkey:9.0.0",
                "args": ["--port", "6379", "--save", "", "--appendonly", "no", "--protected-mode", "no"],
                "readinessProbe": {"exec": {"command": ["valkey-cli", "ping"]}, "periodSeconds": 1},
            }],
            "terminationGracePeriodSeconds": 5,
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_pod_lifecycle() {
    let ns = "kl";
    let Some((env, client, pods)) = support::start_env_in(ns).await else {
        return;
    };
    let dir = env.dir().to_path_buf();

    // --- Readiness, latency, PING from the host.
    let t0 = Instant::now();
    pods.create(&PostParams::default(), &valkey_pod("v1"))
        .await
        .unwrap();
    let v1 = ready(&pods, "v1", Duration::from_secs(60)).await;
    let latency = t0.elapsed();
    eprintln!(
        "MEASURE pod create-to-Ready latency: {} ms",
        latency.as_millis()
    );
    let st = v1.status.clone().unwrap();
    let ip = st.pod_ip.clone().unwrap();
    assert!(ping(&ip, 6379), "valkey at {ip} answers PING");
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert!(st.host_ip.is_some() && st.start_time.is_some());
    let cs = &st.container_statuses.unwrap()[0];
    assert!(cs.ready && cs.started == Some(true) && cs.container_id.is_some());
    assert_eq!(cs.image, "valkey/valkey:9.0.0");

    // --- More latency samples: with the exec readiness probe, and without probes.
    let mut probed = Vec::new();
    let mut bare = Vec::new();
    for i in 0..3 {
        let name = format!("lat{i}");
        let t = Instant::now();
        pods.create(&PostParams::default(), &valkey_pod(&name))
            .await
            .unwrap();
        ready(&pods, &name, Duration::from_secs(60)).await;
        probed.push(t.elapsed().as_millis());
        let name = format!("bare{i}");
        let mut pod = valkey_pod(&name);
        pod.spec.as_mut().unwrap().containers[0].readiness_probe = None;
        let t = Instant::now();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        ready(&pods, &name, Duration::from_secs(60)).await;
        bare.push(t.elapsed().as_millis());
    }
    eprintln!(
        "MEASURE create-to-Ready ms, exec readiness probe (period 1 s): {probed:?}; no probe: {bare:?}"
    );
    for i in 0..3 {
        for n in [format!("lat{i}"), format!("bare{i}")] {
            pods.delete(&n, &DeleteParams::default()).await.unwrap();
        }
    }

    // --- Kubelet events.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    wait_for(
        "Pulled/Created/Started events",
        Duration::from_secs(20),
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            let reasons: Vec<String> = list
                .items
                .iter()
                .filter(|e| e.involved_object.name.as_deref() == Some("v1"))
                .filter_map(|e| e.reason.clone())
                .collect();
            ["Scheduled", "Pulled", "Created", "Started"]
                .iter()
                .all(|r| reasons.iter().any(|x| x == r))
                .then_some(())
        },
    )
    .await;

    // --- A killed process restarts and restartCount increments.
    env.faults()
        .unwrap()
        .kill_container(ns, "v1", "valkey")
        .unwrap();
    let v1 = wait_for(
        "v1 restarted and Ready",
        Duration::from_secs(60),
        || async {
            pods.get("v1").await.ok().filter(|p| {
                let cs = &p
                    .status
                    .as_ref()
                    .unwrap()
                    .container_statuses
                    .as_ref()
                    .unwrap()[0];
                cs.restart_count == 1 && pod_ready(p)
            })
        },
    )
    .await;
    let cs = &v1.status.unwrap().container_statuses.unwrap()[0];
    let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(last.exit_code, 137, "SIGKILL shows as 128+9");
    assert!(ping(&ip, 6379));

    // --- ConfigMap, Secret, downward API in files and env; $(VAR) expansion; refresh.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cfg"}, "data": {"greeting": "hello", "other": "x"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "sec"}, "stringData": {"password": "s3cret"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let script = "echo ENV POD=$POD_NAME NS=$MY_NS IP=$MY_IP PW=$PASSWORD GREET=$GREET MEM=$MEM_MI K8S=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT HOST=$HOSTNAME; \
        echo ARG $1; \
        while true; do echo CFG $(cat /etc/cfg/greeting) SEC $(cat /etc/sec/password) LBL $(cat /etc/pod/labels | tr '\\n' ' ') NAME $(cat /etc/pod/name); \
        test -s /etc/proj/token && echo TOKEN ok; if touch /etc/cfg/x 2>/dev/null; then echo RO broken; else echo RO ok; fi; sleep 1; done";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "content", "labels": {"app": "content", "tier": "test"}},
        "spec": {
            "containers": [{
                "name": "main",
                "image": "busybox:1.36",
                "command": ["sh", "-c", script, "--"],
                "args": ["$(GREET)-$(POD_NAME)"],
                "resources": {"limits": {"memory": "64Mi"}},
                "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
                    {"name": "GREET", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}}},
                    {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                ],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/etc/cfg"},
                    {"name": "sec", "mountPath": "/etc/sec"},
                    {"name": "pod", "mountPath": "/etc/pod"},
                    {"name": "proj", "mountPath": "/etc/proj"},
                ],
            }],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o400}},
                {"name": "pod", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                ]}},
                {"name": "proj", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "audience": "test", "expirationSeconds": 3600}},
                    {"configMap": {"name": "cfg", "items": [{"key": "other", "path": "other"}]}},
                ]}},
            ],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let content = ready(&pods, "content", Duration::from_secs(60)).await;
    let content_ip = content.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let log = wait_for("content log", Duration::from_secs(20), || {
        let log = log_of(&dir, &content, "main", 0);
        async move { (log.contains("TOKEN ok") && log.contains("RO ")).then_some(log) }
    })
    .await;
    eprintln!("content log:\n{log}");
    let host = env.gateway().unwrap().to_string();
    assert!(
        log.contains(&format!(
            "ENV POD=content NS=kl IP={content_ip} PW=s3cret GREET=hello MEM=64"
        )),
        "{log}"
    );
    assert!(
        log.contains(&format!("K8S={host}:")) || log.contains("K8S="),
        "{log}"
    );
    assert!(log.contains("HOST=content"), "{log}");
    assert!(log.contains("ARG hello-content"), "{log}");
    assert!(
        log.contains("CFG hello SEC s3cret LBL app=\"content\" tier=\"test\""),
        "{log}"
    );
    assert!(log.contains("NAME content"), "{log}");
    assert!(log.contains("RO ok"), "{log}");
    // ConfigMap volumes follow changes.
    cms.patch(
        "cfg",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"greeting": "updated"}})),
    )
    .await
    .unwrap();
    wait_for_main_log(&dir, &content, "CFG updated", Duration::from_secs(30)).await;

    // --- Nested mounts under read-only volumes, listed child first (as an operator renders a
    // ConfigMap at /config and its users Secret at /config/users), three deep, and subPath
    // mounts of a ConfigMap key and of an emptyDir directory.
    let script = "set -x; cat /config/greeting && cat /config/users/password && \
        touch /config/users/deep/scratch/f && ! touch /config/x 2>/dev/null && \
        ! touch /config/users/x 2>/dev/null && [ \"$(cat /etc/app.conf)\" = updated ] && \
        echo sub > /work/file && [ \"$(cat /data/work/file)\" = sub ] && echo NESTED ok; \
        sleep 3600";
    let nested: Pod = serde_json::from_value(json!({
        "metadata": {"name": "nested"},
        "spec": {
            "containers": [{
                "name": "main", "image": "busybox",
                "command": ["sh", "-c", script],
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/config/users/deep/scratch"},
                    {"name": "users", "mountPath": "/config/users"},
                    {"name": "cfg", "mountPath": "/config", "readOnly": true},
                    {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "greeting", "readOnly": true},
                    {"name": "data", "mountPath": "/work", "subPath": "work"},
                    {"name": "data", "mountPath": "/data"},
                ],
            }],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "users", "secret": {"secretName": "sec"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "data", "emptyDir": {}},
            ],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &nested).await.unwrap();
    let nested = wait_for("nested mounts", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("nested").await.ok()?;
            let started = p
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
            started.then_some(p)
        }
    })
    .await;
    let log = wait_for("nested log", Duration::from_secs(20), || {
        let log = log_of(&dir, &nested, "main", 0);
        async move { log.contains("NESTED ok").then_some(log) }
    })
    .await;
    assert!(log.contains("updated") && log.contains("s3cret"), "{log}");
    pods.delete("nested", &DeleteParams::default())
        .await
        .unwrap();

    // --- Graceful deletion: SIGTERM, grace period honoured, then SIGKILL.
    let stubborn: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stubborn"},
        "spec": {
            "containers": [{
                "name": "main", "image": "busybox",
                "command": ["sh", "-c", "trap 'echo GOT TERM' TERM; echo STARTED; while true; do sleep 0.2; done"],
            }],
            "terminationGracePeriodSeconds": 3,
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &stubborn)
        .await
        .unwrap();
    let stubborn = ready(&pods, "stubborn", Duration::from_secs(60)).await;
    wait_for_main_log(&dir, &stubborn, "STARTED", Duration::from_secs(10)).await;
    let t = Instant::now();
    pods.delete("stubborn", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("stubborn gone", Duration::from_secs(30), || async {
        matches!(pods.get_opt("stubborn").await, Ok(None)).then_some(())
    })
    .await;
    let took = t.elapsed();
    let log = log_of(&dir, &stubborn, "main", 0);
    assert!(log.contains("GOT TERM"), "SIGTERM delivered: {log}");
    assert!(
        took >= Duration::from_secs(3),
        "grace period honoured: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "SIGKILL after the grace period: {took:?}"
    );

    // --- Unknown image: ErrImagePull with a clear message.
    let bad: Pod = serde_json::from_value(json!({
        "metadata": {"name": "bad"},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/nope:1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &bad).await.unwrap();
    let waiting = wait_for("bad waiting", Duration::from_secs(30), || async {
        let p = pods.get("bad").await.ok()?;
        let cs = p.status?.container_statuses?.into_iter().next()?;
        let w = cs.state?.waiting?;
        matches!(
            w.reason.as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        )
        .then_some(w)
    })
    .await;
    let msg = waiting.message.unwrap_or_default();
    assert!(
        msg.contains("example.invalid/nope:1") && msg.contains("image table"),
        "{msg}"
    );

    // --- PVC: data survives pod deletion and re-creation.
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let writer = |name: &str, cmd: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "containers": [{
                    "name": "main", "image": "busybox",
                    "command": ["sh", "-c", cmd],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                "terminationGracePeriodSeconds": 1,
            }
        }))
        .unwrap()
    };
    pods.create(
        &PostParams::default(),
        &writer(
            "w1",
            "echo persisted-$(date +%s) > /data/file && sync && echo WROTE; sleep 3600",
        ),
    )
    .await
    .unwrap();
    let w1 = ready(&pods, "w1", Duration::from_secs(60)).await;
    wait_for_main_log(&dir, &w1, "WROTE", Duration::from_secs(10)).await;
    let bound = pvcs.get("data").await.unwrap();
    assert_eq!(bound.status.unwrap().phase.as_deref(), Some("Bound"));
    pods.delete("w1", &DeleteParams::default()).await.unwrap();
    wait_for("w1 gone", Duration::from_secs(30), || async {
        matches!(pods.get_opt("w1").await, Ok(None)).then_some(())
    })
    .await;
    pods.create(
        &PostParams::default(),
        &writer("w2", "cat /data/file; sleep 3600"),
    )
    .await
    .unwrap();
    let w2 = ready(&pods, "w2", Duration::from_secs(60)).await;
    wait_for_main_log(&dir, &w2, "persisted-", Duration::from_secs(10)).await;

    // --- PVC expansion: PV and PVC capacity grow.
    pvcs.patch(
        "data",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
    )
    .await
    .unwrap();
    wait_for("pvc expanded", Duration::from_secs(30), || async {
        let p = pvcs.get("data").await.ok()?;
        let cap = p.status?.capacity?.get("storage")?.0.clone();
        (cap == "2Gi").then_some(())
    })
    .await;

    // --- Teardown leaves nothing behind.
    let bridge = std::fs::read_to_string(dir.join("bridge")).unwrap();
    use localkube::runtime::pidfile::{PidRecord, start_time};
    let mut procs: Vec<PidRecord> = env
        .control_plane_pids()
        .into_iter()
        .filter_map(|(_, p)| {
            let pid = p as i32;
            start_time(pid).map(|start_time| PidRecord { pid, start_time })
        })
        .collect();
    let prefix = format!("{}-", bridge.trim());
    for netns in localkube::runtime::cleanup::list_netns(&prefix) {
        procs.extend(localkube::runtime::cleanup::netns_processes(&netns));
    }
    assert!(procs.len() > 4, "pod processes found: {procs:?}");
    env.stop().await;
    assert!(
        !Path::new("/sys/class/net").join(bridge.trim()).exists(),
        "bridge removed"
    );
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !netns
            .iter()
            .any(|n| n.starts_with(&format!("{}-", bridge.trim()))),
        "no netns left: {netns:?}"
    );
    // Still running = same pid and start time, and not a zombie.
    let running = |r: &PidRecord| {
        let state = std::fs::read_to_string(format!("/proc/{}/stat", r.pid))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim().chars().next())
            })
            .flatten();
        r.is_alive() && state != Some('Z')
    };
    let left: Vec<&PidRecord> = procs.iter().filter(|r| running(r)).collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(dir.to_string_lossy().as_ref()),
        "no mounts left under {}",
        dir.display()
    );
}
