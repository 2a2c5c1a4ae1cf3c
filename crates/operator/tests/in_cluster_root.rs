//! Needs root (localkube runs pods as processes). The operator **as a pod**, installed from
//! `deploy/crds/` and `deploy/operator.yaml` unchanged with `kubectl apply`, on a full
//! localkube (real kube-apiserver with RBAC, controller-manager, scheduler, process pods):
//!
//! * the image `valkey-operator:latest` maps to this crate's binary (localkube's image table,
//!   entrypoint and command as in `deploy/Dockerfile`);
//! * the pod reaches the API server through `KUBERNETES_SERVICE_HOST`/`PORT` and authenticates
//!   with its projected service-account token (kube-rs' in-cluster config), takes the
//!   leader-election Lease and turns Ready on `/readyz`;
//! * it brings a 3×1 ValkeyCluster to Ready with the manifest's RBAC alone;
//! * with `patch` on PodDisruptionBudgets taken out of its ClusterRole, a new cluster reports
//!   `Ready=False` with reason `PodDisruptionBudgetError` and the API server's words (which
//!   verb on which resource is forbidden to which ServiceAccount, and where to grant it); with
//!   the verb given back, that cluster becomes Ready.
//!
//! And the Helm chart `deploy/helm/valkey-operator` installed with `helm install` (defaults):
//! two operator pods, both Ready, one holding the Lease; a 1×1 cluster Ready; the leader pod
//! deleted, the standby takes the Lease and carries out a scale-out. With `watchNamespace`, the
//! operator serves that namespace only, with a Role there.
//!
//! Every namespace here enforces the restricted Pod Security Standard: the operator's pods
//! (manifest and chart) and the Valkey and config-check pods it renders all meet it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::Value;
use valkey_api::ValkeyCluster;
use valkey_api::status::{ClusterState, reason};
use valkey_testkit::eventually;

const NAMESPACE: &str = "valkey-operator";
const APPS: &str = "apps";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let bin = localkube::runtime::images::default_bin_cache().join("kubectl");
    let mut child = Command::new(bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl (install it with `bash hack/install-deps.sh`)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.unwrap_or_default().as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ValkeyCluster `name` in namespace `apps` and its app user's Secret.
fn cluster_yaml(name: &str, shards: u32, replicas: u32) -> String {
    cluster_yaml_in(APPS, name, shards, replicas)
}

/// The ValkeyCluster `name` in `ns` and its app user's Secret (`shards` × `replicas`).
fn cluster_yaml_in(ns: &str, name: &str, shards: u32, replicas: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: {name}-app, namespace: {ns}}}
stringData: {{password: app-password}}
---
apiVersion: valkey.io/v1alpha1
kind: ValkeyCluster
metadata: {{name: {name}, namespace: {ns}}}
spec:
  shards: {shards}
  replicas: {replicas}
  image: valkey/valkey:9.0.0
  users:
    - name: app
      passwordSecret: {{name: {name}-app, keys: [password]}}
      permissions: "+@all ~* &*"
"#
    )
}

async fn status_of(client: &Client, name: &str) -> Option<valkey_api::ValkeyClusterStatus> {
    Api::<ValkeyCluster>::namespaced(client.clone(), APPS)
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .status
}

/// The `rules` of the operator's ClusterRole in `deploy/operator.yaml`, as JSON.
fn cluster_role_rules(kubeconfig: &Path) -> Value {
    let role: Value = serde_json::from_str(&kubectl(
        kubeconfig,
        &["get", "clusterrole", "valkey-operator", "-o", "json"],
        None,
    ))
    .expect("ClusterRole JSON");
    role["rules"].clone()
}

fn set_cluster_role_rules(kubeconfig: &Path, rules: &Value) {
    let patch = serde_json::json!({ "rules": rules }).to_string();
    kubectl(
        kubeconfig,
        &[
            "patch",
            "clusterrole",
            "valkey-operator",
            "--type",
            "merge",
            "-p",
            &patch,
        ],
        None,
    );
}

/// A full localkube (3 nodes) whose image table maps `valkey-operator:*` to this crate's
/// binary, as `deploy/Dockerfile` runs it (entrypoint the binary, command `run`). The
/// returned directory holds the table.
///
/// The tests of this file run one at a time (the guard is held until the test ends): several
/// localkube environments started at once in one process can race for a free port.
async fn start_localkube() -> (
    localkube::Env,
    tempfile::TempDir,
    tokio::sync::MutexGuard<'static, ()>,
) {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = ONE_AT_A_TIME.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("tempdir");
    let table = dir.path().join("images.yaml");
    std::fs::write(
        &table,
        format!(
            "includeDefaults: true\nimages:\n  - name: valkey-operator\n    patterns: [\"valkey-operator:*\"]\n    links: {{valkey-operator: {}}}\n    entrypoint: [valkey-operator]\n    cmd: [run]\n",
            env!("CARGO_BIN_EXE_valkey-operator")
        ),
    )
    .expect("image table");
    let t0 = Instant::now();
    let env = localkube::Env::start(localkube::Options {
        nodes: 3,
        zones: 3,
        image_table: Some(table),
        ..Default::default()
    })
    .await
    .expect("localkube");
    eprintln!(
        "MEASURE localkube start: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    (env, dir, guard)
}

/// The operator pods that are Ready.
async fn ready_operator_pods(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    let Ok(list) = pods.list(&ListParams::default().labels(selector)).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect()
}

/// The holder of the operator's Lease in `namespace`.
async fn lease_holder(client: &Client, namespace: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let list = leases.list(&ListParams::default()).await.ok()?;
    list.items.into_iter().find_map(|l| l.spec?.holder_identity)
}

/// Creates namespace `ns` enforcing the restricted Pod Security Standard (as production
/// clusters often do): every pod the chart, the manifest or the operator renders must meet it.
fn create_restricted_namespace(kubeconfig: &Path, ns: &str) {
    kubectl(kubeconfig, &["create", "namespace", ns], None);
    kubectl(
        kubeconfig,
        &[
            "label",
            "namespace",
            ns,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
}

/// `helm install valkey-operator` of the chart with `extra` arguments, into a namespace that
/// enforces the restricted Pod Security Standard; returns the two operator pods once both are
/// Ready.
async fn helm_install(client: &Client, kubeconfig: &Path, extra: &[&str]) -> Vec<Pod> {
    create_restricted_namespace(kubeconfig, NAMESPACE);
    let helm = localkube::runtime::images::default_bin_cache().join("helm");
    let out = Command::new(&helm)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["install", "valkey-operator"])
        .arg(repo().join("deploy/helm/valkey-operator"))
        .args(["--namespace", NAMESPACE])
        .args(extra)
        .output()
        .expect("helm (install it with `bash hack/install-deps.sh helm`)");
    assert!(
        out.status.success(),
        "helm install: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    eventually("two operator pods Ready", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let r = ready_operator_pods(&pods, "app.kubernetes.io/name=valkey-operator").await;
            (r.len() == 2).then_some(r)
        }
    })
    .await
}

/// Waits until ValkeyCluster `name` is Ready; returns how long it took.
async fn wait_cluster_ready(client: &Client, name: &str, timeout: Duration) -> Duration {
    let t = Instant::now();
    eventually(&format!("{name} Ready"), timeout, || {
        let client = client.clone();
        async move {
            let s = status_of(&client, name).await?;
            (s.state == ClusterState::Ready).then_some(())
        }
    })
    .await;
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_root_operator_pod_from_deploy_manifests() {
    let (env, _table, _one_at_a_time) = start_localkube().await;
    let kubeconfig = env.kubeconfig_path();
    let client = env.client();

    // Install exactly what a user applies.
    let t = Instant::now();
    let crds = repo().join("deploy/crds");
    kubectl(
        &kubeconfig,
        &["apply", "--server-side", "-f", crds.to_str().expect("path")],
        None,
    );
    kubectl(&kubeconfig, &common::WAIT_CRDS_ESTABLISHED, None);
    let manifest = repo().join("deploy/operator.yaml");
    kubectl(
        &kubeconfig,
        &["apply", "-f", manifest.to_str().expect("path")],
        None,
    );

    // The operator pod: Running, Ready (leader), holding the Lease.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = eventually("the operator pod Ready", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            ready_operator_pods(&pods, "app.kubernetes.io/name=valkey-operator")
                .await
                .into_iter()
                .next()
        }
    })
    .await;
    let pod_name = pod.metadata.name.clone().expect("name");
    eprintln!(
        "MEASURE operator pod Ready: {:.1}s after apply",
        t.elapsed().as_secs_f64()
    );
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("valkey-operator")
    );
    let token_volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .expect("the projected service-account token volume the API server adds");
    assert!(token_volume.projected.is_some());
    let holder = eventually("the Lease held by the pod", Duration::from_secs(30), || {
        let client = client.clone();
        async move { lease_holder(&client, NAMESPACE).await }
    })
    .await;
    // The identity is `<POD_NAME>_<pid>_<random>`.
    assert!(
        holder.starts_with(&format!("{pod_name}_")),
        "the Lease is held by {holder}, not by {pod_name}"
    );

    // A 3×1 cluster, reconciled by the pod alone.
    create_restricted_namespace(&kubeconfig, APPS);
    kubectl(
        &kubeconfig,
        &["apply", "-f", "-"],
        Some(&cluster_yaml("c1", 3, 1)),
    );
    let took = wait_cluster_ready(&client, "c1", Duration::from_secs(240)).await;
    eprintln!(
        "MEASURE 3x1 apply→Ready with the operator in-cluster: {:.1}s",
        took.as_secs_f64()
    );
    let status = status_of(&client, "c1").await.expect("c1 status");
    assert_eq!(status.shards, 3);
    assert_eq!(status.ready_shards, 3);

    // The optional NetworkPolicy, with the chart's role: created, owned by the cluster,
    // the cluster stays Ready; deleted when turned off. (localkube enforces no policy.)
    let policies =
        Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(client.clone(), APPS);
    let set_policy = |enabled: bool| {
        let patch = serde_json::json!({"spec": {"networking": {"networkPolicy": {
            "enabled": enabled,
            "clients": [{"podSelector": {"matchLabels": {"app": "shop"}}}],
        }}}});
        let clusters = Api::<ValkeyCluster>::namespaced(client.clone(), APPS);
        async move {
            clusters
                .patch(
                    "c1",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
                .expect("set networking.networkPolicy.enabled");
        }
    };
    set_policy(true).await;
    let policy = eventually("the NetworkPolicy of c1", Duration::from_secs(60), || {
        let policies = policies.clone();
        async move { policies.get_opt("valkey-c1").await.ok().flatten() }
    })
    .await;
    assert!(
        policy
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "ValkeyCluster" && o.name == "c1"),
        "{:?}",
        policy.metadata
    );
    let ingress = policy.spec.and_then(|s| s.ingress).unwrap_or_default();
    assert_eq!(ingress.len(), 3, "own pods, the operator, the clients");
    eventually(
        "c1 Ready at its new generation",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let vc = Api::<ValkeyCluster>::namespaced(client, APPS)
                    .get("c1")
                    .await
                    .ok()?;
                let s = vc.status?;
                (s.state == ClusterState::Ready && s.observed_generation == vc.metadata.generation)
                    .then_some(())
            }
        },
    )
    .await;
    set_policy(false).await;
    eventually(
        "the NetworkPolicy of c1 deleted",
        Duration::from_secs(60),
        || {
            let policies = policies.clone();
            async move { matches!(policies.get_opt("valkey-c1").await, Ok(None)).then_some(()) }
        },
    )
    .await;

    // Take `patch` on PodDisruptionBudgets away: a new cluster says what is forbidden.
    let rules = cluster_role_rules(&kubeconfig);
    let mut fewer = rules.clone();
    for r in fewer.as_array_mut().expect("rules") {
        if r["resources"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "poddisruptionbudgets"))
        {
            let verbs = r["verbs"].as_array_mut().expect("verbs");
            verbs.retain(|v| v != "patch");
        }
    }
    assert_ne!(fewer, rules);
    set_cluster_role_rules(&kubeconfig, &fewer);
    kubectl(
        &kubeconfig,
        &["apply", "-f", "-"],
        Some(&cluster_yaml("c2", 1, 0)),
    );
    let t = Instant::now();
    let refused = eventually(
        "c2 reporting the forbidden PodDisruptionBudget patch",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            async move {
                let s = status_of(&client, "c2").await?;
                let ready = s.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
                (ready.reason == reason::PDB_ERROR).then_some(ready)
            }
        },
    )
    .await;
    eprintln!(
        "MEASURE forbidden verb reported in {:.1}s: {}",
        t.elapsed().as_secs_f64(),
        refused.message
    );
    assert_eq!(refused.status, "False");
    for words in [
        "forbidden",
        "system:serviceaccount:valkey-operator:valkey-operator",
        "patch",
        "poddisruptionbudgets",
        "grant it in the operator's ClusterRole",
    ] {
        assert!(
            refused.message.contains(words),
            "{words:?} not in {:?}",
            refused.message
        );
    }
    assert!(!refused.message.contains("Status {"), "{}", refused.message);

    // The verb given back: c2 becomes Ready without anything else changing.
    set_cluster_role_rules(&kubeconfig, &rules);
    let took = wait_cluster_ready(&client, "c2", Duration::from_secs(180)).await;
    eprintln!(
        "MEASURE c2 Ready {:.1}s after the ClusterRole was restored",
        took.as_secs_f64()
    );
    // The operator pod never restarted.
    let pod = pods.get(&pod_name).await.expect("operator pod");
    let restarts: i32 = pod
        .status
        .and_then(|s| s.container_statuses)
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .sum();
    assert_eq!(restarts, 0, "the operator pod restarted");
    env.stop().await;
}

/// The Helm chart installed as a user would (`helm install`, the image mapped as above): two
/// operator pods, both Ready (the leader, and a standby whose `/readyz` says `standby`), one
/// holding the Lease; a 1×1 cluster Ready; the leader pod deleted, the standby takes the Lease
/// and serves a scale-out of the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_root_operator_pods_from_the_helm_chart() {
    let (env, _table, _one_at_a_time) = start_localkube().await;
    let kubeconfig = env.kubeconfig_path();
    let client = env.client();
    let t = Instant::now();
    let ready = helm_install(&client, &kubeconfig, &[]).await;
    eprintln!(
        "MEASURE helm install → both operator pods Ready: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let names: Vec<String> = ready
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let holder = eventually("the Lease held", Duration::from_secs(30), || {
        let client = client.clone();
        async move { lease_holder(&client, NAMESPACE).await }
    })
    .await;
    let leader = names
        .iter()
        .find(|n| holder.starts_with(&format!("{n}_")))
        .unwrap_or_else(|| panic!("the Lease holder {holder} is none of {names:?}"))
        .clone();

    create_restricted_namespace(&kubeconfig, APPS);
    kubectl(
        &kubeconfig,
        &["apply", "-f", "-"],
        Some(&cluster_yaml("h1", 1, 1)),
    );
    let took = wait_cluster_ready(&client, "h1", Duration::from_secs(240)).await;
    eprintln!(
        "MEASURE 1x1 apply→Ready with the chart's operator: {:.1}s",
        took.as_secs_f64()
    );

    // The leader goes: the standby takes over and reconciles.
    let t = Instant::now();
    kubectl(
        &kubeconfig,
        &["delete", "pod", "-n", NAMESPACE, &leader, "--wait=false"],
        None,
    );
    let new_holder = eventually(
        "the standby holding the Lease",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let leader = leader.clone();
            async move {
                let h = lease_holder(&client, NAMESPACE).await?;
                (!h.starts_with(&format!("{leader}_"))).then_some(h)
            }
        },
    )
    .await;
    eprintln!(
        "MEASURE leader pod deleted → Lease taken by {new_holder}: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        names
            .iter()
            .any(|n| new_holder.starts_with(&format!("{n}_"))),
        "the new holder {new_holder} is not the standby of {names:?}"
    );
    kubectl(
        &kubeconfig,
        &[
            "patch",
            "valkeycluster",
            "h1",
            "-n",
            APPS,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"shards":2}}"#,
        ],
        None,
    );
    // The status shows the new shard count once the new leader acted on it.
    eventually("h1 Ready with 2 shards", Duration::from_secs(240), || {
        let client = client.clone();
        async move {
            let s = status_of(&client, "h1").await?;
            (s.state == ClusterState::Ready && s.shards == 2).then_some(())
        }
    })
    .await;
    eprintln!(
        "MEASURE scale-out 1→2 shards by the new leader: {:.1}s after the leader pod was deleted",
        t.elapsed().as_secs_f64()
    );
    env.stop().await;
}

/// The chart with `watchNamespace=apps`: the operator's rights on namespaced objects are a Role
/// in `apps`. A cluster there becomes Ready; a cluster in `other` is not served (no status, no
/// ValkeyNodes); the ServiceAccount cannot read Secrets in `other`; and the operator's log
/// (read with `kubectl logs`) has no refused request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_root_operator_scoped_to_one_namespace() {
    let (env, _table, _one_at_a_time) = start_localkube().await;
    let kubeconfig = env.kubeconfig_path();
    let client = env.client();
    for ns in [APPS, "other"] {
        create_restricted_namespace(&kubeconfig, ns);
    }
    let ready = helm_install(&client, &kubeconfig, &["--set", "watchNamespace=apps"]).await;
    kubectl(
        &kubeconfig,
        &["apply", "-f", "-"],
        Some(&cluster_yaml_in("other", "o1", 1, 0)),
    );
    kubectl(
        &kubeconfig,
        &["apply", "-f", "-"],
        Some(&cluster_yaml("w1", 1, 1)),
    );
    let took = wait_cluster_ready(&client, "w1", Duration::from_secs(240)).await;
    eprintln!(
        "MEASURE 1x1 Ready with the operator scoped to its namespace: {:.1}s",
        took.as_secs_f64()
    );
    let other: Api<ValkeyCluster> = Api::namespaced(client.clone(), "other");
    let o1 = other.get("o1").await.expect("o1");
    assert!(o1.status.is_none(), "o1 was served: {:?}", o1.status);
    let nodes: Api<valkey_api::ValkeyNode> = Api::namespaced(client.clone(), "other");
    assert!(
        nodes
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    let sa = format!("system:serviceaccount:{NAMESPACE}:valkey-operator");
    let can = |verb: &str, resource: &str, ns: &str| {
        let out = Command::new(localkube::runtime::images::default_bin_cache().join("kubectl"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["auth", "can-i", verb, resource, "-n", ns, "--as", &sa])
            .output()
            .expect("kubectl auth can-i");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(can("list", "secrets", "other"), "no");
    assert_eq!(can("list", "secrets", APPS), "yes");
    assert_eq!(can("create", "statefulsets.apps", "other"), "no");
    for p in &ready {
        let name = p.metadata.name.as_deref().expect("name");
        let log = kubectl(&kubeconfig, &["logs", "-n", NAMESPACE, name], None);
        assert!(
            !log.contains("forbidden"),
            "{name} logged a refused request:\n{log}"
        );
        assert!(log.contains("namespace apps"), "{name}: {log}");
    }
    env.stop().await;
}
