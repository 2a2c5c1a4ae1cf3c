//! The shipped manifests agree with the image recipe and the binary (needs the built
//! `valkey-operator` binary; the kustomize check needs a `kubectl` binary and is skipped, with
//! a message, without one).
//!
//! No container engine runs here, so the image itself is not built: the test checks what the
//! manifests rely on instead. The Dockerfile builds the release binary of this crate and runs
//! it as a numeric non-root user (the Deployment requires `runAsNonRoot`), its entrypoint is the
//! file it copies, and the Deployment's arguments are accepted by the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The documents of a multi-document YAML file.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---")
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.starts_with('#'))
        })
        .map(|d| serde_saphyr::from_str(d).expect("YAML document"))
        .collect()
}

fn deployment(docs: &[Value]) -> &Value {
    docs.iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment")
}

#[test]
fn dockerfile_builds_this_binary_and_runs_it_as_non_root() {
    let dockerfile = read("deploy/Dockerfile");
    let stages: Vec<&str> = dockerfile.split("\nFROM ").collect();
    let (build, run) = (stages[stages.len() - 2], stages[stages.len() - 1]);
    assert!(
        build.contains("cargo build --release --locked -p valkey-operator"),
        "the build stage must build this crate in release mode"
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_valkey-operator"))
        .file_name()
        .and_then(|f| f.to_str())
        .expect("binary name");
    assert!(build.contains(&format!("target/release/{bin}")));
    let user = run
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER in the final stage");
    let uid: u32 = user
        .split(':')
        .next()
        .and_then(|u| u.trim().parse().ok())
        .expect("a numeric uid (runAsNonRoot cannot check a name)");
    assert_ne!(uid, 0, "the image must not run as root");
    let copied = run
        .lines()
        .find_map(|l| l.strip_prefix("COPY --from=build "))
        .and_then(|l| l.split_whitespace().nth(1))
        .expect("the binary copied from the build stage");
    assert!(
        run.contains(&format!("ENTRYPOINT [\"{copied}\"]")),
        "the entrypoint must be the copied binary {copied}"
    );
}

#[test]
fn deployment_arguments_are_accepted_by_the_built_binary() {
    let docs = documents(&read("deploy/operator.yaml"));
    let container = &deployment(&docs)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["securityContext"]["runAsNonRoot"], true);
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect();
    assert_eq!(args.first().map(String::as_str), Some("run"));
    // `--help` after the Deployment's arguments: the binary parses them (an unknown flag or
    // subcommand fails), then prints help instead of starting.
    let out = Command::new(env!("CARGO_BIN_EXE_valkey-operator"))
        .args(&args)
        .arg("--help")
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "the binary rejects the Deployment's arguments {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The image the kustomize overlay replaces is the Deployment's.
    let image = container["image"].as_str().expect("image");
    let overlay = read("examples/kustomize-overlay/kustomization.yaml");
    let name = image.split(':').next().expect("image name");
    assert!(overlay.contains(&format!("- name: {name}")));
}

/// A `kubectl` binary: on `PATH`, or in `LOCALKUBE_BIN_DIR`.
fn kubectl() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LOCALKUBE_BIN_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    dirs.into_iter()
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
}

fn kustomize(kubectl: &Path, dir: &str) -> Vec<Value> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(repo().join(dir))
        .output()
        .expect("kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn kustomize_base_and_overlay_render_with_kubectl_binary() {
    let Some(kubectl) = kubectl() else {
        eprintln!("skipped: no kubectl binary (PATH or LOCALKUBE_BIN_DIR)");
        return;
    };
    let base = kustomize(&kubectl, "deploy");
    let mut kinds: Vec<&str> = base.iter().filter_map(|d| d["kind"].as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ]
    );
    // The base is operator.yaml and the CRDs, unchanged.
    assert_eq!(
        deployment(&base),
        deployment(&documents(&read("deploy/operator.yaml")))
    );
    let overlay = kustomize(&kubectl, "examples/kustomize-overlay");
    let d = deployment(&overlay);
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        "example/valkey-operator:0.1.0"
    );
}
