//! End-to-end tests of localkube's storage: the default StorageClass, the
//! directory-backed provisioner (bound by kube-controller-manager's PV
//! binder), the expansion flow (Resizing → FileSystemResizePending → done
//! once a pod uses the claim) and reclaim policies Delete and Retain.
//! Needs root; CI runs as root.

#[macro_use]
mod support;
use support::*;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

fn claim(name: &str, class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    let mut spec =
        json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}});
    if let Some(c) = class {
        spec["storageClassName"] = json!(c);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

async fn bound(pvcs: &Api<PersistentVolumeClaim>, name: &str) -> PersistentVolumeClaim {
    wait_for(
        &format!("{name} Bound"),
        Duration::from_secs(30),
        || async {
            pvcs.get(name)
                .await
                .ok()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        },
    )
    .await
}

fn storage(
    m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> String {
    m.and_then(|m| m.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_root_storage() {
    let ns = "st";
    let Some((env, client, pods)) = support::start_env_in(ns).await else {
        return;
    };
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());

    // --- The default class.
    let classes: Api<StorageClass> = Api::all(client.clone());
    let standard = classes.get("standard").await.unwrap();
    assert_eq!(standard.provisioner, "localkube.io/hostpath");
    assert_eq!(standard.allow_volume_expansion, Some(true));
    assert_eq!(
        standard
            .annotations()
            .get("storageclass.kubernetes.io/is-default-class")
            .map(String::as_str),
        Some("true")
    );

    // --- Provisioning for a claim without a class (defaulted by admission).
    pvcs.create(&PostParams::default(), &claim("a", None, "1Gi"))
        .await
        .unwrap();
    let a = bound(&pvcs, "a").await;
    assert_eq!(
        a.spec.as_ref().unwrap().storage_class_name.as_deref(),
        Some("standard")
    );
    let pv_name = a.spec.as_ref().unwrap().volume_name.clone().unwrap();
    let pv = pvs.get(&pv_name).await.unwrap();
    assert_eq!(
        pv.annotations()
            .get("pv.kubernetes.io/provisioned-by")
            .map(String::as_str),
        Some("localkube.io/hostpath")
    );
    let pv_spec = pv.spec.clone().unwrap();
    assert_eq!(
        pv_spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    let dir = PathBuf::from(pv_spec.host_path.unwrap().path);
    assert!(dir.is_dir() && dir.starts_with(env.dir()));
    assert_eq!(storage(a.status.as_ref().unwrap().capacity.as_ref()), "1Gi");

    // --- Expansion without a pod: controller part done, node part pending.
    pvcs.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
    )
    .await
    .unwrap();
    let pending = wait_for(
        "FileSystemResizePending",
        Duration::from_secs(30),
        || async {
            let p = pvcs.get("a").await.ok()?;
            let conds = p.status.as_ref()?.conditions.clone()?;
            conds
                .iter()
                .any(|c| c.type_ == "FileSystemResizePending" && c.status == "True")
                .then_some(p)
        },
    )
    .await;
    let st = pending.status.unwrap();
    assert_eq!(
        storage(st.capacity.as_ref()),
        "1Gi",
        "capacity grows only after the node part"
    );
    assert_eq!(storage(st.allocated_resources.as_ref()), "2Gi");
    let pv = pvs.get(&pv_name).await.unwrap();
    assert_eq!(storage(pv.spec.unwrap().capacity.as_ref()), "2Gi");

    // A pod using the claim completes the expansion.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "user"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "echo data > /data/f; sleep 3600"],
                "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "a"}}],
            "terminationGracePeriodSeconds": 1,
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for("expansion finished", Duration::from_secs(60), || async {
        let p = pvcs.get("a").await.ok()?;
        let st = p.status?;
        let resizing = st
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Resizing" || c.type_ == "FileSystemResizePending");
        let resize_status = st.allocated_resource_statuses.is_some();
        (storage(st.capacity.as_ref()) == "2Gi" && !resizing && !resize_status).then_some(())
    })
    .await;
    wait_for("data written", Duration::from_secs(10), || async {
        dir.join("f").exists().then_some(())
    })
    .await;

    // --- Reclaim policy Delete: PV and directory go with the claim.
    pods.delete("user", &DeleteParams::default()).await.unwrap();
    wait_for("user gone", Duration::from_secs(30), || async {
        matches!(pods.get_opt("user").await, Ok(None)).then_some(())
    })
    .await;
    pvcs.delete("a", &DeleteParams::default()).await.unwrap();
    wait_for("PV deleted", Duration::from_secs(60), || async {
        matches!(pvs.get_opt(&pv_name).await, Ok(None)).then_some(())
    })
    .await;
    assert!(!dir.exists(), "directory removed");

    // --- Reclaim policy Retain: PV stays Released with its data.
    let retain: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "retain"},
        "provisioner": "localkube.io/hostpath",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &retain)
        .await
        .unwrap();
    pvcs.create(&PostParams::default(), &claim("r", Some("retain"), "1Gi"))
        .await
        .unwrap();
    let r = bound(&pvcs, "r").await;
    let r_pv = r.spec.unwrap().volume_name.unwrap();
    pvcs.delete("r", &DeleteParams::default()).await.unwrap();
    wait_for("PV Released", Duration::from_secs(60), || async {
        let pv = pvs.get(&r_pv).await.ok()?;
        (pv.status?.phase.as_deref() == Some("Released")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pv = pvs.get(&r_pv).await.unwrap();
    assert_eq!(
        pv.spec
            .as_ref()
            .unwrap()
            .persistent_volume_reclaim_policy
            .as_deref(),
        Some("Retain")
    );
    assert!(
        PathBuf::from(pv.spec.unwrap().host_path.unwrap().path).is_dir(),
        "retained data stays"
    );

    env.stop().await;
}
