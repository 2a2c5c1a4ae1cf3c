//! Storage: the default StorageClass and its directory-backed provisioner.
//!
//! - StorageClass (default name `standard`), annotated as the default
//!   class, provisioner [`STORAGE_PROVISIONER`], `allowVolumeExpansion: true`,
//!   `volumeBindingMode: Immediate` (every fake node is the same machine, so
//!   a directory is reachable from all of them, like network storage; the
//!   PVs therefore carry no node affinity), reclaim policy Delete.
//! - Provisioning: for each pending claim of that class a PersistentVolume
//!   `pvc-<uid>` backed by `hostPath` directory `<state_dir>/volumes/pvc-<uid>`
//!   with `claimRef` to the claim; kube-controller-manager's PV binder binds them.
//! - Reclaim: released PVs with policy Delete lose their directory and
//!   object; Retain keeps both.
//! - Expansion (external-resizer flow): `Resizing` + `allocatedResources`
//!   → PV capacity updated → `FileSystemResizePending`; once a pod using the
//!   claim runs on a node, the "node expansion" completes: status capacity
//!   updated, conditions and resize status cleared.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::objects::spawn_reflector;
use super::quantity::parse_units_ceil;

/// The provisioner name of localkube's StorageClass.
pub const STORAGE_PROVISIONER: &str = "localkube.io/hostpath";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// Creates the default StorageClass (if missing) and starts the provisioner.
pub async fn start(
    client: Client,
    volumes_dir: PathBuf,
    class_name: String,
) -> anyhow::Result<Vec<JoinHandle<()>>> {
    std::fs::create_dir_all(&volumes_dir)?;
    let classes: Api<StorageClass> = Api::all(client.clone());
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(class_name.clone()),
            annotations: Some(
                [(
                    "storageclass.kubernetes.io/is-default-class".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        provisioner: STORAGE_PROVISIONER.into(),
        allow_volume_expansion: Some(true),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("Immediate".into()),
        ..Default::default()
    };
    match classes.create(&PostParams::default(), &class).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let wake = Arc::new(Notify::new());
    let (pvcs, t1) = spawn_reflector(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        wake_on(&wake),
    );
    let (pvs, t2) = spawn_reflector(Api::<PersistentVolume>::all(client.clone()), wake_on(&wake));
    let (scs, t3) = spawn_reflector(Api::<StorageClass>::all(client.clone()), wake_on(&wake));
    let ctl = Controller {
        client,
        volumes_dir,
        pvcs,
        pvs,
        scs,
    };
    let t4 = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
            ctl.reconcile().await;
        }
    });
    Ok(vec![t1, t2, t3, t4])
}

/// A reflector event handler waking the controller.
fn wake_on<E>(wake: &Arc<Notify>) -> impl FnMut(&E) + Send + 'static {
    let wake = wake.clone();
    move |_| wake.notify_one()
}

/// Merge-patches the status of `pvc`.
async fn patch_claim_status(
    pvcs: &Api<PersistentVolumeClaim>,
    pvc: &PersistentVolumeClaim,
    patch: &serde_json::Value,
) -> kube::Result<()> {
    pvcs.patch_status(
        &pvc.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

struct Controller {
    client: Client,
    volumes_dir: PathBuf,
    pvcs: Store<PersistentVolumeClaim>,
    pvs: Store<PersistentVolume>,
    scs: Store<StorageClass>,
}

fn storage_request(pvc: &PersistentVolumeClaim) -> Option<Quantity> {
    pvc.spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .cloned()
}

fn bytes(q: &Quantity) -> i128 {
    parse_units_ceil(&q.0).unwrap_or(0)
}

impl Controller {
    fn our_class(&self, name: &str) -> Option<StorageClass> {
        self.scs
            .state()
            .into_iter()
            .find(|c| c.name_any() == name && c.provisioner == STORAGE_PROVISIONER)
            .map(|c| (*c).clone())
    }

    async fn reconcile(&self) {
        for pvc in self.pvcs.state() {
            let class_name = pvc
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default();
            let Some(class) = self.our_class(&class_name) else {
                continue;
            };
            if pvc.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let phase = pvc
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let result = if phase == "Bound" {
                self.expand(&pvc).await
            } else {
                self.provision(&pvc, &class).await
            };
            if let Err(e) = result {
                tracing::warn!(pvc = pvc.name_any(), error = %e, "storage reconcile failed");
            }
        }
        for pv in self.pvs.state() {
            if let Err(e) = self.reclaim(&pv).await {
                tracing::warn!(pv = pv.name_any(), error = %e, "reclaim failed");
            }
        }
    }

    async fn provision(
        &self,
        pvc: &PersistentVolumeClaim,
        class: &StorageClass,
    ) -> anyhow::Result<()> {
        let uid = pvc.uid().unwrap_or_default();
        let spec = pvc.spec.clone().unwrap_or_default();
        if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
            return Ok(());
        }
        let name = format!("pvc-{uid}");
        if self.pvs.state().iter().any(|pv| pv.name_any() == name) {
            return Ok(());
        }
        let Some(size) = storage_request(pvc) else {
            return Ok(());
        };
        let dir = self.volumes_dir.join(&name);
        std::fs::create_dir_all(&dir)?;
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                annotations: Some(
                    [(PROVISIONED_BY.to_string(), STORAGE_PROVISIONER.to_string())].into(),
                ),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some([("storage".to_string(), size)].into()),
                access_modes: spec.access_modes.clone(),
                volume_mode: spec.volume_mode.clone(),
                storage_class_name: Some(class.name_any()),
                persistent_volume_reclaim_policy: Some(
                    class
                        .reclaim_policy
                        .clone()
                        .unwrap_or_else(|| "Delete".into()),
                ),
                host_path: Some(HostPathVolumeSource {
                    path: dir.to_string_lossy().into_owned(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: pvc.namespace(),
                    name: Some(pvc.name_any()),
                    uid: Some(uid),
                    resource_version: pvc.resource_version(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        };
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api.create(&PostParams::default(), &pv).await {
            Ok(_) => {
                tracing::info!(pv = name, pvc = pvc.name_any(), "provisioned volume");
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn expand(&self, pvc: &PersistentVolumeClaim) -> anyhow::Result<()> {
        let Some(requested) = storage_request(pvc) else {
            return Ok(());
        };
        let status = pvc.status.clone().unwrap_or_default();
        let capacity = status
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .cloned()
            .unwrap_or(Quantity("0".into()));
        if bytes(&requested) <= bytes(&capacity) {
            return Ok(());
        }
        let Some(pv_name) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
            return Ok(());
        };
        let Some(pv) = self
            .pvs
            .state()
            .into_iter()
            .find(|p| p.name_any() == pv_name)
        else {
            return Ok(());
        };
        if pv.annotations().get(PROVISIONED_BY).map(String::as_str) != Some(STORAGE_PROVISIONER) {
            return Ok(());
        }
        let ns = pvc.namespace().unwrap_or_default();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let now = Timestamp::now().to_string();
        // Conditions of others (e.g. `Unused`) are kept; ours are replaced.
        let others: Vec<serde_json::Value> = status
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ != "Resizing" && c.type_ != "FileSystemResizePending")
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        let with = |extra: Option<serde_json::Value>| -> serde_json::Value {
            let mut all = others.clone();
            all.extend(extra);
            serde_json::Value::Array(all)
        };
        let pv_capacity = pv
            .spec
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .cloned()
            .unwrap_or(Quantity("0".into()));
        if bytes(&pv_capacity) < bytes(&requested) {
            // Controller-side expansion.
            let patch = json!({"status": {
                "conditions": with(Some(json!({"type": "Resizing", "status": "True", "lastTransitionTime": now}))),
                "allocatedResources": {"storage": requested},
                "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
            }});
            patch_claim_status(&pvcs, pvc, &patch).await?;
            let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
            let patch = json!({"spec": {"capacity": {"storage": requested}}});
            pvs.patch(&pv_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let patch = json!({"status": {
                "conditions": with(Some(json!({
                    "type": "FileSystemResizePending", "status": "True", "lastTransitionTime": now,
                    "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
                }))),
                "allocatedResourceStatuses": {"storage": "NodeResizePending"},
            }});
            patch_claim_status(&pvcs, pvc, &patch).await?;
            tracing::info!(
                pvc = pvc.name_any(),
                size = requested.0,
                "expanded volume (controller)"
            );
            return Ok(());
        }
        // Node-side expansion: done by the kubelet of a node where a pod uses the claim.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let used = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .any(|p| {
                let on_node = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                let uses = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|v| {
                        v.persistent_volume_claim
                            .as_ref()
                            .is_some_and(|c| c.claim_name == pvc.name_any())
                    });
                on_node && running && uses
            });
        if !used {
            return Ok(());
        }
        let patch = json!({"status": {
            "capacity": {"storage": requested},
            "conditions": with(None),
            "allocatedResourceStatuses": null,
            "allocatedResources": {"storage": requested},
        }});
        patch_claim_status(&pvcs, pvc, &patch).await?;
        tracing::info!(
            pvc = pvc.name_any(),
            size = requested.0,
            "expanded volume (node)"
        );
        Ok(())
    }

    async fn reclaim(&self, pv: &PersistentVolume) -> anyhow::Result<()> {
        if pv.annotations().get(PROVISIONED_BY).map(String::as_str) != Some(STORAGE_PROVISIONER) {
            return Ok(());
        }
        let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.clone())
            .unwrap_or_default();
        if !released || policy != "Delete" || pv.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        if let Some(path) = pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| PathBuf::from(&h.path))
            && path.starts_with(&self.volumes_dir)
        {
            let _ = std::fs::remove_dir_all(&path);
        }
        let api: Api<PersistentVolume> = Api::all(self.client.clone());
        match api.delete(&pv.name_any(), &DeleteParams::default()).await {
            Ok(_) => tracing::info!(pv = pv.name_any(), "deleted released volume"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }
}
