//! Cluster-wide caches of ConfigMaps and Secrets (reflectors), used for env
//! vars and volumes, with a change feed so ConfigMap/Secret volumes are
//! re-projected when their source changes.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::envvars::ObjectLookup;

/// A change of a ConfigMap or Secret: `(namespace, name)`.
pub type Change = (String, String);

/// The caches.
#[derive(Clone)]
pub struct Objects {
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
    changes: broadcast::Sender<Change>,
}

fn spawn_reflector<K>(api: Api<K>, changes: broadcast::Sender<Change>) -> (Store<K>, JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                    let _ = changes.send((o.namespace().unwrap_or_default(), o.name_any()));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "object watch error (retrying)");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
            }
        }
    });
    (reader, task)
}

impl Objects {
    /// Starts the reflectors and waits until both caches are filled.
    pub async fn start(client: &Client) -> anyhow::Result<(Objects, Vec<JoinHandle<()>>)> {
        let (changes, _) = broadcast::channel(1024);
        let (config_maps, t1) =
            spawn_reflector(Api::<ConfigMap>::all(client.clone()), changes.clone());
        let (secrets, t2) = spawn_reflector(Api::<Secret>::all(client.clone()), changes.clone());
        config_maps.wait_until_ready().await?;
        secrets.wait_until_ready().await?;
        Ok((
            Objects {
                config_maps,
                secrets,
                changes,
            },
            vec![t1, t2],
        ))
    }

    /// Subscribes to changes.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// A ConfigMap's data (text and binary) by key.
    pub fn config_map_bytes(&self, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let cm = self.config_maps.get(&ObjectRef::new(name).within(ns))?;
        let mut out: BTreeMap<String, Vec<u8>> = cm
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        for (k, ByteString(v)) in cm.binary_data.clone().unwrap_or_default() {
            out.insert(k, v);
        }
        Some(out)
    }

    /// A Secret's decoded data by key (`stringData` is merged by the API server).
    pub fn secret_bytes(&self, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let s = self.secrets.get(&ObjectRef::new(name).within(ns))?;
        let mut out: BTreeMap<String, Vec<u8>> = s
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, ByteString(v))| (k, v))
            .collect();
        for (k, v) in s.string_data.clone().unwrap_or_default() {
            out.entry(k).or_insert_with(|| v.into_bytes());
        }
        Some(out)
    }

    /// A lookup scoped to one namespace (for env vars).
    pub fn in_namespace<'a>(&'a self, ns: &'a str) -> NamespaceLookup<'a> {
        NamespaceLookup { objects: self, ns }
    }
}

/// [`ObjectLookup`] over the caches for one namespace.
pub struct NamespaceLookup<'a> {
    objects: &'a Objects,
    ns: &'a str,
}

fn to_text(m: BTreeMap<String, Vec<u8>>) -> BTreeMap<String, String> {
    m.into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

impl ObjectLookup for NamespaceLookup<'_> {
    fn config_map(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.objects.config_map_bytes(self.ns, name).map(to_text)
    }

    fn secret(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.objects.secret_bytes(self.ns, name).map(to_text)
    }
}
