//! Admission suite: the CEL rules and schema bounds of the generated CRDs, evaluated by a real
//! kube-apiserver (localkube, apiserver only). Every case creates its own object and asserts
//! acceptance or rejection with the expected message; update cases create first, then replace
//! the spec.

mod support;

use std::time::Instant;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::{Value, json};
use valkey_api::{
    ValkeyCluster, ValkeyNode, bootstrap, cluster, config, labels, networking, persistence,
    scheduling, users,
};

use support::{Fixture, NS as NAMESPACE};

/// Expected outcome of a case.
enum Expect {
    Accept,
    /// Rejected with a message containing this text.
    Reject(&'static str),
}

struct Case {
    /// Also the object name.
    name: &'static str,
    create: Value,
    update: Option<Value>,
    expect: Expect,
}

fn ok(name: &'static str, create: Value) -> Case {
    Case {
        name,
        create,
        update: None,
        expect: Expect::Accept,
    }
}

fn bad(name: &'static str, create: Value, message: &'static str) -> Case {
    Case {
        name,
        create,
        update: None,
        expect: Expect::Reject(message),
    }
}

fn upd_ok(name: &'static str, create: Value, update: Value) -> Case {
    Case {
        name,
        create,
        update: Some(update),
        expect: Expect::Accept,
    }
}

fn upd_bad(name: &'static str, create: Value, update: Value, message: &'static str) -> Case {
    Case {
        name,
        create,
        update: Some(update),
        expect: Expect::Reject(message),
    }
}

/// `{shards: 1}` plus `scheduling`.
fn sched(s: Value) -> Value {
    json!({"shards": 1, "scheduling": s})
}

fn spread(shard: &str, primaries: &str, pods: &str) -> Value {
    json!({"spread": {"shard": {"mode": shard}, "primaries": {"mode": primaries}, "pods": {"mode": pods}}})
}

fn tsc(key: &str, when: &str) -> Value {
    json!([{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": {labels::CLUSTER: "x"}}}])
}

fn with_config(key: &str, value: &str) -> Value {
    json!({"shards": 1, "config": {key: value}})
}

fn with_users(u: Value) -> Value {
    json!({"shards": 1, "users": u})
}

fn persisted(size: &str, class: Option<&str>) -> Value {
    let mut p = json!({"size": size});
    if let Some(c) = class {
        p["storageClassName"] = json!(c);
    }
    json!({"shards": 1, "persistence": p})
}

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const DNS: &str = "DoNotSchedule";
const SA: &str = "ScheduleAnyway";

fn cases() -> Vec<Case> {
    let full = json!({
        "image": "registry.example.com/valkey/valkey:9.0.0",
        "imagePullSecrets": [{"name": "registrycredential"}],
        "shards": 3,
        "replicas": 1,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "config": {"io-threads": "4", "maxmemory-policy": "noeviction", "save": "900 1 300 10"},
        "containers": [
            {"name": "server", "env": [{"name": "MY_VAR", "value": "example"}]},
            {"name": "my-sidecar", "image": "busybox:latest", "command": ["sh", "-c", "sleep infinity"]}
        ],
        "exporter": {"enabled": true, "image": "oliver006/redis_exporter:v1.80.0",
                     "args": ["-ping-on-connect"], "resources": {"requests": {"memory": "64Mi", "cpu": "50m"}}},
        "persistence": {"size": "10Gi", "storageClassName": "gp3", "reclaimPolicy": "Retain"},
        "podDisruptionBudget": {"mode": "Cluster"},
        "terminationGracePeriodSeconds": 60,
        "scheduling": {
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "valkey", "effect": "NoSchedule"}],
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app.kubernetes.io/name": "valkey"}}, "topologyKey": HOST}]}},
            "priorityClassName": "high-priority",
            "topologySpreadConstraints": tsc("topology.example.com/rack", SA),
            "node": spread("Preferred", "Disabled", "Disabled"),
            "zone": spread("Preferred", "Disabled", "Disabled")
        },
        "networking": {"tls": {"certificate": {"secretName": "valkey-tls"}}},
        "users": [
            {"name": "alice", "passwordSecret": {"name": "my-users-secret", "keys": ["alicepw"]},
             "commands": {"allow": ["@read", "@write", "@connection"], "deny": ["@admin", "@dangerous"]},
             "keys": {"readWrite": ["app:*"], "readOnly": ["shared:*"]},
             "channels": {"patterns": ["notifications:*"]}},
            {"name": "bob", "nopass": true, "permissions": "+@all ~* &*"}
        ],
        "workloadType": "StatefulSet"
    });
    let user = |name: &str| json!({"name": name, "nopass": true});
    vec![
        // ---- valid creations ----
        ok("minimal", json!({"shards": 1})),
        ok("full-example", full),
        ok(
            "deployment-without-persistence",
            json!({"shards": 2, "workloadType": "Deployment"}),
        ),
        ok("max-shards", json!({"shards": 16384})),
        ok(
            "user-perms-hash-bang-in-patterns",
            with_users(json!([{"name": "a", "nopass": true,
                               "permissions": "+@all -@dangerous ~app:#* &news! -acl|setuser"}])),
        ),
        ok(
            "explicit-zero-replicas",
            json!({"shards": 1, "replicas": 0}),
        ),
        ok(
            "grace-period-one",
            json!({"shards": 1, "terminationGracePeriodSeconds": 1}),
        ),
        ok(
            "exporter-disabled",
            json!({"shards": 1, "exporter": {"enabled": false}}),
        ),
        ok(
            "pdb-disabled",
            json!({"shards": 1, "podDisruptionBudget": {"mode": "Disabled"}}),
        ),
        ok(
            "pdb-per-shard",
            json!({"shards": 3, "replicas": 1, "podDisruptionBudget": {"mode": "Shard"}}),
        ),
        ok(
            "node-primaries-required-pods-preferred",
            sched(json!({"node": spread("Disabled", "Required", "Preferred")})),
        ),
        ok(
            "node-primaries-preferred-pods-disabled",
            sched(json!({"node": spread("Disabled", "Preferred", "Disabled")})),
        ),
        ok(
            "node-shard-exempt",
            sched(json!({"node": spread("Required", "Required", "Disabled")})),
        ),
        ok(
            "node-all-preferred-shard-required",
            sched(json!({"node": spread("Required", "Preferred", "Required")})),
        ),
        ok(
            "zone-shard-required-primaries-preferred",
            sched(json!({"zone": spread("Required", "Preferred", "Disabled")})),
        ),
        ok(
            "zone-pods-preferred-only",
            sched(json!({"zone": spread("Disabled", "Disabled", "Preferred")})),
        ),
        ok(
            "both-axes",
            sched(
                json!({"node": spread("Required", "Disabled", "Disabled"), "zone": spread("Preferred", "Disabled", "Disabled")}),
            ),
        ),
        ok(
            "tsc-hostname-other-strength",
            sched(
                json!({"node": spread("Disabled", "Required", "Disabled"), "topologySpreadConstraints": tsc(HOST, SA)}),
            ),
        ),
        ok(
            "tsc-hostname-with-shard-only",
            sched(
                json!({"node": spread("Required", "Disabled", "Disabled"), "topologySpreadConstraints": tsc(HOST, DNS)}),
            ),
        ),
        ok(
            "tsc-hostname-node-disabled",
            sched(json!({"topologySpreadConstraints": tsc(HOST, DNS)})),
        ),
        ok(
            "tsc-zone-other-strength",
            sched(
                json!({"zone": spread("Preferred", "Disabled", "Disabled"), "topologySpreadConstraints": tsc(ZONE, DNS)}),
            ),
        ),
        ok(
            "tsc-custom-key-everything-on",
            sched(
                json!({"node": spread("Required", "Required", "Preferred"), "zone": spread("Required", "Preferred", "Disabled"), "topologySpreadConstraints": tsc("topology.example.com/rack", DNS)}),
            ),
        ),
        ok(
            "tsc-hostname-vs-zone-axis",
            sched(
                json!({"zone": spread("Required", "Disabled", "Disabled"), "topologySpreadConstraints": tsc(HOST, DNS)}),
            ),
        ),
        ok(
            "config-cluster-node-timeout",
            with_config("cluster-node-timeout", "5000"),
        ),
        ok(
            "config-value-with-spaces",
            with_config("save", "900 1 300 10"),
        ),
        ok(
            "config-dotted-module-key",
            with_config("search.timeout", "100"),
        ),
        ok(
            "user-name-special-chars",
            with_users(json!([user("app.user@x:1-2_z")])),
        ),
        ok(
            "user-password-rotation",
            with_users(
                json!([{"name": "a", "passwordSecret": {"name": "s", "keys": ["k1", "k2"]}}]),
            ),
        ),
        ok(
            "user-nopass-false-with-secret",
            with_users(
                json!([{"name": "a", "nopass": false, "passwordSecret": {"name": "s", "keys": ["k"]}}]),
            ),
        ),
        ok(
            "user-two-distinct",
            with_users(json!([user("a"), user("b")])),
        ),
        ok("persistence-without-class", persisted("1Gi", None)),
        ok(
            "failback-automatic",
            json!({"shards": 2, "replicas": 1, "failback": {"mode": "Automatic", "quietPeriodSeconds": 5}}),
        ),
        // ---- invalid creations ----
        bad(
            "shards-zero",
            json!({"shards": 0}),
            "should be greater than or equal to 1",
        ),
        bad(
            "shards-negative",
            json!({"shards": -1}),
            "should be greater than or equal to 1",
        ),
        bad("shards-missing", json!({"replicas": 1}), "Required value"),
        bad(
            "replicas-negative",
            json!({"shards": 1, "replicas": -1}),
            "should be greater than or equal to 0",
        ),
        bad(
            "grace-period-zero",
            json!({"shards": 1, "terminationGracePeriodSeconds": 0}),
            "should be greater than or equal to 1",
        ),
        bad(
            "grace-period-negative",
            json!({"shards": 1, "terminationGracePeriodSeconds": -5}),
            "should be greater than or equal to 1",
        ),
        bad(
            "pdb-per-shard-without-replicas",
            json!({"shards": 3, "podDisruptionBudget": {"mode": "Shard"}}),
            cluster::SHARD_PDB_NEEDS_REPLICAS_MESSAGE,
        ),
        bad(
            "pdb-per-shard-replicas-zero",
            json!({"shards": 3, "replicas": 0, "podDisruptionBudget": {"mode": "Shard"}}),
            cluster::SHARD_PDB_NEEDS_REPLICAS_MESSAGE,
        ),
        bad(
            "failback-quiet-period-too-short",
            json!({"shards": 1, "replicas": 1, "failback": {"mode": "Automatic", "quietPeriodSeconds": 2}}),
            "should be greater than or equal to 5",
        ),
        bad(
            "failback-mode-unknown",
            json!({"shards": 1, "replicas": 1, "failback": {"mode": "Sometimes"}}),
            "supported values: \"Disabled\", \"Automatic\"",
        ),
        bad(
            "persistence-with-deployment",
            json!({"shards": 1, "workloadType": "Deployment", "persistence": {"size": "1Gi"}}),
            cluster::PERSISTENCE_REQUIRES_STATEFULSET_MESSAGE,
        ),
        bad(
            "persistence-size-garbage",
            persisted("lots", None),
            persistence::SIZE_FORMAT_MESSAGE,
        ),
        bad(
            "persistence-size-zero",
            persisted("0", None),
            persistence::SIZE_FORMAT_MESSAGE,
        ),
        bad(
            "workload-type-unknown",
            json!({"shards": 1, "workloadType": "DaemonSet"}),
            "Unsupported value",
        ),
        bad(
            "spread-mode-unknown",
            sched(json!({"node": {"spread": {"shard": {"mode": "Always"}}}})),
            "Unsupported value",
        ),
        bad(
            "node-primaries-pods-required",
            sched(json!({"node": spread("Disabled", "Required", "Required")})),
            scheduling::NODE_SPREAD_MESSAGE,
        ),
        bad(
            "node-primaries-pods-preferred",
            sched(json!({"node": spread("Required", "Preferred", "Preferred")})),
            scheduling::NODE_SPREAD_MESSAGE,
        ),
        bad(
            "zone-two-required",
            sched(json!({"zone": spread("Required", "Disabled", "Required")})),
            scheduling::ZONE_SPREAD_MESSAGE,
        ),
        bad(
            "zone-two-preferred",
            sched(json!({"zone": spread("Disabled", "Preferred", "Preferred")})),
            scheduling::ZONE_SPREAD_MESSAGE,
        ),
        bad(
            "zone-three-required",
            sched(json!({"zone": spread("Required", "Required", "Required")})),
            scheduling::ZONE_SPREAD_MESSAGE,
        ),
        bad(
            "tsc-hostname-collides-pods-required",
            sched(
                json!({"node": spread("Disabled", "Disabled", "Required"), "topologySpreadConstraints": tsc(HOST, DNS)}),
            ),
            scheduling::HOSTNAME_COLLISION_MESSAGE,
        ),
        bad(
            "tsc-hostname-collides-primaries-pref",
            sched(
                json!({"node": spread("Disabled", "Preferred", "Disabled"), "topologySpreadConstraints": tsc(HOST, SA)}),
            ),
            scheduling::HOSTNAME_COLLISION_MESSAGE,
        ),
        bad(
            "tsc-zone-collides-shard-required",
            sched(
                json!({"zone": spread("Required", "Disabled", "Disabled"), "topologySpreadConstraints": tsc(ZONE, DNS)}),
            ),
            scheduling::ZONE_COLLISION_MESSAGE,
        ),
        bad(
            "tsc-zone-collides-pods-preferred",
            sched(
                json!({"zone": spread("Disabled", "Disabled", "Preferred"), "topologySpreadConstraints": tsc(ZONE, SA)}),
            ),
            scheduling::ZONE_COLLISION_MESSAGE,
        ),
        bad(
            "tsc-zone-collides-primaries-pref",
            sched(
                json!({"zone": spread("Disabled", "Preferred", "Required"), "topologySpreadConstraints": tsc(ZONE, SA)}),
            ),
            scheduling::ZONE_COLLISION_MESSAGE,
        ),
        bad(
            "users-duplicate-names",
            with_users(json!([user("a"), user("b"), user("a")])),
            users::UNIQUE_NAMES_MESSAGE,
        ),
        bad(
            "user-reserved-prefix",
            with_users(json!([user("_operator")])),
            users::RESERVED_NAME_MESSAGE,
        ),
        bad(
            "user-named-default",
            with_users(json!([user("default")])),
            users::DEFAULT_USER_MESSAGE,
        ),
        bad(
            "user-name-space",
            with_users(json!([user("a b")])),
            users::NAME_FORMAT_MESSAGE,
        ),
        bad(
            "user-name-empty",
            with_users(json!([user("")])),
            "should be at least 1 chars long",
        ),
        bad(
            "user-password-and-nopass",
            with_users(
                json!([{"name": "a", "nopass": true, "passwordSecret": {"name": "s", "keys": ["k"]}}]),
            ),
            users::PASSWORD_EXCLUSIVE_MESSAGE,
        ),
        bad(
            "user-password-keys-empty",
            with_users(json!([{"name": "a", "passwordSecret": {"name": "s", "keys": []}}])),
            users::PASSWORD_KEYS_MESSAGE,
        ),
        bad(
            "user-key-pattern-whitespace",
            with_users(json!([{"name": "a", "keys": {"readWrite": ["app:* allkeys"]}}])),
            users::TOKEN_MESSAGE,
        ),
        bad(
            "user-command-empty",
            with_users(json!([{"name": "a", "commands": {"deny": [""]}}])),
            users::TOKEN_MESSAGE,
        ),
        bad(
            "user-permissions-newline",
            with_users(json!([{"name": "a", "permissions": "+@all\nuser evil on nopass +@all"}])),
            users::PERMISSIONS_MESSAGE,
        ),
        bad(
            "user-permissions-password",
            with_users(json!([{"name": "a", "permissions": "+@all ~* >secret"}])),
            users::PERMISSIONS_PASSWORD_MESSAGE,
        ),
        bad(
            "user-permissions-hash",
            with_users(json!([{"name": "a", "permissions": "#0123abcd +get"}])),
            users::PERMISSIONS_PASSWORD_MESSAGE,
        ),
        bad(
            "user-permissions-nopass",
            with_users(json!([{"name": "a", "permissions": "+@read nopass"}])),
            users::PERMISSIONS_PASSWORD_MESSAGE,
        ),
        bad(
            "user-permissions-reset",
            with_users(json!([{"name": "a", "permissions": "reset +@all"}])),
            users::PERMISSIONS_PASSWORD_MESSAGE,
        ),
        bad(
            "config-port",
            with_config("port", "7000"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-port-uppercase",
            with_config("PORT", "7000"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-cluster-enabled",
            with_config("cluster-enabled", "no"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-tls-port",
            with_config("tls-port", "6380"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-tls-prefix",
            with_config("tls-cert-file", "/x"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-cluster-port",
            with_config("cluster-port", "1"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-cluster-config-file",
            with_config("cluster-config-file", "n.conf"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-dir",
            with_config("dir", "/tmp"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-aclfile",
            with_config("aclfile", "/a"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-bind",
            with_config("bind", "0.0.0.0"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-cluster-announce",
            with_config("cluster-announce-ip", "1.2.3.4"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-primaryuser",
            with_config("primaryuser", "x"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-masteruser",
            with_config("masteruser", "x"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-primaryauth",
            with_config("primaryauth", "x"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-masterauth",
            with_config("masterauth", "x"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-requirepass",
            with_config("requirepass", "x"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-shutdown-on-sigterm",
            with_config("shutdown-on-sigterm", "default"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-unixsocket",
            with_config("unixsocket", "/s"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-include",
            with_config("include", "/etc/x.conf"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-rename-command",
            with_config("rename-command", "FLUSHALL \"\""),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-daemonize",
            with_config("daemonize", "yes"),
            config::OWNED_KEY_MESSAGE,
        ),
        bad(
            "config-key-newline",
            with_config("maxmemory\nport", "1"),
            config::KEY_FORMAT_MESSAGE,
        ),
        bad(
            "config-key-space",
            with_config("maxmemory 1gb", "x"),
            config::KEY_FORMAT_MESSAGE,
        ),
        bad(
            "config-value-newline",
            with_config("maxmemory", "1gb\nport 7000"),
            config::VALUE_NEWLINE_MESSAGE,
        ),
        bad(
            "tls-secret-empty",
            json!({"shards": 1, "networking": {"tls": {"certificate": {"secretName": ""}}}}),
            networking::TLS_SECRET_MESSAGE,
        ),
        bad(
            "tls-certificate-missing",
            json!({"shards": 1, "networking": {"tls": {}}}),
            "Required value",
        ),
        bad(
            "name-longer-than-forty-characters-is-rejected",
            json!({"shards": 1}),
            cluster::NAME_MESSAGE,
        ),
        bad(
            "0-name-starting-with-digit",
            json!({"shards": 1}),
            cluster::NAME_MESSAGE,
        ),
        // ---- update transitions ----
        upd_bad(
            "workload-type-immutable",
            json!({"shards": 1}),
            json!({"shards": 1, "workloadType": "Deployment"}),
            cluster::WORKLOAD_TYPE_IMMUTABLE_MESSAGE,
        ),
        upd_bad(
            "workload-type-immutable-back",
            json!({"shards": 1, "workloadType": "Deployment"}),
            json!({"shards": 1, "workloadType": "StatefulSet"}),
            cluster::WORKLOAD_TYPE_IMMUTABLE_MESSAGE,
        ),
        upd_ok(
            "workload-type-defaulted-explicit",
            json!({"shards": 1}),
            json!({"shards": 1, "workloadType": "StatefulSet"}),
        ),
        upd_bad(
            "persistence-added",
            json!({"shards": 1}),
            persisted("1Gi", None),
            cluster::PERSISTENCE_ADD_REMOVE_MESSAGE,
        ),
        upd_bad(
            "persistence-removed",
            persisted("1Gi", None),
            json!({"shards": 1}),
            cluster::PERSISTENCE_ADD_REMOVE_MESSAGE,
        ),
        upd_bad(
            "tls-turned-on",
            json!({"shards": 1}),
            json!({"shards": 1, "networking": {"tls": {"certificate": {"secretName": "c"}}}}),
            cluster::TLS_TOGGLE_MESSAGE,
        ),
        upd_bad(
            "tls-turned-off",
            json!({"shards": 1, "networking": {"tls": {"certificate": {"secretName": "c"}}}}),
            json!({"shards": 1, "networking": {}}),
            cluster::TLS_TOGGLE_MESSAGE,
        ),
        upd_ok(
            "tls-certificate-secret-renamed",
            json!({"shards": 1, "networking": {"tls": {"certificate": {"secretName": "c"}}}}),
            json!({"shards": 1, "networking": {"tls": {"certificate": {"secretName": "d"}}}}),
        ),
        upd_ok(
            "persistence-grows",
            persisted("1Gi", Some("gp3")),
            persisted("2Gi", Some("gp3")),
        ),
        upd_ok(
            "persistence-same-size-other-unit",
            persisted("1Gi", None),
            persisted("1024Mi", None),
        ),
        upd_bad(
            "persistence-shrinks",
            persisted("2Gi", None),
            persisted("1Gi", None),
            persistence::SIZE_SHRINK_MESSAGE,
        ),
        upd_bad(
            "storage-class-changed",
            persisted("1Gi", Some("gp3")),
            persisted("1Gi", Some("gp2")),
            persistence::STORAGE_CLASS_IMMUTABLE_MESSAGE,
        ),
        upd_bad(
            "storage-class-added",
            persisted("1Gi", None),
            persisted("1Gi", Some("gp3")),
            persistence::STORAGE_CLASS_IMMUTABLE_MESSAGE,
        ),
        upd_bad(
            "storage-class-removed",
            persisted("1Gi", Some("gp3")),
            persisted("1Gi", None),
            persistence::STORAGE_CLASS_IMMUTABLE_MESSAGE,
        ),
        upd_ok(
            "reclaim-policy-changed",
            persisted("1Gi", None),
            json!({"shards": 1, "persistence": {"size": "1Gi", "reclaimPolicy": "Delete"}}),
        ),
        upd_ok(
            "scale-shards-and-replicas",
            json!({"shards": 3}),
            json!({"shards": 5, "replicas": 2}),
        ),
        upd_ok(
            "deployment-other-changes",
            json!({"shards": 1, "workloadType": "Deployment"}),
            json!({"shards": 2, "workloadType": "Deployment", "config": {"maxmemory": "1gb"}}),
        ),
        upd_bad(
            "update-adds-owned-config",
            json!({"shards": 1}),
            with_config("dir", "/data"),
            config::OWNED_KEY_MESSAGE,
        ),
        upd_bad(
            "update-spread-collision",
            json!({"shards": 1}),
            sched(json!({"node": spread("Disabled", "Preferred", "Preferred")})),
            scheduling::NODE_SPREAD_MESSAGE,
        ),
        upd_bad(
            "update-shards-zero",
            json!({"shards": 2}),
            json!({"shards": 0}),
            "should be greater than or equal to 1",
        ),
        ok(
            "bootstrap-by-name",
            json!({"shards": 5, "bootstrap": {"backup": {"name": "nightly-20261207030000"}}}),
        ),
        ok(
            "bootstrap-by-path",
            json!({"shards": 1, "bootstrap": {"backup": {"path": "prod/ns/c/b",
                "store": {"s3": {"bucket": "bkt", "endpoint": "https://s3.example"}}}}}),
        ),
        bad(
            "bootstrap-name-and-path",
            json!({"shards": 1, "bootstrap": {"backup": {"name": "b", "path": "prod/ns/c/b"}}}),
            bootstrap::BACKUP_SOURCE_MESSAGE,
        ),
        bad(
            "bootstrap-store-without-path",
            json!({"shards": 1, "bootstrap": {"backup": {
                "store": {"s3": {"bucket": "bkt", "endpoint": "https://s3.example"}}}}}),
            bootstrap::BACKUP_SOURCE_MESSAGE,
        ),
        upd_bad(
            "bootstrap-added-later",
            json!({"shards": 1}),
            json!({"shards": 1, "bootstrap": {"backup": {"name": "b"}}}),
            bootstrap::BOOTSTRAP_IMMUTABLE_MESSAGE,
        ),
        upd_bad(
            "bootstrap-changed",
            json!({"shards": 1, "bootstrap": {"backup": {"name": "b"}}}),
            json!({"shards": 1, "bootstrap": {"backup": {"name": "c"}}}),
            bootstrap::BOOTSTRAP_IMMUTABLE_MESSAGE,
        ),
        upd_ok(
            "bootstrap-kept-while-scaling",
            json!({"shards": 1, "bootstrap": {"backup": {"name": "b"}}}),
            json!({"shards": 2, "bootstrap": {"backup": {"name": "b"}}}),
        ),
    ]
}

fn object(name: &str, spec: &Value) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "valkey.io/v1alpha1",
        "kind": "ValkeyCluster",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }))?)
}

fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => format!("non-API error: {other}"),
    }
}

/// Runs one case; `Err` describes how it deviated from the expectation.
async fn run_case(api: &Api<DynamicObject>, case: &Case) -> Result<(), String> {
    let pp = PostParams::default();
    let created = api
        .create(
            &pp,
            &object(case.name, &case.create).map_err(|e| e.to_string())?,
        )
        .await;
    let outcome = match (&case.update, created) {
        (None, r) => r.map(|_| ()),
        (Some(_), Err(e)) => {
            return Err(format!("create before update failed: {}", api_message(&e)));
        }
        (Some(update), Ok(mut obj)) => {
            obj.data["spec"] = update.clone();
            api.replace(case.name, &pp, &obj).await.map(|_| ())
        }
    };
    match (&case.expect, outcome) {
        (Expect::Accept, Ok(())) => Ok(()),
        (Expect::Accept, Err(e)) => Err(format!("expected accept, got: {}", api_message(&e))),
        (Expect::Reject(m), Ok(())) => Err(format!("expected reject with {m:?}, was accepted")),
        (Expect::Reject(m), Err(e)) => {
            let got = api_message(&e);
            if got.contains(m) {
                Ok(())
            } else {
                Err(format!("expected message containing {m:?}, got: {got}"))
            }
        }
    }
}

/// Defaults are applied by the apiserver and visible when reading the object back.
async fn check_defaults(client: &Client) -> anyhow::Result<()> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let created = api
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
            "metadata": {"name": "defaults"}, "spec": {"shards": 3, "exporter": {"args": ["-x"]}}
        }))?)
        .await?;
    let raw: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::erase::<ValkeyCluster>(&()),
    );
    let spec = raw.get("defaults").await?.data["spec"].clone();
    let disabled = json!({"mode": "Disabled"});
    let axis = json!({"spread": {"shard": disabled, "primaries": disabled, "pods": disabled}});
    let want = json!({
        "shards": 3,
        "replicas": 0,
        "image": "valkey/valkey:9.0.0",
        "workloadType": "StatefulSet",
        "exporter": {"enabled": true, "image": "oliver006/redis_exporter:v1.80.0", "args": ["-x"]},
        "podDisruptionBudget": {"mode": "Cluster"},
        "failback": {"mode": "Disabled", "quietPeriodSeconds": 600},
        "scheduling": {"node": axis, "zone": axis},
    });
    anyhow::ensure!(spec == want, "defaulted spec\n{spec:#}\n!=\n{want:#}");
    anyhow::ensure!(created.spec.exporter_enabled() && created.spec.pdb_enabled());
    Ok(())
}

/// Status subresource: conditions are a list keyed by type; state defaults to Initializing.
async fn check_status(client: &Client) -> anyhow::Result<()> {
    let api: Api<ValkeyCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let cond = |t: &str| {
        json!({"type": t, "status": "True", "reason": "R", "message": "",
                                 "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let pp = PatchParams::default();
    let patched = api
        .patch_status("defaults", &pp, &Patch::Merge(json!({"status": {
            "conditions": [cond("Ready"), cond("Progressing")], "shards": 3, "readyShards": 3,
            "shardStatuses": [{"index": 0, "primaryPod": "p", "replicas": 1, "slots": ["0-5460"]}]
        }})))
        .await?;
    let status = patched.status.unwrap_or_default();
    anyhow::ensure!(status.state == valkey_api::status::ClusterState::Initializing);
    anyhow::ensure!(status.conditions.len() == 2 && status.shard_statuses.len() == 1);
    let dup = api
        .patch_status(
            "defaults",
            &pp,
            &Patch::Merge(json!({"status": {
                "conditions": [cond("Ready"), cond("Ready")]
            }})),
        )
        .await;
    anyhow::ensure!(
        matches!(&dup, Err(e) if api_message(e).contains("Duplicate value")),
        "duplicate condition types accepted: {dup:?}"
    );
    Ok(())
}

/// A ValkeyNode as the cluster controller writes it is accepted.
async fn check_valkeynode(client: &Client) -> anyhow::Result<()> {
    let api: Api<ValkeyNode> = Api::namespaced(client.clone(), NAMESPACE);
    let node: ValkeyNode = serde_json::from_value(json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyNode",
        "metadata": {"name": "c-0-0"},
        "spec": {"clusterName": "c", "shardIndex": 0, "nodeIndex": 0, "image": "valkey/valkey:9.0.0",
                 "terminationGracePeriodSeconds": 30, "workloadRevision": "1",
                 "exporter": {"image": "oliver006/redis_exporter:v1.80.0"},
                 "config": {"configMapName": "c-config", "hash": "abc", "live": {"maxmemory": "1gb"}},
                 "scheduling": {"nodeSelector": {"a": "b"}}}
    }))?;
    let created = api.create(&PostParams::default(), &node).await?;
    anyhow::ensure!(
        created.spec == node.spec,
        "ValkeyNode spec changed on create"
    );
    anyhow::ensure!(ValkeyNode::kind(&()) == "ValkeyNode");
    Ok(())
}

/// ValkeyBackup: exactly one store, endpoint scheme, prefix form, defaults, an immutable spec.
async fn check_valkeybackup(client: &Client) -> anyhow::Result<()> {
    use valkey_api::backup::{BACKUP_SPEC_IMMUTABLE_MESSAGE, ValkeyBackup};
    use valkey_api::backup_store::{ENDPOINT_SCHEME_MESSAGE, ONE_STORE_MESSAGE, PREFIX_MESSAGE};
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::erase::<ValkeyBackup>(&()),
    );
    let s3 = json!({"bucket": "bkt", "endpoint": "https://store.example",
                    "credentials": {"secretName": "s3"}});
    let gcs = json!({"bucket": "bkt"});
    let backup = |name: &str, store: Value| -> anyhow::Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyBackup",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"cluster": "c", "store": store},
        }))?)
    };
    let pp = PostParams::default();
    for (name, store, message) in [
        (
            "two-stores",
            json!({"s3": s3, "gcs": gcs}),
            ONE_STORE_MESSAGE,
        ),
        ("no-store", json!({}), ONE_STORE_MESSAGE),
        (
            "no-scheme",
            json!({"s3": {"bucket": "bkt", "endpoint": "store.example"}}),
            ENDPOINT_SCHEME_MESSAGE,
        ),
        (
            "slash-prefix",
            json!({"prefix": "/backups/", "s3": s3}),
            PREFIX_MESSAGE,
        ),
    ] {
        match api.create(&pp, &backup(name, store)?).await {
            Ok(_) => anyhow::bail!("ValkeyBackup {name} accepted"),
            Err(e) => anyhow::ensure!(
                api_message(&e).contains(message),
                "ValkeyBackup {name}: {}",
                api_message(&e)
            ),
        }
    }
    let mut created = api
        .create(
            &pp,
            &backup("good", json!({"prefix": "prod/eu", "s3": s3}))?,
        )
        .await?;
    let creds = &created.data["spec"]["store"]["s3"]["credentials"];
    anyhow::ensure!(
        created.data["spec"]["store"]["s3"]["region"] == "us-east-1"
            && creds["accessKeyIdKey"] == "AWS_ACCESS_KEY_ID"
            && creds["secretAccessKeyKey"] == "AWS_SECRET_ACCESS_KEY",
        "defaults: {}",
        created.data["spec"]
    );
    created.data["spec"]["cluster"] = json!("other");
    match api.replace("good", &pp, &created).await {
        Ok(_) => anyhow::bail!("a changed ValkeyBackup spec was accepted"),
        Err(e) => anyhow::ensure!(
            api_message(&e).contains(BACKUP_SPEC_IMMUTABLE_MESSAGE),
            "{}",
            api_message(&e)
        ),
    }
    check_scheduled_backup(client, &s3).await
}

/// ValkeyScheduledBackup: cron field count, retention age, defaults.
async fn check_scheduled_backup(client: &Client, s3: &Value) -> anyhow::Result<()> {
    use valkey_api::ValkeyScheduledBackup;
    use valkey_api::scheduled_backup::{MAX_AGE_MESSAGE, SCHEDULE_MESSAGE};
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::erase::<ValkeyScheduledBackup>(&()),
    );
    let schedule = |name: &str, spec: Value| -> anyhow::Result<DynamicObject> {
        let mut spec_full = json!({"cluster": "c", "schedule": "0 3 * * *", "store": {"s3": s3}});
        if let (Some(a), Some(b)) = (spec_full.as_object_mut(), spec.as_object()) {
            a.extend(b.clone());
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyScheduledBackup",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec_full,
        }))?)
    };
    let pp = PostParams::default();
    for (name, spec, message) in [
        (
            "four-fields",
            json!({"schedule": "0 3 * *"}),
            SCHEDULE_MESSAGE,
        ),
        (
            "minutes-age",
            json!({"retention": {"maxAge": "30m"}}),
            MAX_AGE_MESSAGE,
        ),
    ] {
        match api.create(&pp, &schedule(name, spec)?).await {
            Ok(_) => anyhow::bail!("ValkeyScheduledBackup {name} accepted"),
            Err(e) => anyhow::ensure!(
                api_message(&e).contains(message),
                "ValkeyScheduledBackup {name}: {}",
                api_message(&e)
            ),
        }
    }
    let created = api
        .create(
            &pp,
            &schedule("nightly", json!({"schedule": "*/30 * * * * *"}))?,
        )
        .await?;
    anyhow::ensure!(
        created.data["spec"]["retention"]["keep"] == 7 && created.data["spec"]["suspend"] == false,
        "defaults: {}",
        created.data["spec"]
    );
    Ok(())
}

#[tokio::test]
async fn admission_rules_on_a_real_apiserver() -> anyhow::Result<()> {
    let Some(fx) = Fixture::start_with(localkube::Options::apiserver_only(), false).await? else {
        return Ok(());
    };
    let client = fx.client.clone();

    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::erase::<ValkeyCluster>(&()),
    );
    let cases = cases();
    let mut names = std::collections::BTreeSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "duplicate case name {}", c.name);
    }
    let started = Instant::now();
    let mut failures = vec![];
    for case in &cases {
        if let Err(why) = run_case(&api, case).await {
            failures.push(format!("{}: {why}", case.name));
        }
    }
    println!("{} admission cases in {:?}", cases.len(), started.elapsed());
    for (what, r) in [
        ("defaults", check_defaults(&client).await),
        ("status", check_status(&client).await),
        ("valkeynode", check_valkeynode(&client).await),
        ("valkeybackup", check_valkeybackup(&client).await),
    ] {
        if let Err(e) = r {
            failures.push(format!("{what}: {e:#}"));
        }
    }
    fx.stop().await;
    assert!(cases.len() >= 50, "only {} cases", cases.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}
