//! Conformance sweep of localkube's kubelet against the real controllers: ordinary workloads
//! behave as on a real kubelet. Jobs (backoffLimit → Failed/BackoffLimitExceeded, Complete,
//! OnFailure retried in place), a Deployment rollout, an init container retried with
//! back-off, probes of every supported kind (exec, tcpSocket, httpGet, startupProbe gating
//! liveness, readiness flipping, an httpGet liveness restart), downward API resource fields,
//! memory-backed emptyDirs (tmpfs with `size=`, unmounted at teardown) and `securityContext`
//! (runAsUser/runAsGroup/supplementalGroups/fsGroup for the process, exec probes, hooks and
//! exec; runAsNonRoot refusing root). One environment; every case is created up front and
//! checked in turn. Needs root; CI runs as root.

#[macro_use]
mod support;
use support::*;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Node, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "cf";

fn status_of(p: &Pod, name: &str) -> Option<ContainerStatus> {
    let st = p.status.as_ref()?;
    st.container_statuses
        .iter()
        .flatten()
        .chain(st.init_container_statuses.iter().flatten())
        .find(|s| s.name == name)
        .cloned()
}

fn job_condition(j: &Job, type_: &str) -> Option<(String, Option<String>)> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| (c.type_.clone(), c.reason.clone()))
}

fn job(name: &str, policy: &str, backoff: i32, script: &str, empty_dir: bool) -> Job {
    let mut spec = json!({
        "restartPolicy": policy,
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", script]}],
        "terminationGracePeriodSeconds": 1,
    });
    if empty_dir {
        spec["containers"][0]["volumeMounts"] = json!([{"name": "m", "mountPath": "/m"}]);
        spec["volumes"] = json!([{"name": "m", "emptyDir": {}}]);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"backoffLimit": backoff, "template": {"spec": spec}},
    }))
    .unwrap()
}

fn deployment(value: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "roll"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "roll"}},
            "template": {
                "metadata": {"labels": {"app": "roll"}},
                "spec": {
                    "containers": [{
                        "name": "main", "image": "busybox", "command": ["sleep", "3600"],
                        "env": [{"name": "VERSION", "value": value}],
                        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
                    }],
                    "terminationGracePeriodSeconds": 1,
                }
            },
        }
    }))
    .unwrap()
}

/// A Python HTTP server of the current directory on `port`. (Not `python3 -m http.server`:
/// it listens only after a reverse DNS lookup of its address, which takes the host
/// resolver's timeout in a pod without cluster DNS.)
fn serve(port: u16) -> String {
    format!(
        "import http.server as h, socketserver as s; s.TCPServer.allow_reuse_address = True; \
         s.TCPServer(('', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
    )
}

/// The objects of every case, created at once so that they progress in parallel.
fn case_pods() -> Vec<Pod> {
    let values = [
        // An init container failing twice (restartPolicy Always: the first retry is at once,
        // the next after a 10 s back-off, as on a kubelet).
        json!({
            "metadata": {"name": "init-retry"},
            "spec": {
                "initContainers": [{"name": "flaky", "image": "busybox",
                    "command": ["sh", "-c", "n=$(cat /m/n 2>/dev/null || echo 0); echo $((n + 1)) > /m/n; [ $n -ge 2 ]"],
                    "volumeMounts": [{"name": "m", "mountPath": "/m"}]}],
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
                "volumes": [{"name": "m", "emptyDir": {}}],
                "terminationGracePeriodSeconds": 1,
            }
        }),
        // Probes: startupProbe (httpGet) gates a tcpSocket liveness that would kill the
        // container at once, readiness by httpGet and by exec.
        json!({
            "metadata": {"name": "probes"},
            "spec": {
                "containers": [
                    {"name": "web", "image": "busybox",
                     "command": ["sh", "-c", &format!("sleep 4; exec python3 -c \"{}\"", serve(8080))],
                     "ports": [{"name": "http", "containerPort": 8080}],
                     "startupProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1, "failureThreshold": 30},
                     "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 1},
                     "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}},
                    {"name": "exec", "image": "busybox",
                     "command": ["sh", "-c", "touch /tmp/ok; exec sleep 3600"],
                     "readinessProbe": {"exec": {"command": ["cat", "/tmp/ok"]}, "periodSeconds": 1}},
                ],
                "terminationGracePeriodSeconds": 1,
            }
        }),
        // An httpGet liveness probe starting to fail (404) restarts the container.
        json!({
            "metadata": {"name": "live-http"},
            "spec": {
                "containers": [{"name": "main", "image": "busybox",
                    "command": ["sh", "-c", &format!("mkdir -p /srv; cd /srv; touch healthz; exec python3 -c \"{}\"", serve(8081))],
                    "startupProbe": {"httpGet": {"path": "/healthz", "port": 8081}, "periodSeconds": 1, "failureThreshold": 60},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8081}, "periodSeconds": 1, "failureThreshold": 2}}],
                "terminationGracePeriodSeconds": 1,
            }
        }),
        // Downward API resource fields in a volume and in env (an unset limit is the node's
        // allocatable).
        json!({
            "metadata": {"name": "downward"},
            "spec": {
                "containers": [{"name": "main", "image": "busybox",
                    "command": ["sh", "-c", "echo CPU_LIMIT=$CPU_LIMIT NODE=$NODE UID=$POD_UID; exec sleep 3600"],
                    "resources": {"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                    "env": [
                        {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    ],
                    "volumeMounts": [{"name": "info", "mountPath": "/info"}]}],
                "volumes": [{"name": "info", "downwardAPI": {"items": [
                    {"path": "cpu_request", "resourceFieldRef": {"containerName": "main", "resource": "requests.cpu", "divisor": "1m"}},
                    {"path": "mem_limit", "resourceFieldRef": {"containerName": "main", "resource": "limits.memory"}},
                    {"path": "mem_request_mi", "resourceFieldRef": {"containerName": "main", "resource": "requests.memory", "divisor": "1Mi"}},
                ]}}],
                "terminationGracePeriodSeconds": 1,
            }
        }),
        // Memory-backed emptyDirs: tmpfs of sizeLimit, or of the pod's memory limit.
        json!({
            "metadata": {"name": "mem"},
            "spec": {
                "containers": [{"name": "main", "image": "busybox",
                    "command": ["sh", "-c", "echo started; exec sleep 3600"],
                    "resources": {"limits": {"memory": "48Mi"}},
                    "volumeMounts": [
                        {"name": "small", "mountPath": "/small"},
                        {"name": "bounded", "mountPath": "/bounded"},
                        {"name": "disk", "mountPath": "/disk"},
                    ]}],
                "volumes": [
                    {"name": "small", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                    {"name": "bounded", "emptyDir": {"medium": "Memory"}},
                    {"name": "disk", "emptyDir": {}},
                ],
                "terminationGracePeriodSeconds": 1,
            }
        }),
        // securityContext: pod-level ids, a container overriding them, fsGroup on volumes,
        // exec probe and postStart hook under the same ids.
        json!({
            "metadata": {"name": "sec"},
            "spec": {
                "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [4000], "fsGroup": 2000},
                "containers": [
                    {"name": "pod-level", "image": "busybox",
                     "command": ["sh", "-c", "echo IDS $(id -u) $(id -g) $(id -G); touch /data/by-main; exec sleep 3600"],
                     "readinessProbe": {"exec": {"command": ["sh", "-c", "test \"$(id -u):$(id -g)\" = 1000:3000"]}, "periodSeconds": 1},
                     "lifecycle": {"postStart": {"exec": {"command": ["sh", "-c", "id -u > /data/hook-uid"]}}},
                     "volumeMounts": [
                        {"name": "data", "mountPath": "/data"},
                        {"name": "info", "mountPath": "/info"},
                        {"name": "claim", "mountPath": "/claim"},
                     ]},
                    {"name": "override", "image": "busybox",
                     "securityContext": {"runAsUser": 1001, "runAsGroup": 3001},
                     "command": ["sh", "-c", "echo IDS $(id -u) $(id -g) $(id -G); exec sleep 3600"]},
                ],
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                    {"name": "claim", "persistentVolumeClaim": {"claimName": "sec-claim"}},
                ],
                "terminationGracePeriodSeconds": 1,
            }
        }),
        // runAsNonRoot with an image running as root: not started.
        json!({
            "metadata": {"name": "nonroot"},
            "spec": {
                "securityContext": {"runAsNonRoot": true},
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
                "terminationGracePeriodSeconds": 1,
            }
        }),
    ];
    values
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

async fn exec(
    faults: &localkube::kubelet::Faults,
    pod: &str,
    container: &str,
    script: &str,
) -> (i32, String) {
    let out = faults
        .exec(
            NS,
            pod,
            container,
            &["sh", "-c", script],
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|e| panic!("exec in {pod}/{container}: {e:#}"));
    (out.exit_code, out.output.trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_conformance() {
    let t0 = Instant::now();
    let Some(env) = support::start_env().await else {
        return;
    };
    eprintln!(
        "MEASURE localkube cold start: {} ms",
        t0.elapsed().as_millis()
    );
    let client = env.client();
    let dir = env.dir().to_path_buf();
    let faults = env.faults().unwrap();
    create_ns(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();

    // --- Everything at once.
    let t_cases = Instant::now();
    for j in [
        job("job-fail", "Never", 1, "exit 1", false),
        job("job-ok", "Never", 6, "exit 0", false),
        job(
            "job-retry",
            "OnFailure",
            6,
            "test -f /m/tried && exit 0; touch /m/tried; exit 1",
            true,
        ),
    ] {
        jobs.create(&pp, &j).await.unwrap();
    }
    deployments.create(&pp, &deployment("v1")).await.unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "sec-claim"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    pvcs.create(&pp, &claim).await.unwrap();
    for p in case_pods() {
        pods.create(&pp, &p).await.unwrap();
    }

    // --- Startup probe gates liveness: the web container is running but not started for 4 s;
    // the liveness probe (failureThreshold 1) would have killed it. Meanwhile, an init
    // container that failed waits in back-off (Init:CrashLoopBackOff).
    let web_not_started = wait_for(
        "web running, not started",
        Duration::from_secs(30),
        || async {
            let p = pods.get("probes").await.ok()?;
            let s = status_of(&p, "web")?;
            (s.state.as_ref()?.running.is_some() && s.started == Some(false) && !s.ready)
                .then_some(())
        },
    );
    let init_back_off = wait_for("init CrashLoopBackOff", Duration::from_secs(30), || async {
        let p = pods.get("init-retry").await.ok()?;
        let s = status_of(&p, "flaky")?;
        let waiting = s.state.as_ref()?.waiting.as_ref()?.reason.clone()?;
        (waiting == "CrashLoopBackOff").then_some(p)
    });
    let ((), pending) = tokio::join!(web_not_started, init_back_off);
    let probes = ready(&pods, "probes", Duration::from_secs(30)).await;
    for c in ["web", "exec"] {
        let s = status_of(&probes, c).unwrap();
        assert_eq!(
            (s.ready, s.started, s.restart_count),
            (true, Some(true), 0),
            "{c}"
        );
    }
    // Readiness follows an exec probe both ways.
    exec(&faults, "probes", "exec", "rm /tmp/ok").await;
    wait_for("probes NotReady", Duration::from_secs(10), || async {
        let p = pods.get("probes").await.ok()?;
        (!pod_ready(&p) && !status_of(&p, "exec")?.ready).then_some(())
    })
    .await;
    exec(&faults, "probes", "exec", "touch /tmp/ok").await;
    ready(&pods, "probes", Duration::from_secs(10)).await;

    // --- httpGet liveness failing (404) restarts the container.
    wait_for("live-http started", Duration::from_secs(30), || async {
        let p = pods.get("live-http").await.ok()?;
        (status_of(&p, "main")?.started == Some(true)).then_some(())
    })
    .await;
    exec(&faults, "live-http", "main", "rm /srv/healthz").await;
    let live = wait_for("live-http restarted", Duration::from_secs(30), || async {
        let p = pods.get("live-http").await.ok()?;
        (status_of(&p, "main")?.restart_count >= 1).then_some(p)
    })
    .await;
    let last = status_of(&live, "main").unwrap().last_state.unwrap();
    let t = last.terminated.expect("last state terminated");
    assert_eq!(t.exit_code, 143, "python exits on SIGTERM: {t:?}");
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let unhealthy = events
        .list(&ListParams::default().fields("involvedObject.name=live-http,reason=Unhealthy"))
        .await
        .unwrap()
        .items;
    assert!(
        unhealthy.iter().any(|e| e.message.as_deref()
            == Some("Liveness probe failed: HTTP probe failed with statuscode: 404")),
        "{:?}",
        unhealthy
            .iter()
            .map(|e| e.message.clone())
            .collect::<Vec<_>>()
    );

    // --- Downward API resource fields.
    let downward = ready(&pods, "downward", Duration::from_secs(30)).await;
    let (code, out) = exec(
        &faults,
        "downward",
        "main",
        "echo $(cat /info/cpu_request) $(cat /info/mem_limit) $(cat /info/mem_request_mi)",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "250 134217728 32"));
    let node_name = downward.spec.as_ref().unwrap().node_name.clone().unwrap();
    let node = Api::<Node>::all(client.clone())
        .get(&node_name)
        .await
        .unwrap();
    let node_cpu = node.status.unwrap().allocatable.unwrap()["cpu"].0.clone();
    let log = wait_for("downward log", Duration::from_secs(10), || {
        let log = log_of(&dir, &downward, "main", 0);
        async move { log.contains("CPU_LIMIT").then_some(log) }
    })
    .await;
    assert_eq!(
        log.trim(),
        format!(
            "CPU_LIMIT={node_cpu} NODE={node_name} UID={}",
            downward.uid().unwrap()
        )
    );

    // --- Memory-backed emptyDir: a tmpfs of the right size, mode 0777, surviving a container
    // restart, unmounted when the pod goes.
    let mem = ready(&pods, "mem", Duration::from_secs(30)).await;
    let (_, mounts) = exec(&faults, "mem", "main", "cat /proc/mounts").await;
    let mount_of = |target: &str| {
        mounts
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(target))
            .map(str::to_string)
    };
    let small = mount_of("/small").expect("/small mounted");
    assert!(small.starts_with("tmpfs /small tmpfs "), "{small}");
    assert!(small.contains("size=16384k"), "{small}");
    let bounded = mount_of("/bounded").expect("/bounded mounted");
    assert!(bounded.starts_with("tmpfs /bounded tmpfs "), "{bounded}");
    assert!(
        bounded.contains("size=49152k"),
        "pod memory limit: {bounded}"
    );
    let disk = mount_of("/disk").expect("/disk mounted");
    assert!(!disk.starts_with("tmpfs "), "{disk}");
    let (_, modes) = exec(
        &faults,
        "mem",
        "main",
        "stat -c %a /small /bounded /disk; echo kept > /small/f",
    )
    .await;
    assert_eq!(modes.split_whitespace().collect::<Vec<_>>(), ["777"; 3]);
    faults.kill_container(NS, "mem", "main").unwrap();
    wait_for("mem restarted", Duration::from_secs(30), || async {
        let p = pods.get("mem").await.ok()?;
        let s = status_of(&p, "main")?;
        (s.restart_count == 1 && s.ready).then_some(())
    })
    .await;
    let (_, kept) = exec(&faults, "mem", "main", "cat /small/f").await;
    assert_eq!(
        kept, "kept",
        "a memory emptyDir survives container restarts"
    );
    let mem_dir = dir.join("kubelet/pods").join(mem.uid().unwrap());
    let mem_mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(mem_dir.to_string_lossy().as_ref()))
            .count()
    };
    assert_eq!(mem_mounts(), 2, "two tmpfs mounts on the host side");
    pods.delete("mem", &DeleteParams::default()).await.unwrap();
    wait_for("mem gone", Duration::from_secs(30), || async {
        matches!(pods.get_opt("mem").await, Ok(None)).then_some(())
    })
    .await;
    assert_eq!(mem_mounts(), 0, "tmpfs unmounted at teardown");
    assert!(!mem_dir.join("volumes").exists(), "volumes removed");

    // --- securityContext.
    let sec = ready(&pods, "sec", Duration::from_secs(60)).await;
    let log = wait_for("sec logs", Duration::from_secs(10), || {
        let a = log_of(&dir, &sec, "pod-level", 0);
        let b = log_of(&dir, &sec, "override", 0);
        async move { (a.contains("IDS") && b.contains("IDS")).then_some((a, b)) }
    })
    .await;
    let ids = |line: &str| {
        let mut w: Vec<&str> = line.split_whitespace().skip(1).collect();
        let head: Vec<String> = w.drain(..2).map(str::to_string).collect();
        let groups: BTreeSet<String> = w.into_iter().map(str::to_string).collect();
        (head, groups)
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        ids(log.0.trim()),
        (
            vec!["1000".into(), "3000".into()],
            set(&["2000", "3000", "4000"])
        )
    );
    assert_eq!(
        ids(log.1.trim()),
        (
            vec!["1001".into(), "3001".into()],
            set(&["2000", "3001", "4000"])
        )
    );
    let (code, out) = exec(
        &faults,
        "sec",
        "pod-level",
        "echo $(id -u) $(id -g) $(cat /data/hook-uid); stat -L -c '%g %a' /data /data/by-main /info/name; \
         touch /claim/f && stat -c '%g' /claim /claim/f",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "1000 3000 1000",
            "2000 2777",
            "2000 644",
            "2000 644",
            "2000",
            "2000"
        ],
        "exec and hook ids; fsGroup on emptyDir, downwardAPI and claim"
    );
    let (_, out) = exec(&faults, "sec", "override", "id -u; id -g").await;
    assert_eq!(out, "1001\n3001");

    let nonroot = wait_for(
        "nonroot CreateContainerConfigError",
        Duration::from_secs(30),
        || async {
            let p = pods.get("nonroot").await.ok()?;
            let w = status_of(&p, "main")?.state?.waiting?;
            (w.reason.as_deref() == Some("CreateContainerConfigError")).then_some((p, w))
        },
    )
    .await;
    assert_eq!(
        nonroot.1.message.unwrap(),
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"nonroot_{NS}({})\", container: main)",
            nonroot.0.uid().unwrap()
        )
    );

    // --- Init container retried with back-off, then the pod starts.
    let st = pending.status.as_ref().unwrap();
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    let initialized = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Initialized")
        .unwrap();
    assert_eq!(
        (initialized.status.as_str(), initialized.reason.as_deref()),
        ("False", Some("ContainersNotInitialized"))
    );
    let flaky = status_of(&pending, "flaky").unwrap();
    assert_eq!(
        flaky
            .last_state
            .and_then(|s| s.terminated)
            .map(|t| t.exit_code),
        Some(1)
    );
    let main = status_of(&pending, "main").unwrap();
    assert_eq!(
        main.state.unwrap().waiting.unwrap().reason.as_deref(),
        Some("PodInitializing")
    );
    let started = ready(&pods, "init-retry", Duration::from_secs(30)).await;
    assert_eq!(status_of(&started, "flaky").unwrap().restart_count, 2);

    // --- Jobs.
    let job_state = |name: &'static str, cond: &'static str| {
        let jobs = jobs.clone();
        async move {
            wait_for(
                &format!("job {name} {cond}"),
                Duration::from_secs(60),
                || async {
                    let j = jobs.get(name).await.ok()?;
                    job_condition(&j, cond).map(|c| (j, c))
                },
            )
            .await
        }
    };
    let (ok, _) = job_state("job-ok", "Complete").await;
    assert_eq!(ok.status.unwrap().succeeded, Some(1));
    let (retry, _) = job_state("job-retry", "Complete").await;
    assert_eq!(retry.status.unwrap().succeeded, Some(1));
    let retry_pods = pods
        .list(&ListParams::default().labels("job-name=job-retry"))
        .await
        .unwrap()
        .items;
    assert_eq!(retry_pods.len(), 1, "OnFailure retries in the same pod");
    assert!(status_of(&retry_pods[0], "main").unwrap().restart_count >= 1);
    let (failed, (_, reason)) = job_state("job-fail", "Failed").await;
    assert_eq!(reason.as_deref(), Some("BackoffLimitExceeded"));
    assert_eq!(failed.status.unwrap().failed, Some(2));
    let failed_pods = pods
        .list(&ListParams::default().labels("job-name=job-fail"))
        .await
        .unwrap()
        .items;
    assert_eq!(failed_pods.len(), 2);
    assert!(
        failed_pods
            .iter()
            .all(|p| p.status.as_ref().unwrap().phase.as_deref() == Some("Failed"))
    );

    // --- Deployment rollout: a template change → a new ReplicaSet takes over, old pods go.
    let rollout_done = |version: &'static str| {
        let deployments = deployments.clone();
        let pods = pods.clone();
        async move {
            wait_for(
                &format!("rollout of {version}"),
                Duration::from_secs(60),
                || async {
                    let d = deployments.get("roll").await.ok()?;
                    let st = d.status.clone()?;
                    let done = st.observed_generation >= d.metadata.generation
                        && st.updated_replicas == Some(2)
                        && st.replicas == Some(2)
                        && st.available_replicas == Some(2);
                    let list = pods
                        .list(&ListParams::default().labels("app=roll"))
                        .await
                        .ok()?
                        .items;
                    let current = list.len() == 2
                        && list.iter().all(|p| {
                            pod_ready(p)
                                && p.metadata.deletion_timestamp.is_none()
                                && p.spec.as_ref().unwrap().containers[0].env.as_ref().unwrap()[0]
                                    .value
                                    .as_deref()
                                    == Some(version)
                        });
                    (done && current).then_some(d)
                },
            )
            .await
        }
    };
    let d1 = rollout_done("v1").await;
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let old_rs = rss
        .list(&ListParams::default().labels("app=roll"))
        .await
        .unwrap()
        .items;
    assert_eq!(old_rs.len(), 1);
    let old_pods: BTreeSet<String> = pods
        .list(&ListParams::default().labels("app=roll"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    let t_roll = Instant::now();
    deployments
        .patch(
            "roll",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
                {"name": "main", "env": [{"name": "VERSION", "value": "v2"}]}]}}}})),
        )
        .await
        .unwrap();
    let d2 = rollout_done("v2").await;
    eprintln!(
        "MEASURE Deployment rollout of 2 replicas: {} ms",
        t_roll.elapsed().as_millis()
    );
    assert!(d2.metadata.generation > d1.metadata.generation);
    let progressing = d2
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_.as_deref() == Some("Progressing"))
        .unwrap();
    assert_eq!(
        progressing.reason.as_deref(),
        Some("NewReplicaSetAvailable")
    );
    let all_rs = rss
        .list(&ListParams::default().labels("app=roll"))
        .await
        .unwrap()
        .items;
    assert_eq!(all_rs.len(), 2);
    for rs in &all_rs {
        let old = rs.name_any() == old_rs[0].name_any();
        let want = if old { 0 } else { 2 };
        assert_eq!(rs.spec.replicas, Some(want));
        assert_eq!(rs.status.as_ref().unwrap().replicas, want);
    }
    wait_for("old pods deleted", Duration::from_secs(30), || async {
        let names: BTreeSet<String> = pods
            .list(&ListParams::default().labels("app=roll"))
            .await
            .ok()?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        (names.len() == 2 && names.is_disjoint(&old_pods)).then_some(())
    })
    .await;
    eprintln!(
        "MEASURE conformance cases: {} ms",
        t_cases.elapsed().as_millis()
    );

    env.stop().await;
}
