//! The user-rule check, a stage of its own between observation and building: each user's ACL
//! rules are judged by a server of the cluster (on a disabled scratch user it creates and
//! deletes), so a file Valkey would refuse as a whole is never written. The verdicts are
//! remembered per image and rules ([`Verdicts`]), so each is asked once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use valkey_ops::Topology;
use valkey_ops::client::NodePool;
use valkey_ops::commands::check_user_rules;

use crate::render;

/// Servers' verdicts on users' ACL rules, by image and rules: `None` accepted,
/// `Some(reason)` refused.
#[derive(Default)]
pub struct Verdicts(Mutex<HashMap<String, Option<String>>>);

impl Verdicts {
    fn get(&self, key: &str) -> Option<Option<String>> {
        let v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.get(key).cloned()
    }

    fn record(&self, key: String, verdict: Option<String>) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        v.insert(key, verdict);
    }
}

/// Each user's rules (see [`render::acl::user_rules`]) as judged by a reachable server of the
/// cluster on a disabled scratch user, remembered per image and rules so each is asked once;
/// `Unchecked` while no server can be asked (a new cluster's first pass: the user enters the
/// file a pass later).
pub async fn check(
    verdicts: &Verdicts,
    pool: &NodePool,
    spec: &valkey_api::ValkeyClusterSpec,
    topology: &Topology,
) -> BTreeMap<String, RulesVerdict> {
    use sha2::Digest;
    let server = topology.reachable().next().map(|m| m.addr.to_string());
    let mut out = BTreeMap::new();
    for user in spec.users.iter().flatten() {
        let rules = render::acl::user_rules(user);
        let key = hex::encode(sha2::Sha256::digest(format!(
            "{}\n{}",
            spec.image,
            rules.join(" ")
        )));
        let verdict = match verdicts.get(&key) {
            Some(v) => Some(v),
            None => match &server {
                None => None,
                Some(addr) => match check_user_rules(pool, addr, &key[..12], &rules).await {
                    Ok(v) => {
                        verdicts.record(key, v.clone());
                        Some(v)
                    }
                    Err(e) => {
                        tracing::debug!(user = %user.name, error = %e, "user rules not checked");
                        None
                    }
                },
            },
        };
        let verdict = match verdict {
            None => RulesVerdict::Unchecked,
            Some(None) => RulesVerdict::Accepted,
            Some(Some(reason)) => RulesVerdict::Refused(reason),
        };
        out.insert(user.name.clone(), verdict);
    }
    out
}

/// A server's verdict on a user's ACL rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RulesVerdict {
    /// A server accepted them.
    Accepted,
    /// A server refused them, for this reason.
    Refused(String),
    /// No server could be asked yet.
    Unchecked,
}
