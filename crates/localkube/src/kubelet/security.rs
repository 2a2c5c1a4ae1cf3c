//! `securityContext` → the identity of a container's processes, with the
//! kubelet's `runAsNonRoot` verification.
//!
//! As a container runtime does: the uid is `runAsUser` (container over
//! pod), else the image's user; the gid is `runAsGroup`, else the user's
//! primary group in the container's `/etc/passwd` (localkube's container
//! root is the host's), else 0; the supplementary groups are that gid, the
//! user's memberships in `/etc/group`, the pod's `supplementalGroups` and
//! `fsGroup`. Exec probes, hooks and `kubectl exec` run with the same ids.

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;

use crate::runtime::ProcessUser;

/// The kubelet's `format.Pod`: `name_namespace(uid)`.
fn pod_ref(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.name_any(),
        pod.namespace().unwrap_or_default(),
        pod.uid().unwrap_or_default()
    )
}

fn id(v: i64, what: &str) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("invalid {what} {v}"))
}

/// The identity of container `c`'s processes, or the message of a
/// `CreateContainerConfigError`. `None`: root with the kubelet's own groups
/// (no field asks for anything else). `image_user` is the image's numeric
/// `USER` if known.
pub fn process_user(
    pod: &Pod,
    c: &Container,
    image_user: Option<u32>,
) -> Result<Option<ProcessUser>, String> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = c.security_context.as_ref();
    let run_as_user = csc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user));
    let run_as_group = csc
        .and_then(|s| s.run_as_group)
        .or(psc.and_then(|s| s.run_as_group));
    let non_root = csc
        .and_then(|s| s.run_as_non_root)
        .or(psc.and_then(|s| s.run_as_non_root))
        == Some(true);
    if non_root {
        match (run_as_user, image_user) {
            (Some(0), _) => {
                return Err(format!(
                    "container's runAsUser breaks non-root policy (pod: {:?}, container: {})",
                    pod_ref(pod),
                    c.name
                ));
            }
            (None, Some(0)) => {
                return Err(format!(
                    "container has runAsNonRoot and image will run as root (pod: {:?}, container: {})",
                    pod_ref(pod),
                    c.name
                ));
            }
            _ => {}
        }
    }
    let supplemental: Vec<i64> = psc
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default();
    let fs_group = psc.and_then(|s| s.fs_group);
    if run_as_user.is_none()
        && run_as_group.is_none()
        && supplemental.is_empty()
        && fs_group.is_none()
        && image_user.unwrap_or(0) == 0
    {
        return Ok(None);
    }
    let uid = match run_as_user {
        Some(u) => id(u, "runAsUser")?,
        None => image_user.unwrap_or(0),
    };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
    let account = passwd_entry(&passwd, uid);
    let gid = match run_as_group {
        Some(g) => id(g, "runAsGroup")?,
        None => account.as_ref().map_or(0, |(_, g)| *g),
    };
    let mut groups = vec![gid];
    if let Some((name, _)) = &account {
        groups.extend(memberships(&group, name));
    }
    for g in supplemental.into_iter().chain(fs_group) {
        groups.push(id(g, "group")?);
    }
    groups.sort_unstable();
    groups.dedup();
    Ok(Some(ProcessUser { uid, gid, groups }))
}

/// Name and primary gid of `uid` in a passwd file.
fn passwd_entry(passwd: &str, uid: u32) -> Option<(String, u32)> {
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 4 || f[2].parse::<u32>().ok()? != uid {
            return None;
        }
        Some((f[0].to_string(), f[3].parse().ok()?))
    })
}

/// The gids of the groups of a group file that list `user` as a member.
fn memberships(group: &str, user: &str) -> Vec<u32> {
    group
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 4 && f[3].split(',').any(|m| m == user))
                .then(|| f[2].parse().ok())
                .flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> (Pod, Container) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap();
        let c = pod.spec.as_ref().unwrap().containers[0].clone();
        (pod, c)
    }

    #[test]
    fn nothing_asked_keeps_root() {
        let (p, c) = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(process_user(&p, &c, Some(0)), Ok(None));
        assert_eq!(process_user(&p, &c, None), Ok(None));
    }

    #[test]
    fn container_overrides_pod_and_groups_are_collected() {
        let (p, c) = pod(json!({
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [4000], "fsGroup": 2000},
            "containers": [{"name": "c", "securityContext": {"runAsUser": 1001}}],
        }));
        let u = process_user(&p, &c, Some(0)).unwrap().unwrap();
        assert_eq!((u.uid, u.gid), (1001, 3000));
        assert!([2000, 3000, 4000].iter().all(|g| u.groups.contains(g)));
        // The image's user applies without runAsUser.
        let (p, c) = pod(json!({"containers": [{"name": "c"}]}));
        let u = process_user(&p, &c, Some(65532)).unwrap().unwrap();
        assert_eq!(u.uid, 65532);
    }

    #[test]
    fn run_as_non_root_is_verified() {
        let (p, c) = pod(json!({
            "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "c"}],
        }));
        assert_eq!(
            process_user(&p, &c, Some(0)),
            Err(
                "container has runAsNonRoot and image will run as root (pod: \"p_ns(u1)\", container: c)"
                    .into()
            )
        );
        // An image whose user localkube does not know is let through.
        assert_eq!(process_user(&p, &c, None), Ok(None));
        let (p, c) = pod(json!({
            "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "c", "securityContext": {"runAsUser": 0}}],
        }));
        assert!(
            process_user(&p, &c, Some(0))
                .unwrap_err()
                .starts_with("container's runAsUser breaks non-root policy")
        );
        let (p, c) = pod(json!({
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000},
            "containers": [{"name": "c"}],
        }));
        assert_eq!(process_user(&p, &c, Some(0)).unwrap().unwrap().uid, 1000);
    }

    #[test]
    fn passwd_and_group_files() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/sbin/nologin\n";
        assert_eq!(passwd_entry(passwd, 65534), Some(("nobody".into(), 65534)));
        assert_eq!(passwd_entry(passwd, 7), None);
        let group = "root:x:0:\nadm:x:4:syslog,nobody\nusers:x:100:\n";
        assert_eq!(memberships(group, "nobody"), vec![4]);
        assert!(memberships(group, "root").is_empty());
    }
}
