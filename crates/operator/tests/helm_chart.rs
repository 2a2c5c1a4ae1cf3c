//! The Helm chart `deploy/helm/valkey-operator`, checked with the real `helm` binary (built by
//! `bash hack/install-deps.sh helm`; a missing one fails the test with that command):
//!
//! * its CRDs are byte-for-byte the generated `deploy/crds/`;
//! * `helm lint --strict` passes with the default values and with every optional feature on;
//! * `helm template` renders the RBAC of `deploy/operator.yaml`, a Deployment whose arguments
//!   this crate's binary accepts and whose probes are the operator's endpoints; the monitoring
//!   objects render only when enabled and select what the operator really creates;
//! * every metric of the PrometheusRule is one the operator exports (its registry, filled) or a
//!   real redis_exporter exports (scraped from two Valkey servers, a primary and its replica);
//! * `helm install` on a real kube-apiserver (localkube, apiserver only) creates everything, and
//!   the operator binary, run with the installed Deployment's arguments as its ServiceAccount,
//!   takes the Lease and writes a ValkeyCluster's children with the chart's RBAC alone.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use valkey_api::labels;
use valkey_api::status::ClusterState;
use valkey_operator::metrics::Metrics;
use valkey_operator::render::{config_check, names};
use valkey_testkit::promql::{self, Samples, parse_exposition};
use valkey_testkit::{Flavor, Server, bins, form_cluster, free_port, operator_pool};

const CHART: &str = "deploy/helm/valkey-operator";
const RELEASE: &str = "valkey-operator";
const NAMESPACE: &str = "valkey-operator";
/// Values turning every optional feature on.
const ALL_FEATURES: &str = "ci/all-features-values.yaml";
const MONITORING_KINDS: [&str; 3] = ["ServiceMonitor", "PodMonitor", "PrometheusRule"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn chart() -> PathBuf {
    repo().join(CHART)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A binary `hack/install-deps.sh STEP` installs: in the cache's bin directory
/// (`LOCALKUBE_BIN_DIR`), else on `PATH`. Missing, the test fails naming the step.
fn installed(name: &str, step: &str) -> PathBuf {
    std::iter::once(bins::bin_dir())
        .chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no `{name}` binary in {} or on PATH: install it with `bash hack/install-deps.sh {step}`",
                bins::bin_dir().display()
            )
        })
}

/// `helm` with its cache, configuration and data in a private directory.
fn helm() -> Command {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    let home = HOME.get_or_init(|| tempfile::tempdir().expect("tempdir"));
    let mut c = Command::new(installed("helm", "helm"));
    c.env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"));
    c
}

fn kubectl(kubeconfig: &Path) -> Command {
    let mut c = Command::new(installed("kubectl", "kube"));
    c.arg("--kubeconfig").arg(kubeconfig);
    c
}

/// Runs `cmd` (with `stdin` as its input), panics with its stderr when it fails; its stdout.
fn run_with(cmd: &mut Command, stdin: Option<&str>) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("stdin");
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).expect("write stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn run(cmd: &mut Command) -> String {
    run_with(cmd, None)
}

/// The documents of a multi-document YAML text (comment-only documents skipped).
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| serde_saphyr::from_str(d).unwrap_or_else(|e| panic!("{e}:\n{d}")))
        .collect()
}

/// `helm template` of the chart as release `valkey-operator` in namespace `valkey-operator`.
fn render(args: &[&str]) -> Vec<Value> {
    documents(&run(helm()
        .args(["template", RELEASE])
        .arg(chart())
        .args(["--namespace", NAMESPACE])
        .args(args)))
}

fn kinds(docs: &[Value]) -> Vec<&str> {
    let mut k: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    k.sort_unstable();
    k
}

fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let mut it = docs.iter().filter(|d| d["kind"] == kind);
    let d = it.next().unwrap_or_else(|| panic!("no {kind}"));
    assert!(it.next().is_none(), "more than one {kind}");
    d
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|a| a.as_str().expect("a string").to_owned())
        .collect()
}

/// Whether every `key: value` of `subset` (an object) is in `labels`.
fn selects(subset: &Value, labels: &Value) -> bool {
    let subset = subset.as_object().expect("a label map");
    !subset.is_empty() && subset.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn map_value(m: &BTreeMap<String, String>) -> Value {
    serde_json::to_value(m).expect("labels")
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

/// The value following `flag` in `args`.
fn flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// This crate's binary accepts `args` (`--help` after them: an unknown flag or a bad value
/// fails the parse).
fn assert_binary_accepts(args: &[String]) {
    let out = Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "the binary rejects the chart's arguments {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Status code and body of `GET path` on loopback `port`.
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let code = buf
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad HTTP answer {buf:?}")))?;
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((code, body))
}

/// Polls `f` every 100 ms until it returns `Some` (panics with `what` after `timeout`).
fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out ({timeout:?}) waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ------------------------------------------------------------------------------ files, lint

#[test]
fn chart_crds_are_the_generated_ones() {
    let list = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect()
    };
    let generated = repo().join("deploy/crds");
    let copies = chart().join("crds");
    assert_eq!(
        list(&copies),
        list(&generated),
        "the chart's crds/ must hold exactly the files of deploy/crds/"
    );
    for name in list(&generated) {
        assert!(
            std::fs::read(copies.join(&name)).ok() == std::fs::read(generated.join(&name)).ok(),
            "{CHART}/crds/{name} differs from deploy/crds/{name}: \
             run `cp deploy/crds/*.yaml {CHART}/crds/`"
        );
    }
    // Helm carries them unchanged.
    let crds: Vec<Value> = render(&["--include-crds"])
        .into_iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let mut expected: Vec<Value> = list(&generated)
        .iter()
        .flat_map(|n| documents(&read(&format!("deploy/crds/{n}"))))
        .collect();
    let by_name = |d: &Value| {
        d["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let mut crds = crds;
    crds.sort_by_key(by_name);
    expected.sort_by_key(by_name);
    assert_eq!(crds, expected);
}

#[test]
fn lint_strict_with_defaults_and_with_every_feature() {
    run(helm().args(["lint", "--strict"]).arg(chart()));
    let all = chart().join(ALL_FEATURES);
    let values: Value =
        serde_saphyr::from_str(&read(&format!("{CHART}/{ALL_FEATURES}"))).expect("values YAML");
    for feature in ["serviceMonitor", "podMonitor", "prometheusRule"] {
        assert_eq!(
            values[feature]["enabled"], true,
            "{ALL_FEATURES}: {feature}"
        );
    }
    run(helm()
        .args(["lint", "--strict", "--values"])
        .arg(&all)
        .arg(chart()));
    // The values schema refuses a misspelled key and a log format the binary does not know.
    for bad in ["replica=3", "logFormat=xml"] {
        let out = helm()
            .args(["lint", "--strict", "--set", bad])
            .arg(chart())
            .output()
            .expect("helm lint");
        assert!(!out.status.success(), "helm lint accepted --set {bad}");
    }
}

// ------------------------------------------------------------------------------ rendering

#[test]
fn default_render_is_deploy_operator_yaml_for_helm() {
    let docs = render(&[]);
    assert_eq!(
        kinds(&docs),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ],
        "the defaults render no monitoring objects"
    );
    let manifest = documents(&read("deploy/operator.yaml"));

    // RBAC: exactly deploy/operator.yaml's rules, bound to the chart's ServiceAccount.
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(
            one(&docs, kind)["rules"],
            one(&manifest, kind)["rules"],
            "{kind} rules differ from deploy/operator.yaml"
        );
    }
    let sa = one(&docs, "ServiceAccount")["metadata"]["name"].clone();
    for (binding, role) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        let b = one(&docs, binding);
        assert_eq!(b["roleRef"]["kind"], role);
        assert_eq!(b["roleRef"]["name"], one(&docs, role)["metadata"]["name"]);
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}])
        );
    }
    assert_eq!(one(&docs, "Role")["metadata"]["namespace"], NAMESPACE);

    let d = one(&docs, "Deployment");
    let pod = &d["spec"]["template"];
    assert_eq!(d["spec"]["replicas"], 2);
    assert!(selects(
        &d["spec"]["selector"]["matchLabels"],
        &pod["metadata"]["labels"]
    ));
    assert_eq!(pod["spec"]["serviceAccountName"], sa);
    assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    let c = container(d);
    assert_eq!(
        c["securityContext"],
        container(one(&manifest, "Deployment"))["securityContext"],
        "container securityContext differs from deploy/operator.yaml"
    );
    assert_eq!(
        c["image"],
        format!("valkey-operator:{}", env!("CARGO_PKG_VERSION")),
        "the default tag (the chart's appVersion) is this crate's version"
    );
    let field_refs: BTreeMap<&str, &str> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?,
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str()?,
            ))
        })
        .collect();
    assert_eq!(field_refs.get("POD_NAME"), Some(&"metadata.name"));
    assert_eq!(field_refs.get("POD_NAMESPACE"), Some(&"metadata.namespace"));

    // The arguments: leader election on, and accepted by this crate's binary (`--help` after
    // them: an unknown flag or a bad value fails the parse).
    let args = strings(&c["args"]);
    assert_eq!(args.first().map(String::as_str), Some("run"));
    assert!(args.iter().any(|a| a == "--leader-elect"), "{args:?}");
    assert_binary_accepts(&args);

    // Probes: the operator's routes (crates/operator/src/http.rs), on the port it listens on.
    let http = read("crates/operator/src/http.rs");
    let listen_port: i64 = flag(&args, "--metrics-address")
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .expect("--metrics-address host:port");
    let ports = c["ports"].as_array().expect("ports");
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert!(
            http.contains(&format!(".route(\"{path}\"")),
            "http.rs serves no {path}"
        );
        let port = ports
            .iter()
            .find(|p| p["name"] == get["port"])
            .unwrap_or_else(|| panic!("{probe} names no container port"));
        assert_eq!(port["containerPort"], listen_port, "{probe}");
    }

    // The metrics Service reaches that port on the operator's pods.
    let svc = one(&docs, "Service");
    assert!(selects(
        &svc["spec"]["selector"],
        &pod["metadata"]["labels"]
    ));
    let sp = &svc["spec"]["ports"][0];
    assert!(ports.iter().any(|p| p["name"] == sp["targetPort"]));
    assert_eq!(sp["port"], listen_port);
}

#[test]
fn watch_namespace_scopes_the_rbac_to_a_role_in_that_namespace() {
    let all = render(&[]);
    let docs = render(&["--set", "watchNamespace=apps"]);
    let run = helm()
        .args(["lint", "--strict", "--set", "watchNamespace=apps"])
        .arg(chart())
        .output()
        .expect("helm lint");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
    let manifest = documents(&read("deploy/operator.yaml"));
    let full_rules = one(&manifest, "ClusterRole")["rules"]
        .as_array()
        .expect("rules")
        .clone();
    let (cluster_rules, namespaced_rules): (Vec<Value>, Vec<Value>) =
        full_rules.into_iter().partition(|r| {
            r["apiGroups"] == json!(["apiextensions.k8s.io"]) || r["resources"] == json!(["nodes"])
        });
    // The ClusterRole keeps only the reads of cluster-scoped kinds (the CRDs, the nodes'
    // zones); a Role in `apps` has every other rule.
    assert_eq!(one(&docs, "ClusterRole")["rules"], json!(cluster_rules));
    let roles: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Role").collect();
    let scoped = roles
        .iter()
        .find(|r| r["metadata"]["namespace"] == "apps")
        .expect("a Role in apps");
    assert_eq!(scoped["rules"], json!(namespaced_rules));
    let binding = docs
        .iter()
        .find(|d| d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == "apps")
        .expect("a RoleBinding in apps");
    assert_eq!(binding["roleRef"]["name"], scoped["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount",
                "name": one(&docs, "ServiceAccount")["metadata"]["name"],
                "namespace": NAMESPACE}])
    );
    // The leader-election Role stays in the release's namespace.
    assert!(
        roles
            .iter()
            .any(|r| r["metadata"]["namespace"] == NAMESPACE)
    );
    // The flag, accepted by the binary; nothing else changes.
    let args = strings(&container(one(&docs, "Deployment"))["args"]);
    assert_eq!(flag(&args, "--watch-namespace"), Some("apps"), "{args:?}");
    assert_binary_accepts(&args);
    assert_eq!(
        strings(&container(one(&all, "Deployment"))["args"]),
        args.iter()
            .filter(|a| *a != "--watch-namespace" && *a != "apps")
            .cloned()
            .collect::<Vec<_>>()
    );
    // A name Kubernetes would refuse is refused by the values schema.
    let bad = helm()
        .args(["template", "x", "--set", "watchNamespace=Not_A_Namespace"])
        .arg(chart())
        .output()
        .expect("helm template");
    assert!(!bad.status.success());
}

#[test]
fn monitoring_objects_render_only_when_enabled_and_select_the_operators_objects() {
    for (value, kind) in [
        ("serviceMonitor", "ServiceMonitor"),
        ("podMonitor", "PodMonitor"),
        ("prometheusRule", "PrometheusRule"),
    ] {
        let docs = render(&["--set", &format!("{value}.enabled=true")]);
        for k in MONITORING_KINDS {
            let n = docs.iter().filter(|d| d["kind"] == k).count();
            assert_eq!(
                n,
                usize::from(k == kind),
                "{value}.enabled=true renders {n} {k}"
            );
        }
    }
    let all = chart().join(ALL_FEATURES);
    let docs = render(&["--values", all.to_str().expect("path")]);

    // ServiceMonitor → the metrics Service, keeping the operator's own `namespace` label.
    let svc = one(&docs, "Service");
    let sm = one(&docs, "ServiceMonitor");
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert!(selects(
        &sm["spec"]["selector"]["matchLabels"],
        &svc["metadata"]["labels"]
    ));
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"],
        json!([NAMESPACE])
    );
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["port"], svc["spec"]["ports"][0]["name"]);
    assert_eq!(ep["path"], "/metrics");
    assert_eq!(ep["honorLabels"], true);

    // PodMonitor → the Valkey pods (the labels the operator renders), not its config-check pods.
    let pm = one(&docs, "PodMonitor");
    let selector = &pm["spec"]["selector"]["matchLabels"];
    assert!(selects(
        selector,
        &map_value(&names::node_labels("c", 1, 0))
    ));
    assert!(!selects(
        selector,
        &map_value(&config_check::pod_labels("c", "f"))
    ));
    assert_eq!(pm["spec"]["namespaceSelector"], json!({"any": true}));
    let endpoint = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    let sources: BTreeSet<String> = endpoint["relabelings"]
        .as_array()
        .expect("relabelings")
        .iter()
        .flat_map(|r| strings(&r["sourceLabels"]))
        .collect();
    let sd = |l: &str| {
        format!(
            "__meta_kubernetes_pod_label_{}",
            l.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        )
    };
    assert_eq!(
        sources,
        [labels::CLUSTER, labels::SHARD_INDEX, labels::NODE_INDEX]
            .map(sd)
            .into_iter()
            .collect()
    );

    // PrometheusRule: alert labels, disabling one alert, and the exporter group.
    let alerts = |docs: &[Value]| -> Vec<String> {
        rules(one(docs, "PrometheusRule"))
            .iter()
            .map(|r| r.alert.clone())
            .collect()
    };
    let every = alerts(&docs);
    assert!(every.contains(&"ValkeyShardWithoutReplica".to_owned()));
    for r in rules(one(&docs, "PrometheusRule")) {
        assert_eq!(r.labels["team"], "storage", "{}", r.alert);
        assert!(
            ["critical", "warning", "info"].contains(&r.labels["severity"].as_str().unwrap_or("")),
            "{}",
            r.alert
        );
    }
    let base = ["--set", "prometheusRule.enabled=true"];
    let without = alerts(&render(
        &[
            &base[..],
            &["--set", "prometheusRule.disabled={ValkeyPrimaryChanged}"],
        ]
        .concat(),
    ));
    assert_eq!(without.len(), every.len() - 1);
    assert!(!without.contains(&"ValkeyPrimaryChanged".to_owned()));
    let operator_only =
        render(&[&base[..], &["--set", "prometheusRule.exporterAlerts=false"]].concat());
    assert!(
        rules(one(&operator_only, "PrometheusRule"))
            .iter()
            .all(|r| !r.expr.contains("redis_"))
    );
}

// ------------------------------------------------------------------------------ dashboard

const DASHBOARD: &str = "dashboards/valkey-cluster.json";

/// What the dashboard must show (issue 13): per-shard ops/s, memory vs maxmemory, replication
/// offset lag, connected clients, keyspace hits/misses, slot migration progress, failovers.
const DASHBOARD_METRICS: [&str; 11] = [
    "redis_commands_processed_total",
    "redis_memory_used_bytes",
    "redis_memory_max_bytes",
    "redis_master_repl_offset",
    "redis_connected_slave_offset_bytes",
    "redis_connected_clients",
    "redis_keyspace_hits_total",
    "redis_keyspace_misses_total",
    "valkey_operator_cluster_slots_to_move",
    "valkey_operator_slots_migrated_total",
    "valkey_operator_cluster_failovers_total",
];

fn dashboard() -> Value {
    serde_json::from_str(&read(&format!("{CHART}/{DASHBOARD}"))).expect("dashboard JSON")
}

/// Every panel of a dashboard (rows and the panels inside collapsed rows included).
fn all_panels(list: &Value) -> Vec<&Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| std::iter::once(p).chain(all_panels(&p["panels"])))
        .collect()
}

#[test]
fn dashboard_is_well_formed_and_shipped_by_the_chart_when_enabled() {
    let d = dashboard();
    assert_eq!(d["uid"], "valkey-cluster");
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .map(|v| v["name"].as_str().expect("variable name"))
        .collect();
    assert_eq!(vars, ["datasource", "namespace", "cluster"]);
    let panels = all_panels(&d["panels"]);
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().expect("title");
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "{title}: id taken"
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().expect("x"),
            g["y"].as_u64().expect("y"),
            g["w"].as_u64().expect("w"),
            g["h"].as_u64().expect("h"),
        );
        assert!(x + w <= 24 && w > 0 && h > 0, "{title}: gridPos {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(cells.insert((cx, cy)), "{title} overlaps another panel");
            }
        }
        if p["type"] == "row" {
            continue;
        }
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title}: no description"
        );
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            // Every exporter series is this cluster's; every per-cluster operator series too.
            for sel in promql::selectors(expr) {
                let has = |l: &str, v: &str| {
                    sel.matchers
                        .iter()
                        .any(|(k, op, val)| k == l && op == "=" && val == v)
                };
                if sel.name.starts_with("redis_") {
                    assert!(
                        has("namespace", "$namespace") && has("valkey_cluster", "$cluster"),
                        "{title}: {} is not scoped to the selected cluster",
                        sel.name
                    );
                } else if sel.name.starts_with("valkey_operator_cluster_") {
                    assert!(
                        has("namespace", "$namespace") && has("name", "$cluster"),
                        "{title}: {} is not scoped to the selected cluster",
                        sel.name
                    );
                }
            }
        }
    }

    // The chart ships it as a ConfigMap for Grafana's sidecar, only when asked.
    assert!(!kinds(&render(&[])).contains(&"ConfigMap"));
    let all = chart().join(ALL_FEATURES);
    let docs = render(&["--values", all.to_str().expect("path")]);
    let cm = one(&docs, "ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "Valkey");
    assert_eq!(cm["metadata"]["namespace"], NAMESPACE);
    let shipped: Value =
        serde_json::from_str(cm["data"]["valkey-cluster.json"].as_str().expect("data"))
            .expect("shipped JSON");
    assert_eq!(shipped, d);
    let elsewhere = render(&[
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "grafanaDashboard.namespace=monitoring",
    ]);
    assert_eq!(
        one(&elsewhere, "ConfigMap")["metadata"]["namespace"],
        "monitoring"
    );
}

// ------------------------------------------------------------------------------ metric names

struct Rule {
    alert: String,
    expr: String,
    labels: Value,
}

fn rules(rule: &Value) -> Vec<Rule> {
    rule["spec"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .map(|r| Rule {
            alert: r["alert"].as_str().expect("alert").to_owned(),
            expr: r["expr"].as_str().expect("expr").to_owned(),
            labels: r["labels"].clone(),
        })
        .collect()
}

/// Every series the operator exports, each with samples: its registry after recording one of
/// everything (every topology step kind of the planner, every cluster state).
fn operator_samples() -> Samples {
    let m = Metrics::new();
    m.reconciled("valkeycluster", Duration::from_millis(5), true);
    m.reconciled("valkeynode", Duration::from_millis(5), false);
    m.set_cluster_state("ns", "c", ClusterState::Ready);
    m.set_cluster_figures(
        "ns",
        "c",
        valkey_operator::metrics::ClusterFigures {
            desired_shards: 3,
            ready_shards: 3,
            slots_assigned: 16384,
            slots_to_move: 0,
        },
    );
    m.failovers("ns", "c", 1);
    m.failed("valkeycluster", "observe");
    m.set_leader(true);
    m.migrated(1, Some(1), Duration::from_millis(5));
    let step_kinds: Vec<&str> = valkey_operator::cluster::steps::Step::kinds().to_vec();
    assert!(
        step_kinds.contains(&"Failover"),
        "step kinds {step_kinds:?}"
    );
    for k in &step_kinds {
        m.step(k);
    }
    let mut out = Samples::new();
    parse_exposition(&m.encode(), &mut out);
    out
}

/// One `redis_exporter` process (killed on drop) scraping one server as `_exporter`.
struct Exporter {
    child: Child,
    port: u16,
}

impl Exporter {
    fn start(server: &Server) -> Self {
        let port = free_port();
        let child = Command::new(installed("redis_exporter", "exporter"))
            .args(["-web.listen-address", &format!("127.0.0.1:{port}")])
            .env("REDIS_ADDR", format!("redis://{}", server.addr()))
            .env("REDIS_USER", valkey_ops::commands::acl::EXPORTER_USER)
            .env("REDIS_PASSWORD", valkey_testkit::EXPORTER_PASSWORD)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis_exporter");
        Self { child, port }
    }

    /// `/metrics` once the exporter reaches its server and reports `want`.
    fn scrape_when(&self, want: &str) -> String {
        wait_for(
            &format!("redis_exporter reporting {want}"),
            Duration::from_secs(30),
            || {
                http_get(self.port, "/metrics")
                    .ok()
                    .filter(|(code, body)| {
                        *code == 200
                            && body.lines().any(|l| l == "redis_up 1")
                            && body.lines().any(|l| l.starts_with(want))
                    })
                    .map(|(_, body)| body)
            },
        )
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a real redis_exporter exports for a Valkey cluster's primary and its replica.
async fn exporter_samples() -> Samples {
    let primary = Server::start(Flavor::V9, None);
    let replica = Server::start(Flavor::V9, None);
    form_cluster(&operator_pool(None), &[primary.addr()], &[replica.addr()]).await;
    let (ep, er) = (Exporter::start(&primary), Exporter::start(&replica));
    let mut out = Samples::new();
    parse_exposition(&ep.scrape_when("redis_connected_slaves 1"), &mut out);
    parse_exposition(&er.scrape_when("redis_master_link_up{"), &mut out);
    out
}

/// The target labels the chart's PodMonitor gives the exporter of pod `pod` (shard 0, node 0)
/// of cluster `cluster` in namespace `ns`.
fn exporter_target_labels(ns: &str, cluster: &str, pod: &str) -> BTreeMap<String, String> {
    let podmonitor = read(&format!("{CHART}/templates/podmonitor.yaml"));
    let relabelings = promql::pod_label_relabelings(&podmonitor);
    assert_eq!(relabelings.len(), 3, "{podmonitor}");
    let pod_labels = BTreeMap::from([
        (labels::CLUSTER.to_owned(), cluster.to_owned()),
        (labels::SHARD_INDEX.to_owned(), "0".to_owned()),
        (labels::NODE_INDEX.to_owned(), "0".to_owned()),
    ]);
    promql::pod_target_labels(ns, pod, &pod_labels, &relabelings)
}

/// Every series the operator and a real redis_exporter (with the PodMonitor's target labels)
/// export, for cluster `c` in namespace `ns`.
async fn all_samples() -> Samples {
    let mut all = operator_samples();
    assert!(all.keys().all(|n| n.starts_with("valkey_operator_")));
    let mut exporter = exporter_samples().await;
    promql::with_target_labels(
        &mut exporter,
        &exporter_target_labels("ns", "c", "valkey-c-0-0"),
    );
    promql::merge(&mut all, exporter);
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_rule_and_dashboard_use_only_metrics_the_operator_or_redis_exporter_export() {
    let samples = all_samples().await;
    let all = chart().join(ALL_FEATURES);
    let docs = render(&["--values", all.to_str().expect("path")]);
    let rules = rules(one(&docs, "PrometheusRule"));
    let mut used = BTreeSet::new();
    for r in &rules {
        let names = promql::check_query(&r.expr, &samples)
            .unwrap_or_else(|e| panic!("alert {}: {e}", r.alert));
        used.extend(names);
    }
    eprintln!("metrics used by {} alerts: {used:?}", rules.len());
    assert!(used.iter().any(|n| n.starts_with("valkey_operator_")));
    assert!(used.iter().any(|n| n.starts_with("redis_")));

    let dashboard = dashboard();
    let vars = BTreeMap::from([
        ("namespace".to_owned(), "ns".to_owned()),
        ("cluster".to_owned(), "c".to_owned()),
    ]);
    let queries = promql::dashboard_queries(&dashboard);
    let mut used = BTreeSet::new();
    for (place, expr) in &queries {
        let names = promql::check_query(&promql::substitute(expr, &vars), &samples)
            .unwrap_or_else(|e| panic!("dashboard {place}: {e}"));
        used.extend(names);
    }
    eprintln!(
        "metrics used by {} dashboard queries: {used:?}",
        queries.len()
    );
    for wanted in DASHBOARD_METRICS {
        assert!(used.contains(wanted), "the dashboard shows no {wanted}");
    }
}

// ------------------------------------------------------------------------------ a real install

/// `valkey-operator run` started as the installed Deployment's container would be (its
/// arguments and environment), killed on drop; its stderr is kept.
struct OperatorProcess {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl OperatorProcess {
    fn spawn(deployment: &Value, kubeconfig: &Path, pod_name: &str) -> Self {
        let c = container(deployment);
        let port = free_port();
        let mut args = strings(&c["args"]);
        let i = args
            .iter()
            .position(|a| a == "--metrics-address")
            .expect("--metrics-address");
        args[i + 1] = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_valkey-operator"));
        cmd.args(&args).env("KUBECONFIG", kubeconfig);
        for e in c["env"].as_array().expect("env") {
            let name = e["name"].as_str().expect("env name");
            let value = match (
                &e["value"],
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            ) {
                (Value::String(v), _) => v.clone(),
                (_, Some("metadata.name")) => pod_name.to_owned(),
                (_, Some("metadata.namespace")) => NAMESPACE.to_owned(),
                other => panic!("env {name}: {other:?} not emulated"),
            };
            cmd.env(name, value);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the operator binary");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[operator] {line}");
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Self { child, port, log }
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kubectl_json(kubeconfig: &Path, args: &[&str]) -> Value {
    let out = run(kubectl(kubeconfig).args(args).args(["-o", "json"]));
    serde_json::from_str(&out).expect("kubectl JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_on_a_real_apiserver_runs_the_operator_with_the_charts_rbac() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let t0 = Instant::now();
    let env = localkube::Env::start(localkube::Options::apiserver_only())
        .await
        .expect("localkube (apiserver only)");
    eprintln!(
        "MEASURE localkube start: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    let admin = env.kubeconfig_path();
    let helm_in = |cmd: &mut Command| -> String {
        run(cmd
            .arg("--kubeconfig")
            .arg(&admin)
            .args(["--namespace", NAMESPACE]))
    };

    // Install: CRDs first (crds/), then the templates, in a namespace Helm creates.
    let t = Instant::now();
    helm_in(
        helm()
            .args(["install", RELEASE])
            .arg(chart())
            .arg("--create-namespace"),
    );
    eprintln!("MEASURE helm install: {:.1}s", t.elapsed().as_secs_f64());
    run(kubectl(&admin).args(common::WAIT_CRDS_ESTABLISHED));
    let releases: Value =
        serde_json::from_str(&helm_in(helm().args(["list", "--output", "json"]))).expect("JSON");
    assert_eq!(releases[0]["status"], "deployed", "{releases}");
    let manifest = helm_in(helm().args(["get", "manifest", RELEASE]));
    let docs = documents(&manifest);
    assert!(
        MONITORING_KINDS
            .iter()
            .all(|k| docs.iter().all(|d| d["kind"] != *k))
    );
    // Every installed object is in the API.
    let got = run_with(
        kubectl(&admin).args(["get", "-f", "-", "-o", "name"]),
        Some(&manifest),
    );
    assert_eq!(got.lines().count(), docs.len(), "{got}");

    // The operator as the chart's ServiceAccount: a token of it, nothing else.
    let deployment = one(&docs, "Deployment");
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let token =
        run(kubectl(&admin).args(["create", "token", sa, "-n", NAMESPACE, "--duration", "1h"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let as_sa = dir.path().join("kubeconfig");
    std::fs::copy(&admin, &as_sa).expect("copy kubeconfig");
    run(kubectl(&as_sa).args([
        "config",
        "set-credentials",
        "chart-sa",
        "--token",
        token.trim(),
    ]));
    run(kubectl(&as_sa).args(["config", "set-context", "--current", "--user", "chart-sa"]));
    let who = kubectl_json(&as_sa, &["auth", "whoami"]);
    assert_eq!(
        who["status"]["userInfo"]["username"],
        format!("system:serviceaccount:{NAMESPACE}:{sa}")
    );
    let can = |args: &[&str]| {
        let out = kubectl(&as_sa)
            .args(["auth", "can-i"])
            .args(args)
            .output()
            .expect("kubectl auth can-i");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(
        can(&["create", "leases.coordination.k8s.io", "-n", NAMESPACE]),
        "yes"
    );
    assert_eq!(
        can(&["create", "leases.coordination.k8s.io", "-n", "default"]),
        "no"
    );
    assert_eq!(
        can(&["create", "pods", "--subresource", "exec", "-n", "default"]),
        "no"
    );
    assert_eq!(can(&["list", "nodes"]), "no");

    let pod_name = "chart-operator-0";
    let op = OperatorProcess::spawn(deployment, &as_sa, pod_name);
    let args = strings(&container(deployment)["args"]);
    let probe = |path: &str| http_get(op.port, path).ok();
    wait_for("/readyz 200 ok (leading)", Duration::from_secs(60), || {
        probe("/readyz").filter(|(c, b)| *c == 200 && b == "ok")
    });
    assert_eq!(probe("/healthz").map(|(c, _)| c), Some(200));
    let lease_name = flag(&args, "--lease-name").unwrap_or("valkey-operator");
    let lease = kubectl_json(&admin, &["get", "lease", lease_name, "-n", NAMESPACE]);
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
    assert!(holder.starts_with(pod_name), "Lease holder {holder:?}");

    // A ValkeyCluster: the operator writes its children with the chart's RBAC (no pods run here).
    let vkc = json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
        "metadata": {"name": "helm", "namespace": "default"},
        "spec": {"shards": 1, "replicas": 0}
    });
    run_with(
        kubectl(&admin).args(["apply", "-f", "-"]),
        Some(&vkc.to_string()),
    );
    let selector = format!("{}=helm", labels::CLUSTER);
    let refusals = |op: &OperatorProcess| -> Vec<String> {
        op.log()
            .into_iter()
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .collect()
    };
    let workload = wait_for("the Valkey workload", Duration::from_secs(90), || {
        let refused = refusals(&op);
        assert!(refused.is_empty(), "RBAC refusals:\n{}", refused.join("\n"));
        kubectl_json(
            &admin,
            &[
                "get",
                "statefulsets,deployments",
                "-n",
                "default",
                "-l",
                &selector,
            ],
        )["items"]
            .as_array()
            .and_then(|i| i.first().cloned())
    });
    // The PodMonitor (when enabled) selects these pods and their exporter port.
    let all = chart().join(ALL_FEATURES);
    let monitored = render(&["--values", all.to_str().expect("path")]);
    let pm = one(&monitored, "PodMonitor");
    let template = &workload["spec"]["template"];
    assert!(
        selects(
            &pm["spec"]["selector"]["matchLabels"],
            &template["metadata"]["labels"]
        ),
        "PodMonitor selector {} vs pod labels {}",
        pm["spec"]["selector"]["matchLabels"],
        template["metadata"]["labels"]
    );
    let port = &pm["spec"]["podMetricsEndpoints"][0]["port"];
    let exporter_port = template["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .find(|p| p["name"] == *port)
        .unwrap_or_else(|| panic!("no container port named {port}: {template}"));
    assert_eq!(
        exporter_port["containerPort"],
        valkey_api::defaults::EXPORTER_PORT
    );

    // The binary's /metrics are the registry's.
    let (code, text) = probe("/metrics").expect("/metrics");
    assert_eq!(code, 200);
    let mut served = Samples::new();
    parse_exposition(&text, &mut served);
    let known = operator_samples();
    for name in served.keys() {
        assert!(
            known.contains_key(name),
            "{name} served but not in the registry"
        );
    }
    assert!(
        text.lines().any(|l| l == "valkey_operator_leader 1"),
        "{text}"
    );
    let refused = refusals(&op);
    assert!(refused.is_empty(), "RBAC refusals:\n{}", refused.join("\n"));
    drop(op);

    // An upgrade with a changed value applies it.
    helm_in(helm().args(["upgrade", RELEASE]).arg(chart()).args([
        "--reuse-values",
        "--set",
        "replicas=3",
    ]));
    let d = kubectl_json(&admin, &["get", "deployment", RELEASE, "-n", NAMESPACE]);
    assert_eq!(d["spec"]["replicas"], 3);
    env.stop().await;
}
