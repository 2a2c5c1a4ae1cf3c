//! Building (pure): every object the ValkeyCluster controller writes, from the cluster and what
//! the pass observed (the system passwords in effect, the users' password Secrets, each
//! ValkeyNode's current workload revision).

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use valkey_api::{ValkeyCluster, ValkeyNode};

use super::config_gate::Gate;
use super::observe::Observed;
use crate::render;
use crate::render::acl::{AclError, AclFile, render_acl_file, resolve_user_passwords};
use crate::render::valkeynode::valkey_nodes;
use crate::status::{Child, ChildFailure};

/// Why an object could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A user's password Secret or key is missing: the ACL Secret is not rewritten.
    #[error(transparent)]
    UserPasswords(#[from] AclError),
}

impl BuildError {
    /// As the child failure the status reports.
    pub fn failure(&self) -> ChildFailure {
        match self {
            Self::UserPasswords(e) => ChildFailure::new(Child::UsersAcl, e.to_string()),
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
    /// The rendered ACL file and its Secret, unless a user's password could not be resolved.
    pub acl: Result<(AclFile, Secret), BuildError>,
    /// The headless Service.
    pub service: Service,
    /// The `valkey.conf` ConfigMap.
    pub config_map: ConfigMap,
    /// The PodDisruptionBudget, `None` when disabled (an existing one is deleted).
    pub pdb: Option<PodDisruptionBudget>,
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
pub fn build(vc: &ValkeyCluster, observed: &Observed, gate: &Gate) -> Desired {
    let name = vc.name_any();
    let ns = vc.namespace().unwrap_or_default();
    let owner = render::owner_reference(vc);
    let spec = &vc.spec;
    let acl = resolve_user_passwords(spec, &observed.user_secrets)
        .map(|users| {
            let file = render_acl_file(spec, &observed.passwords, &users);
            let secret = render::secrets::acl_secret(&name, &ns, &file.content, owner.clone());
            (file, secret)
        })
        .map_err(BuildError::from);
    let acl_revision = acl.as_ref().ok().map(|(f, _)| f.revision.as_str());
    // Each node keeps the workload revision it has: a pending pod-template change is
    // authorized by planning, not here.
    let nodes = if gate.effective.is_some() {
        valkey_nodes(vc, acl_revision, owner.clone(), |n| {
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
        config_map: render::config::config_map(&name, &ns, spec, owner.clone()),
        pdb: render::pdb::pod_disruption_budget(&name, &ns, spec, owner),
        nodes,
        acl,
        check_pod: gate.create.clone(),
        finished_checks: gate.delete.clone(),
    }
}
