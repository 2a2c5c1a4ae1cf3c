//! Live changes to running pods, without a restart, each reported as a ValkeyNode condition:
//!
//! - settings (`maxmemory`, `maxmemory-policy`, `maxclients`) applied with `CONFIG SET`:
//!   `LiveConfigApplied` (absent when the node has no live setting); the rendered `valkey.conf`
//!   carries the same values, so a restarted pod starts with them; a live key removed from
//!   `spec.config` returns to Valkey's default (what a restarted pod would have);
//! - the ACL file (users, passwords, permissions) loaded with `ACL LOAD` once the mounted
//!   Secret shows the expected revision (on Valkey versions whose `ACL LOAD` crashes a replica,
//!   applied user by user with `ACL SETUSER`/`ACL DELUSER` instead): `ACLApplied`
//!   (`PendingPropagation` until then). Applying the file user by user while the mounted copy
//!   is stale would spare a new cluster the kubelet's minute, but with it the e2e security
//!   suite lost its `SystemUsersRestored` event in 1 of 5 runs (a change made right after
//!   Ready was set back silently, as on a node whose system users were never recorded), so it
//!   is off until that is understood;
//! - `availability-zone` (Valkey 8.0+) set to the zone of the Kubernetes node the pod runs on
//!   (`topology.kubernetes.io/zone`), so zone-aware clients read from their own zone; it
//!   follows a pod that moves, needs no restart and is left alone when `spec.config` sets it;
//! - the TLS certificate, key and CA bundle reloaded with `CONFIG SET tls-cert-file ...` (same
//!   paths: the server re-reads the files) once the mounted Secret has the new files:
//!   `TLSCertificateApplied`, verified by reading the certificate the pod serves from a TLS
//!   handshake (`PendingPropagation` until the pod serves the Secret's certificate).

use std::collections::BTreeMap;

use crate::bounded::map_in_order;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Resource;
use kube::ResourceExt;
use kube::api::Api;
use tracing::{debug, info, warn};
use valkey_api::ValkeyNode;
use valkey_api::status::event::{
    LIVE_ACL_APPLY_FAILED, LIVE_CONFIG_APPLY_FAILED, SYSTEM_USERS_RESTORED, TLS_RELOAD_FAILED,
};
use valkey_api::status::node_condition::{
    ACL_APPLIED, LIVE_CONFIG_APPLIED, TLS_CERTIFICATE_APPLIED,
};
use valkey_api::status::node_reason::{APPLIED, APPLY_FAILED, PENDING_PROPAGATION};
use valkey_ops::client::NodePool;
use valkey_ops::commands::{
    CommandError, acl_apply, acl_load, acl_load_unsafe, acl_state, config_set,
    restore_system_users, tls_reload,
};
use valkey_ops::tls::{fingerprint, served_certificate};
use valkey_ops::{Member, Topology, Version};

use super::tls_secret::Wanted;
use crate::context::Shared;
use crate::node::status_writes::{ClusterFields, apply_cluster_fields};
use crate::render::paths::TLS_DIR;
use crate::render::valkey_conf::live_settings;
use crate::status::EventSpec;

/// What applying the live settings to one node gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveState {
    /// The desired state is in effect (it may just have been applied).
    Applied,
    /// The change cannot be applied yet (the mounted file is not updated): this message.
    Pending(String),
    /// The command failed with this message.
    Failed(String),
    /// The pod could not be reached this pass: nothing is concluded.
    Unobserved,
}

/// The node's conditions with `type_` set from `outcome` (`applied` is the True message), or
/// removed when `wanted` is false; `None` when they would not change (no write).
pub fn updated_conditions(
    node: &ValkeyNode,
    type_: &str,
    wanted: bool,
    outcome: &LiveState,
    applied: &str,
    now: &Time,
) -> Option<Vec<Condition>> {
    let current = node
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let existing = current.iter().find(|c| c.type_ == type_);
    let others = || current.iter().filter(|c| c.type_ != type_).cloned();
    if !wanted {
        existing?;
        return Some(others().collect());
    }
    let (status, reason, message) = match outcome {
        LiveState::Applied => ("True", APPLIED, applied.to_owned()),
        LiveState::Pending(m) => ("False", PENDING_PROPAGATION, m.clone()),
        LiveState::Failed(m) => ("False", APPLY_FAILED, m.clone()),
        LiveState::Unobserved => return None,
    };
    if existing.is_some_and(|c| {
        c.status == status
            && c.reason == reason
            && c.message == message
            && c.observed_generation == node.metadata.generation
    }) {
        return None;
    }
    let transition = existing
        .filter(|c| c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    let mut out: Vec<Condition> = others().collect();
    out.push(Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message,
        last_transition_time: transition,
        observed_generation: node.metadata.generation,
    });
    Some(out)
}

/// What a pass of live changes left to do.
#[derive(Debug, Default)]
pub struct Summary {
    /// Nodes whose mounted ACL file does not have the new revision yet.
    pub acl_pending: usize,
    /// With TLS: nodes that serve the TLS Secret's certificate and loaded its files.
    pub tls_serving: usize,
    /// With TLS: nodes that do not serve it yet (their mounted files are not updated).
    pub tls_pending: usize,
    /// Events for the ValkeyCluster: `SystemUsersRestored`, one per server whose system
    /// users were applied again.
    pub events: Vec<EventSpec>,
    /// The observed ValkeyNodes with what this pass wrote to their status.
    pub nodes: Vec<ValkeyNode>,
}

/// How long after a change of the CA bundle alone (the certificate unchanged) the pods are
/// reloaded again on every pass: a server's CA bundle cannot be read from outside, and the
/// kubelet may update a pod's mounted Secret files up to about a minute after the change.
pub const CA_SETTLE: std::time::Duration = std::time::Duration::from_secs(90);

/// The TLS files the pods should have loaded.
#[derive(Clone, Copy, Debug)]
pub enum TlsFiles<'a> {
    /// TLS is off: no `TLSCertificateApplied` condition.
    Off,
    /// The TLS Secret is missing or unusable (the cluster reports it): nothing is reloaded and
    /// the pods keep what they serve.
    Unusable,
    /// The Secret's material.
    Wanted(&'a Wanted),
}

/// Timeout of the TLS handshake that reads the certificate a pod serves.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// The `TLSCertificateApplied` message once `want` is in effect on a pod.
pub fn tls_applied_message(want: &Wanted) -> String {
    format!(
        "serving certificate sha256:{}, TLS Secret revision {} loaded",
        short(&want.fingerprint),
        want.revision
    )
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..16).unwrap_or(fingerprint)
}

/// Whether the node's `TLSCertificateApplied` condition already records `want` in effect (pure):
/// then the pod is not looked at (a restarted pod loads the mounted files it has).
pub fn tls_in_effect(node: &ValkeyNode, want: &Wanted) -> bool {
    condition(node, TLS_CERTIFICATE_APPLIED)
        .is_some_and(|c| c.status == "True" && c.message == tls_applied_message(want))
}

fn condition<'a>(node: &'a ValkeyNode, type_: &str) -> Option<&'a Condition> {
    node.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// The verdict after a reload (pure). `before`/`after`: the fingerprints served before and
/// after the reload; `pending_since`: when this revision's reload was first found pending
/// (the node's `PendingPropagation` condition for it), `None` when it was not.
pub fn tls_verdict(
    node: &ValkeyNode,
    want: &Wanted,
    before: &str,
    after: &str,
    now: &Time,
) -> LiveState {
    if after != want.fingerprint {
        return LiveState::Pending(format!(
            "the pod serves certificate sha256:{} while the TLS Secret has sha256:{} (revision {}): waiting for the kubelet to update the mounted files",
            short(after),
            short(&want.fingerprint),
            want.revision
        ));
    }
    // Serving the new certificate after the reload: the files of this revision were read
    // (the kubelet swaps all keys of a Secret volume at once).
    if before != want.fingerprint {
        return LiveState::Applied;
    }
    // The certificate is unchanged. A node with no record loaded the files it started with; a
    // node that recorded another revision had its CA bundle or key changed, which only shows
    // by waiting out the kubelet's update window while reloading.
    let Some(current) = condition(node, TLS_CERTIFICATE_APPLIED) else {
        return LiveState::Applied;
    };
    let marker = format!("revision {} ", want.revision);
    let since = if current.status == "False"
        && current.reason == PENDING_PROPAGATION
        && current.message.contains(&marker)
    {
        current.last_transition_time.0
    } else {
        now.0
    };
    let waited = now.0.duration_since(since).as_secs().max(0) as u64;
    if waited >= CA_SETTLE.as_secs() {
        return LiveState::Applied;
    }
    LiveState::Pending(format!(
        "the CA bundle of TLS Secret revision {} is reloaded on every pass until {} s after the change (the kubelet may update the mounted files until then)",
        want.revision,
        CA_SETTLE.as_secs()
    ))
}

/// Reads the certificate the pod at `addr` serves, reloads its TLS files and judges the
/// result (see [`tls_verdict`]).
async fn reload_tls(
    pool: &NodePool,
    addr: &str,
    node: &ValkeyNode,
    want: &Wanted,
    now: &Time,
) -> LiveState {
    let served = || async {
        served_certificate(addr, PROBE_TIMEOUT)
            .await
            .map(|der| fingerprint(&der))
    };
    let before = match served().await {
        Ok(f) => f,
        Err(e) => {
            debug!(node = %node.name_any(), error = %e, "served certificate not read");
            return LiveState::Unobserved;
        }
    };
    let files = [
        ("tls-cert-file", format!("{TLS_DIR}/tls.crt")),
        ("tls-key-file", format!("{TLS_DIR}/tls.key")),
        ("tls-ca-cert-file", format!("{TLS_DIR}/ca.crt")),
    ];
    let files: Vec<(&str, &str)> = files.iter().map(|(k, v)| (*k, v.as_str())).collect();
    if let Err(e) = tls_reload(pool, addr, &files).await {
        return LiveState::Failed(format!(
            "CONFIG SET tls-cert-file/tls-key-file/tls-ca-cert-file on {addr}: {e}"
        ));
    }
    match served().await {
        Ok(after) => {
            let verdict = tls_verdict(node, want, &before, &after, now);
            if before != after {
                info!(node = %node.name_any(), certificate = short(&after), "TLS certificate reloaded");
            }
            verdict
        }
        Err(e) => {
            debug!(node = %node.name_any(), error = %e, "served certificate not read");
            LiveState::Unobserved
        }
    }
}

/// What the live pass works from.
#[derive(Clone, Copy)]
pub struct Input<'a> {
    /// The ValkeyNodes as built this pass (their live settings and ACL revision).
    pub desired: &'a [ValkeyNode],
    /// The ValkeyNodes as observed (their status conditions).
    pub observed: &'a [ValkeyNode],
    /// The pods' addresses and reachability.
    pub topology: &'a Topology,
    /// The TLS files the pods should have loaded.
    pub tls: TlsFiles<'a>,
    /// The ACL file the pods should have loaded (applied user by user where `ACL LOAD` is
    /// unsafe, see `acl_load_unsafe`).
    pub acl_content: Option<&'a str>,
    /// The revision of that file (its marker user), `None` where no ACL is wanted.
    pub acl_revision: Option<&'a str>,
    /// Pod name → zone of its Kubernetes node, to set as `availability-zone`; `None` when the
    /// user sets it.
    pub zones: Option<&'a BTreeMap<String, String>>,
}

/// The server setting naming the node's zone (Valkey 8.0+).
pub const AVAILABILITY_ZONE: &str = "availability-zone";

/// The pods' zones the operator sets as their servers' `availability-zone`: none when the
/// user sets `availability-zone` in `spec.config` (theirs wins).
pub fn zones_to_set<'a>(
    spec: &valkey_api::ValkeyClusterSpec,
    pod_zones: &'a BTreeMap<String, String>,
) -> Option<&'a BTreeMap<String, String>> {
    let user_set = spec
        .config
        .iter()
        .flatten()
        .any(|(k, _)| k.eq_ignore_ascii_case(AVAILABILITY_ZONE));
    (!user_set).then_some(pod_zones)
}

/// First version with `availability-zone`.
const ZONES_SINCE: Version = Version::new(8, 0, 0);

/// Applies the live settings, the ACL and the TLS files of every ValkeyNode in `desired` to
/// its reachable pod, records `LiveConfigApplied`, `ACLApplied` and `TLSCertificateApplied` on
/// the observed ValkeyNodes when they change, and emits `LiveConfigApplyFailed` /
/// `LiveACLApplyFailed` / `TLSReloadFailed` when a node enters a failed state.
pub async fn apply_live(
    pool: &NodePool,
    api: &Api<ValkeyNode>,
    shared: &Shared,
    input: Input<'_>,
    now: &Time,
) -> Summary {
    let w = Writer { api, shared, now };
    let w = &w;
    // Every node at once (a bounded number in flight): a pass over a large cluster costs a
    // few round trips, not a few per node.
    let per_node = map_in_order(input.observed, LIVE_CONCURRENCY, |node| async move {
        let mut summary = Summary::default();
        live_node(pool, w, input, node, &mut summary).await;
        summary
    })
    .await;
    let mut summary = Summary::default();
    for s in per_node {
        summary.acl_pending += s.acl_pending;
        summary.tls_serving += s.tls_serving;
        summary.tls_pending += s.tls_pending;
        summary.events.extend(s.events);
        summary.nodes.extend(s.nodes);
    }
    summary
}

/// How many nodes the live pass works on at once.
const LIVE_CONCURRENCY: usize = 32;

/// The live pass of one observed node, into `summary`.
async fn live_node(
    pool: &NodePool,
    w: &Writer<'_>,
    input: Input<'_>,
    node: &ValkeyNode,
    summary: &mut Summary,
) {
    let Input {
        desired,
        topology,
        tls,
        acl_content,
        acl_revision,
        zones,
        ..
    } = input;
    let Some(want) = desired.iter().find(|d| d.name_any() == node.name_any()) else {
        summary.nodes.push(node.clone());
        return;
    };
    // Live keys set before: those of the spec as observed, and those recorded in status.
    let mut previously: Vec<String> = node
        .status
        .as_ref()
        .map(|s| s.live_config_keys.clone())
        .unwrap_or_default();
    previously.extend(
        node.spec
            .config
            .live
            .iter()
            .flatten()
            .map(|(k, _)| k.clone()),
    );
    let mut node = node.clone();
    let before = ClusterFields::of(&node);
    node.spec.config.live = want.spec.config.live.clone();
    let addr = topology
        .at(node.spec.shard_index, node.spec.node_index)
        .filter(|m| m.view.is_some())
        .map(|m| m.addr.to_string());
    let addr = addr.as_deref();

    let member = topology.at(node.spec.shard_index, node.spec.node_index);
    let version = member.and_then(|m| m.view.as_ref()?.version);
    let zone = member
        .filter(|_| version.is_some_and(|v| v >= ZONES_SINCE))
        .and_then(|m| zones?.get(&m.pod))
        .map(String::as_str);
    live_config(pool, w, &mut node, want, &previously, addr, zone).await;
    let acl = acl_revision.map(|revision| AclFile {
        content: acl_content.unwrap_or_default(),
        revision,
    });
    let (node_ref, acl) = (&mut node, acl.as_ref());
    acl_file(pool, w, node_ref, acl, addr, version, summary).await;
    tls_files(pool, w, &mut node, tls, addr, summary).await;
    if let Some(role) = member.and_then(live_role) {
        node.status.get_or_insert_with(Default::default).role = Some(role.to_owned());
    }
    write_changes(w.api, &node, &before).await;
    summary.nodes.push(node);
}

/// The live role of a member for `ValkeyNode.status.role` (`primary` or `replica`), `None`
/// while it cannot be observed.
pub fn live_role(member: &Member) -> Option<&'static str> {
    let me = member.me()?;
    if me.is_primary() {
        Some("primary")
    } else if me.is_replica() {
        Some("replica")
    } else {
        None
    }
}

/// Where the live pass records what it did.
struct Writer<'a> {
    api: &'a Api<ValkeyNode>,
    shared: &'a Shared,
    now: &'a Time,
}

/// The user's live settings on `node`'s server (`CONFIG SET`); a live key the user removed
/// (`previously` set) returns to Valkey's default; `zone` becomes its `availability-zone`.
/// Records `LiveConfigApplied` and the keys.
async fn live_config(
    pool: &NodePool,
    w: &Writer<'_>,
    node: &mut ValkeyNode,
    want: &ValkeyNode,
    previously: &[String],
    addr: Option<&str>,
    zone: Option<&str>,
) {
    let Writer { shared, now, .. } = *w;
    let user_keys: Vec<&str> = want
        .spec
        .config
        .live
        .iter()
        .flatten()
        .map(|(k, _)| k.as_str())
        .collect();
    let mut params = live_settings(want.spec.config.live.as_ref(), previously);
    params.extend(zone.map(|z| (AVAILABILITY_ZONE, z)));
    let config = match addr {
        _ if params.is_empty() => LiveState::Applied,
        None => LiveState::Unobserved,
        Some(a) => match config_set(pool, a, &params).await {
            Ok(changed) => {
                if !changed.is_empty() {
                    info!(node = %node.name_any(), ?changed, "live settings applied");
                }
                LiveState::Applied
            }
            Err(e) => LiveState::Failed(format!("CONFIG SET on {a}: {e}")),
        },
    };
    let applied = format!("live settings in effect: {}", user_keys.join(", "));
    let conditions = updated_conditions(
        node,
        LIVE_CONFIG_APPLIED,
        !user_keys.is_empty() || matches!(config, LiveState::Failed(_)),
        &config,
        &applied,
        now,
    );
    // Once applied, the status records exactly the user's keys (a removed one is reset).
    let recorded = node
        .status
        .as_ref()
        .map_or(&[][..], |s| &s.live_config_keys);
    let keys = (config == LiveState::Applied && recorded.iter().ne(&user_keys))
        .then(|| user_keys.iter().map(|k| (*k).to_owned()).collect());
    let update = Update {
        conditions,
        live_config_keys: keys,
        ..Update::default()
    };
    record(shared, node, update, &config, LIVE_CONFIG_APPLY_FAILED).await;
}

/// The ACL `file` (`None`: none wanted) on `node`'s server (see [`acl_in_effect`]); records
/// `ACLApplied` and the system-user digest, and a `SystemUsersRestored` event when they had
/// been changed.
async fn acl_file(
    pool: &NodePool,
    w: &Writer<'_>,
    node: &mut ValkeyNode,
    file: Option<&AclFile<'_>>,
    addr: Option<&str>,
    version: Option<Version>,
    summary: &mut Summary,
) {
    let Writer { shared, now, .. } = *w;
    let recorded = node
        .status
        .as_ref()
        .and_then(|s| s.system_users_digest.clone());
    let mut digest = None;
    let wanted = file.is_some();
    let acl = match (addr, version, file) {
        (Some(a), Some(version), Some(file)) => {
            match acl_in_effect(pool, a, file, version, recorded.as_deref()).await {
                Ok(effect) => {
                    if effect.restored {
                        let pod = node.status.as_ref().and_then(|s| s.pod_name.clone());
                        warn!(node = %node.name_any(), "system users were changed on the server; applied again");
                        summary.events.push(EventSpec::warning(
                            SYSTEM_USERS_RESTORED,
                            "ApplyACL",
                            format!(
                                "the system users on pod {} were changed on the server \
                                 (by a user allowed to change ACLs); applied them again \
                                 from the ACL file",
                                pod.unwrap_or_else(|| node.name_any())
                            ),
                        ));
                    }
                    digest = Some(effect.digest);
                    LiveState::Applied
                }
                Err(CommandError::NotReady(m)) => {
                    summary.acl_pending += 1;
                    LiveState::Pending(m)
                }
                Err(e) => LiveState::Failed(format!("ACL LOAD on {a}: {e}")),
            }
        }
        _ => LiveState::Unobserved,
    };
    let applied = format!(
        "ACL revision {} in effect",
        file.map(|f| f.revision).unwrap_or_default()
    );
    let conditions = updated_conditions(node, ACL_APPLIED, wanted, &acl, &applied, now);
    let digest = digest.filter(|d| recorded.as_ref() != Some(d));
    let update = Update {
        conditions,
        system_users_digest: digest,
        ..Update::default()
    };
    record(shared, node, update, &acl, LIVE_ACL_APPLY_FAILED).await;
}

/// The TLS files on `node`'s server (reloaded when it does not serve the wanted certificate);
/// records `TLSCertificateApplied`.
async fn tls_files(
    pool: &NodePool,
    w: &Writer<'_>,
    node: &mut ValkeyNode,
    tls: TlsFiles<'_>,
    addr: Option<&str>,
    summary: &mut Summary,
) {
    let Writer { shared, now, .. } = *w;
    let outcome = match tls {
        TlsFiles::Off | TlsFiles::Unusable => LiveState::Unobserved,
        TlsFiles::Wanted(want) if tls_in_effect(node, want) => LiveState::Applied,
        TlsFiles::Wanted(want) => match addr {
            Some(a) => reload_tls(pool, a, node, want, now).await,
            None => LiveState::Unobserved,
        },
    };
    match &outcome {
        LiveState::Applied => summary.tls_serving += 1,
        LiveState::Unobserved => {}
        _ => summary.tls_pending += 1,
    }
    let applied = match tls {
        TlsFiles::Wanted(want) => tls_applied_message(want),
        _ => String::new(),
    };
    let wanted = !matches!(tls, TlsFiles::Off);
    if let Some(c) = updated_conditions(
        node,
        TLS_CERTIFICATE_APPLIED,
        wanted,
        &outcome,
        &applied,
        now,
    ) {
        let update = Update {
            conditions: Some(c),
            ..Update::default()
        };
        record(shared, node, update, &outcome, TLS_RELOAD_FAILED).await;
    }
}

/// A status update of a ValkeyNode: its whole condition list, the live keys and the
/// system-user digest, each when it changes (nothing is written when none does).
#[derive(Default)]
struct Update {
    conditions: Option<Vec<Condition>>,
    live_config_keys: Option<Vec<String>>,
    system_users_digest: Option<String>,
}

/// The ACL file the pods should have loaded.
struct AclFile<'a> {
    content: &'a str,
    revision: &'a str,
}

/// A server's ACL once [`acl_in_effect`] applied what was needed.
struct AclEffect {
    /// `<version> <digest of the system users>` (see `ValkeyNodeStatus::system_users_digest`).
    digest: String,
    /// Whether the system users had been changed on the server and were applied again.
    restored: bool,
}

/// Brings the server at `addr` (of `version`) to the ACL `file`: loads it when the server has
/// another revision (`ACL LOAD`, or user by user where that is unsafe), and applies the
/// system users again when the server lists them otherwise than when they were last applied
/// (`recorded`; `None` for a node not checked before, or a new server version, which are
/// applied again silently). A change found on the server is reported as restored also when a
/// new revision is what applies them again (a change made while the ACL file changed).
async fn acl_in_effect(
    pool: &NodePool,
    addr: &str,
    file: &AclFile<'_>,
    version: Version,
    recorded: Option<&str>,
) -> Result<AclEffect, CommandError> {
    let state = acl_state(pool, addr).await?;
    let digest = format!("{version} {}", state.system_digest);
    // Changed on the server since the operator last recorded them (same server version).
    let changed =
        recorded.is_some_and(|r| r != digest && r.split(' ').next() == Some(&*version.to_string()));
    if state.revision.as_deref() != Some(file.revision) {
        let loaded = if acl_load_unsafe(version) {
            acl_apply(pool, addr, file.content, file.revision).await?
        } else {
            acl_load(pool, addr, file.revision).await?
        };
        debug!(%addr, ?loaded, "ACL revision in effect");
        let state = acl_state(pool, addr).await?;
        // The new revision set the system users again: if someone had changed them, say so.
        return Ok(AclEffect {
            digest: format!("{version} {}", state.system_digest),
            restored: changed,
        });
    }
    if recorded == Some(digest.as_str()) {
        return Ok(AclEffect {
            digest,
            restored: false,
        });
    }
    restore_system_users(pool, addr, file.content).await?;
    let state = acl_state(pool, addr).await?;
    Ok(AclEffect {
        digest: format!("{version} {}", state.system_digest),
        restored: changed,
    })
}

/// Stages the node's live-change conditions, live keys and system-user digest in `node` (the
/// live pass of the node writes them once, see [`write_changes`]) and, for a failure,
/// publishes the Warning event `failed_event`.
async fn record(
    shared: &Shared,
    node: &mut ValkeyNode,
    update: Update,
    outcome: &LiveState,
    failed_event: &'static str,
) {
    let status = node.status.get_or_insert_with(Default::default);
    if let Some(conditions) = update.conditions {
        status.conditions = conditions;
    }
    if let Some(keys) = update.live_config_keys {
        status.live_config_keys = keys;
    }
    if let Some(d) = update.system_users_digest {
        status.system_users_digest = Some(d);
    }
    if let LiveState::Failed(message) = outcome {
        warn!(node = %node.name_any(), %message, reason = failed_event, "live change not applied");
        let ev = EventSpec::warning(failed_event, "ApplyLive", message.clone());
        shared.publish(&node.object_ref(&()), &[ev]).await;
    }
}

/// Writes the cluster controller's fields of `node` (its live-change conditions, live keys,
/// system-user digest and live `role`; see `node/status_writes.rs`) when they differ from
/// `before`: one write per node and pass, however many of them changed. A refused write is
/// tried again by the next pass, which reads the node afresh.
async fn write_changes(api: &Api<ValkeyNode>, node: &ValkeyNode, before: &ClusterFields) {
    let after = ClusterFields::of(node);
    if after == *before {
        return;
    }
    if let Err(e) = apply_cluster_fields(api, &node.name_any(), &after).await {
        debug!(node = %node.name_any(), error = %e, "could not record the node's live state");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn node(live: &[(&str, &str)], conditions: Vec<Condition>) -> ValkeyNode {
        let mut n: ValkeyNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyNode",
            "metadata": {"name": "c-0-0", "generation": 3},
            "spec": {"clusterName": "c", "shardIndex": 0, "nodeIndex": 0,
                     "image": "valkey/valkey:9.0.0", "terminationGracePeriodSeconds": 30},
        }))
        .expect("valkeynode");
        if !live.is_empty() {
            n.spec.config.live = Some(
                live.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
        }
        n.status = Some(valkey_api::ValkeyNodeStatus {
            conditions,
            ..Default::default()
        });
        n
    }

    /// `LiveConfigApplied` as the reconcile pass computes it.
    fn live(n: &ValkeyNode, outcome: &LiveState, now: &Time) -> Option<Vec<Condition>> {
        let wanted = n.spec.config.live.as_ref().is_some_and(|l| !l.is_empty());
        updated_conditions(n, LIVE_CONFIG_APPLIED, wanted, outcome, "applied", now)
    }

    fn at(s: i64) -> Time {
        Time(Timestamp::from_second(s).expect("time"))
    }

    #[test]
    fn zones_are_set_unless_the_user_sets_availability_zone() {
        let zones = BTreeMap::from([("p".to_owned(), "zone-a".to_owned())]);
        let spec = |v: serde_json::Value| -> valkey_api::ValkeyClusterSpec {
            serde_json::from_value(v).expect("spec")
        };
        let plain = spec(serde_json::json!({"shards": 1}));
        assert_eq!(zones_to_set(&plain, &zones), Some(&zones));
        let own = spec(serde_json::json!({"shards": 1, "config": {"Availability-Zone": "x"}}));
        assert_eq!(zones_to_set(&own, &zones), None);
    }

    #[test]
    fn applied_once_then_no_writes() {
        let n = node(&[("maxmemory", "64mb")], vec![]);
        let c = live(&n, &LiveState::Applied, &at(10)).expect("set");
        let cond = c
            .iter()
            .find(|c| c.type_ == LIVE_CONFIG_APPLIED)
            .expect("condition");
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("True", APPLIED)
        );
        assert_eq!(cond.observed_generation, Some(3));
        let mut n = node(&[("maxmemory", "64mb")], c);
        assert_eq!(live(&n, &LiveState::Applied, &at(20)), None);
        assert_eq!(live(&n, &LiveState::Unobserved, &at(20)), None);
        // A new generation of the node is acknowledged once, keeping the transition time.
        n.metadata.generation = Some(4);
        let c = live(&n, &LiveState::Applied, &at(30)).expect("set");
        assert_eq!(c[0].observed_generation, Some(4));
        assert_eq!(c[0].last_transition_time, at(10));
    }

    #[test]
    fn failure_is_recorded_and_other_conditions_kept() {
        let ready = Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "PodRunning".into(),
            message: String::new(),
            last_transition_time: at(1),
            observed_generation: Some(3),
        };
        let n = node(&[("maxclients", "10")], vec![ready.clone()]);
        let c = live(&n, &LiveState::Failed("refused".into()), &at(10)).expect("set");
        assert_eq!(c[0], ready);
        assert_eq!(
            (c[1].status.as_str(), c[1].reason.as_str()),
            ("False", APPLY_FAILED)
        );
        assert_eq!(c[1].last_transition_time, at(10));
    }

    #[test]
    fn condition_removed_when_no_live_setting_is_left() {
        let n = node(&[("maxmemory", "64mb")], vec![]);
        let c = live(&n, &LiveState::Applied, &at(10)).expect("set");
        let n = node(&[], c);
        assert_eq!(live(&n, &LiveState::Applied, &at(20)), Some(vec![]));
        let n = node(&[], vec![]);
        assert_eq!(live(&n, &LiveState::Applied, &at(20)), None);
    }

    #[test]
    fn acl_pending_until_the_file_has_the_revision() {
        let n = node(&[], vec![]);
        let pending = LiveState::Pending("file has revision a, expected b".into());
        let c = updated_conditions(&n, ACL_APPLIED, true, &pending, "rev b", &at(10)).expect("set");
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_str()),
            ("False", PENDING_PROPAGATION)
        );
        let n = node(&[], c);
        let c = updated_conditions(&n, ACL_APPLIED, true, &LiveState::Applied, "rev b", &at(20))
            .expect("set");
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_str()),
            ("True", APPLIED)
        );
        assert_eq!(c[0].last_transition_time, at(20));
    }

    fn want() -> Wanted {
        Wanted {
            fingerprint: "b".repeat(64),
            revision: "r2".into(),
        }
    }

    fn tls_condition(status: &str, reason: &str, message: String, since: i64) -> Condition {
        Condition {
            type_: TLS_CERTIFICATE_APPLIED.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: at(since),
            observed_generation: Some(3),
        }
    }

    #[test]
    fn tls_new_certificate_applied_once_served() {
        let old = "a".repeat(64);
        let new = "b".repeat(64);
        let w = want();
        let n = node(&[], vec![]);
        // The mounted files are not updated yet: the pod still serves the old certificate.
        let o = tls_verdict(&n, &w, &old, &old, &at(10));
        assert!(
            matches!(&o, LiveState::Pending(m) if m.contains("waiting for the kubelet")),
            "{o:?}"
        );
        // Served after the reload: in effect.
        assert_eq!(tls_verdict(&n, &w, &old, &new, &at(10)), LiveState::Applied);
        // A node with no record that already serves it (a new pod) is in effect.
        assert_eq!(tls_verdict(&n, &w, &new, &new, &at(10)), LiveState::Applied);
        // Recorded in effect: the pod is not looked at again.
        let applied = tls_condition("True", APPLIED, tls_applied_message(&w), 10);
        assert!(tls_in_effect(&node(&[], vec![applied]), &w));
    }

    #[test]
    fn tls_ca_bundle_change_is_reloaded_until_the_kubelet_window_passed() {
        let same = "b".repeat(64);
        let w = want();
        let previous = Wanted {
            fingerprint: same.clone(),
            revision: "r1".into(),
        };
        let n = node(
            &[],
            vec![tls_condition(
                "True",
                APPLIED,
                tls_applied_message(&previous),
                5,
            )],
        );
        assert!(!tls_in_effect(&n, &w));
        let o = tls_verdict(&n, &w, &same, &same, &at(100));
        let LiveState::Pending(message) = o else {
            panic!("{o:?}")
        };
        assert!(message.contains("revision r2 "), "{message}");
        // Pending since 100 s: reloaded again until 190 s, then in effect.
        let n = node(
            &[],
            vec![tls_condition("False", PENDING_PROPAGATION, message, 100)],
        );
        assert!(matches!(
            tls_verdict(&n, &w, &same, &same, &at(150)),
            LiveState::Pending(_)
        ));
        assert_eq!(
            tls_verdict(&n, &w, &same, &same, &at(190)),
            LiveState::Applied
        );
        // Pending for another revision does not count.
        let other = Wanted {
            revision: "r3".into(),
            ..w.clone()
        };
        assert!(matches!(
            tls_verdict(&n, &other, &same, &same, &at(500)),
            LiveState::Pending(_)
        ));
    }
}
