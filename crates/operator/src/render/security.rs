//! Security contexts: the restricted Pod Security Standard by default, for every pod the
//! operator renders (pure).
//!
//! The pods run as the `valkey` user of the official image (uid and gid 999) without
//! privileges: no escalation, no capabilities, the `RuntimeDefault` seccomp profile and a
//! read-only root filesystem (the server writes only `/data` and `/tmp`, both volumes).
//! `fsGroup` makes a volume writable by that user, also one an older version wrote as root
//! (`OnRootMismatch`: the kubelet fixes the ownership once, not at every start).

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

/// The uid and gid of the `valkey` user in the official image.
pub const VALKEY_UID: i64 = 999;

/// The pod security context when the cluster sets none.
pub fn default_pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(VALKEY_UID),
        run_as_group: Some(VALKEY_UID),
        fs_group: Some(VALKEY_UID),
        fs_group_change_policy: Some("OnRootMismatch".into()),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container security context when the cluster sets none.
pub fn default_container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        read_only_root_filesystem: Some(true),
        ..Default::default()
    }
}

/// The pod security context of a cluster: its own, or the default.
pub fn pod_security_context(own: Option<&PodSecurityContext>) -> PodSecurityContext {
    own.cloned().unwrap_or_else(default_pod_security_context)
}

/// A container's security context: its own, or the default.
pub fn container_security_context(own: Option<&SecurityContext>) -> SecurityContext {
    own.cloned()
        .unwrap_or_else(default_container_security_context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_meet_the_restricted_standard_and_a_cluster_value_replaces_them() {
        let pod = pod_security_context(None);
        assert_eq!(pod.run_as_non_root, Some(true));
        assert_eq!(pod.run_as_user, Some(999));
        assert_eq!(pod.fs_group, Some(999));
        assert_eq!(pod.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let c = container_security_context(None);
        assert_eq!(c.allow_privilege_escalation, Some(false));
        assert_eq!(c.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        assert_eq!(c.read_only_root_filesystem, Some(true));
        let own = SecurityContext {
            read_only_root_filesystem: Some(false),
            ..Default::default()
        };
        assert_eq!(container_security_context(Some(&own)), own);
    }
}
