//! The real control plane starts from the cached binaries (needs
//! `hack/install-deps.sh`), serves the API, and stops cleanly.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::ListParams;

#[tokio::test]
async fn apiserver_only_serves_the_api() -> anyhow::Result<()> {
    let env = localkube::Env::start(localkube::Options::apiserver_only()).await?;
    let namespaces: Api<Namespace> = Api::all(env.client());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(names.contains(&"default".to_string()), "{names:?}");
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");
    let version = env.client().apiserver_version().await?;
    assert_eq!(version.major, "1");
    assert_eq!(version.minor, "37");
    let pids = env.control_plane_pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    env.stop().await;
    for (name, pid) in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true),
            "{name} still running"
        );
    }
    Ok(())
}

#[tokio::test]
async fn controllers_start_and_run_the_default_controllers() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let env = localkube::Env::start(localkube::Options {
        nodes: 0,
        kubelets: false,
        ..localkube::Options::default()
    })
    .await?;
    assert_eq!(env.control_plane_pids().len(), 4);
    // The serviceaccount controller creates `default` in every namespace.
    let sas: Api<ServiceAccount> = Api::namespaced(env.client(), "default");
    let start = std::time::Instant::now();
    loop {
        if sas.get_opt("default").await?.is_some() {
            break;
        }
        assert!(start.elapsed().as_secs() < 60, "no default service account");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    env.stop().await;
    Ok(())
}
