//! Building (pure): every object the ValkeyCluster controller writes, from the cluster and what
//! the pass observed (the system passwords in effect, the users' password Secrets, each
//! ValkeyNode's current workload revision).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use valkey_api::{ValkeyCluster, ValkeyNode};

use super::config_gate::Gate;
use super::observe::Observed;
use super::rule_check::RulesVerdict;
use crate::render;
use crate::render::acl::{AclFile, previous_line, render_acl_file, resolve_user_passwords};
use crate::render::valkeynode::valkey_nodes;
use crate::status::{Child, ChildFailure};

/// Why an object could not be built as the spec asks.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Users held out of the ACL file (a missing password Secret or key, or rules Valkey
    /// refuses): each keeps its previous rules or is left out; every other user is written.
    #[error("{0}")]
    HeldUsers(String),
}

impl BuildError {
    /// As the child failure the status reports.
    pub fn failure(&self) -> ChildFailure {
        match self {
            Self::HeldUsers(m) => ChildFailure::new(Child::UsersAcl, m.clone()),
        }
    }
}

/// The objects a pass applies.
#[derive(Debug)]
pub struct Desired {
    /// The system users Secret.
    pub system_secret: Secret,
    /// Its backup.
    pub system_backup_secret: Secret,
    /// The rendered ACL file and its Secret.
    pub acl: (AclFile, Secret),
    /// Users held out of the ACL file, and why.
    pub acl_problem: Option<BuildError>,
    /// Users whose rules no server could check yet (they enter the file once checked).
    pub users_unchecked: usize,
    /// The headless Service.
    pub service: Service,
    /// The `valkey.conf` ConfigMap.
    pub config_map: ConfigMap,
    /// The PodDisruptionBudgets of `podDisruptionBudget.mode` (none when disabled; those it
    /// owns and does not list are deleted).
    pub pdbs: Vec<PodDisruptionBudget>,
    /// The NetworkPolicy, `None` when not enabled (an existing one is deleted).
    pub network_policy: Option<NetworkPolicy>,
    /// A ValkeyNode per position of the layout, with its current workload revision (none
    /// while no configuration was ever accepted, see [`super::config_gate`]).
    pub nodes: Vec<ValkeyNode>,
    /// The config-check pod to create, if one is needed.
    pub check_pod: Option<Pod>,
    /// Config-check pods to delete.
    pub finished_checks: Vec<String>,
}

/// Builds every object of `vc` (with the image and settings the config `gate` lets through,
/// see [`Gate::effective_cluster`]) from what was observed, and the gate's check pods.
pub fn build(
    vc: &ValkeyCluster,
    observed: &Observed,
    user_rules: &BTreeMap<String, RulesVerdict>,
    gate: &Gate,
) -> Desired {
    let name = vc.name_any();
    let ns = vc.namespace().unwrap_or_default();
    let owner = render::owner_reference(vc);
    let owner_for_acl = owner.clone();
    let spec = &vc.spec;
    let users = users_acl(vc, observed, user_rules);
    // Each node keeps the workload revision it has: a pending pod-template change is
    // authorized by planning, not here.
    let nodes = if gate.effective.is_some() {
        valkey_nodes(vc, owner.clone(), |n| {
            observed.node(n)?.spec.workload_revision.clone()
        })
    } else {
        Vec::new()
    };
    Desired {
        system_secret: render::secrets::system_secret(
            &name,
            &ns,
            &observed.passwords,
            owner.clone(),
        ),
        system_backup_secret: render::secrets::system_backup_secret(
            &name,
            &ns,
            &observed.passwords,
            owner.clone(),
        ),
        service: render::service::service(&name, &ns, owner.clone()),
        config_map: render::valkey_conf::config_map(&name, &ns, spec, owner.clone()),
        pdbs: render::pdb::pod_disruption_budgets(&name, &ns, spec, owner.clone()),
        network_policy: render::network_policy::network_policy(&name, &ns, spec, owner),
        nodes,
        acl: (
            users.file.clone(),
            render::secrets::acl_secret(&name, &ns, &users.file.content, owner_for_acl),
        ),
        acl_problem: users.problem,
        users_unchecked: users.unchecked,
        check_pod: gate.create.clone(),
        finished_checks: gate.delete.clone(),
    }
}

/// The users' ACL file of a pass and what kept users out of it.
struct UsersAcl {
    file: AclFile,
    problem: Option<BuildError>,
    unchecked: usize,
}

/// Renders the users' ACL file: a user whose password Secret or key is missing, or whose rules
/// a server refused or has not checked yet, keeps its line of the current file (or is left
/// out); the problems are named, one per user.
fn users_acl(
    vc: &ValkeyCluster,
    observed: &Observed,
    user_rules: &BTreeMap<String, RulesVerdict>,
) -> UsersAcl {
    let spec = &vc.spec;
    let resolved = resolve_user_passwords(spec, &observed.user_secrets);
    let previous = observed
        .acl_secret
        .as_ref()
        .and_then(|s| s.data.as_ref()?.get(render::paths::ACL_KEY))
        .and_then(|b| String::from_utf8(b.0.clone()).ok());
    let mut held: std::collections::BTreeMap<String, Option<String>> = resolved
        .problems
        .iter()
        .map(|e| (e.user().to_owned(), Some(e.to_string())))
        .collect();
    let mut unchecked = 0;
    for (user, verdict) in user_rules {
        match verdict {
            RulesVerdict::Accepted => {}
            RulesVerdict::Refused(why) => {
                held.entry(user.clone()).or_insert_with(|| {
                    Some(format!(
                        "Valkey refuses the rules of user {user:?} (spec.users[].commands, keys, channels or permissions): {why}"
                    ))
                });
            }
            RulesVerdict::Unchecked => {
                unchecked += 1;
                held.entry(user.clone()).or_insert(None);
            }
        }
    }
    let names: std::collections::BTreeSet<String> = held.keys().cloned().collect();
    let file = render_acl_file(
        spec,
        &observed.passwords,
        &resolved.passwords,
        &names,
        previous.as_deref(),
    );
    let problems: Vec<String> = held
        .iter()
        .filter_map(|(user, why)| {
            let why = why.as_ref()?;
            let kept = previous
                .as_deref()
                .and_then(|p| previous_line(p, user))
                .is_some();
            Some(if kept {
                format!("{why}: user {user:?} keeps its previous rules")
            } else {
                format!("{why}: user {user:?} is not created until this is fixed")
            })
        })
        .collect();
    UsersAcl {
        file,
        problem: (!problems.is_empty()).then(|| BuildError::HeldUsers(problems.join("; "))),
        unchecked,
    }
}
