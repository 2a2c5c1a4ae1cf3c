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

/// Starts a reflector over `api`, handing each event to `on_event` (a watch error is
/// logged and retried after 500 ms first).
pub(super) fn spawn_reflector<K>(
    api: Api<K>,
    mut on_event: impl FnMut(&watcher::Result<watcher::Event<K>>) + Send + 'static,
) -> (Store<K>, JoinHandle<()>)
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
            if let Err(e) = &event {
                tracing::debug!(error = %e, "object watch error (retrying)");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            on_event(&event);
        }
    });
    (reader, task)
}

/// A reflector event handler announcing applied and deleted objects on `changes`.
fn announce_changes<K: kube::Resource + 'static>(
    changes: broadcast::Sender<Change>,
) -> impl FnMut(&watcher::Result<watcher::Event<K>>) + Send + 'static {
    move |event| {
        if let Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) = event {
            let _ = changes.send((o.namespace().unwrap_or_default(), o.name_any()));
        }
    }
}

impl Objects {
    /// Starts the reflectors and waits until both caches are filled.
    pub async fn start(client: &Client) -> anyhow::Result<(Objects, Vec<JoinHandle<()>>)> {
        let (changes, _) = broadcast::channel(1024);
        let (config_maps, t1) = spawn_reflector(
            Api::<ConfigMap>::all(client.clone()),
            announce_changes(changes.clone()),
        );
        let (secrets, t2) = spawn_reflector(
            Api::<Secret>::all(client.clone()),
            announce_changes(changes.clone()),
        );
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
        let text = entries(&cm.data, |v| v.as_bytes());
        let binary = entries(&cm.binary_data, |ByteString(v)| v);
        // On a key in both, `binaryData` wins (later entries replace earlier ones).
        Some(text.chain(binary).collect())
    }

    /// A Secret's decoded data by key (`stringData` is merged by the API server).
    pub fn secret_bytes(&self, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let s = self.secrets.get(&ObjectRef::new(name).within(ns))?;
        let data = entries(&s.data, |ByteString(v)| v);
        let string_data = entries(&s.string_data, |v| v.as_bytes());
        // On a key in both, `data` wins (later entries replace earlier ones).
        Some(string_data.chain(data).collect())
    }

    /// A lookup scoped to one namespace (for env vars).
    pub fn in_namespace<'a>(&'a self, ns: &'a str) -> NamespaceLookup<'a> {
        NamespaceLookup { objects: self, ns }
    }
}

/// The entries of an optional map with their values as owned bytes.
fn entries<'a, V>(
    map: &'a Option<BTreeMap<String, V>>,
    bytes: impl Fn(&'a V) -> &'a [u8] + 'a,
) -> impl Iterator<Item = (String, Vec<u8>)> + 'a {
    map.iter()
        .flatten()
        .map(move |(k, v)| (k.clone(), bytes(v).to_vec()))
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
