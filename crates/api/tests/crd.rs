//! CRD generation: committed manifests, snapshots, documented rules and structural checks.

use std::path::PathBuf;

use serde_json::Value;
use valkey_api::{crd_yaml, crds};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

fn crd_json(kind_plural: &str) -> Value {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.plural == kind_plural)
        .unwrap();
    serde_json::to_value(crd).unwrap()
}

#[test]
fn committed_crds_match_code() {
    let update = std::env::var_os("UPDATE_CRDS").is_some();
    let mut stale = vec![];
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap();
        let path = deploy_dir().join(format!("{name}.yaml"));
        let want = crd_yaml(&crd).unwrap();
        if update {
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "CRD manifests drifted from the code: {stale:?}\nregenerate with: \
         UPDATE_CRDS=1 cargo test -p valkey-api --test crd"
    );
}

#[test]
fn committed_yaml_parses_back_to_the_same_crd() {
    for crd in crds() {
        let yaml = crd_yaml(&crd).unwrap();
        let back: Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, serde_json::to_value(&crd).unwrap());
    }
}

#[test]
fn snapshot_valkeycluster_crd() {
    insta::assert_snapshot!(crd_yaml(&crds()[0]).unwrap());
}

#[test]
fn snapshot_valkeynode_crd() {
    insta::assert_snapshot!(crd_yaml(&crds()[1]).unwrap());
}

#[test]
fn snapshot_valkeybackup_crd() {
    insta::assert_snapshot!(crd_yaml(&crds()[2]).unwrap());
}

#[test]
fn snapshot_valkeyscheduledbackup_crd() {
    insta::assert_snapshot!(crd_yaml(&crds()[3]).unwrap());
}

fn collect_messages(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Array(rules)) = m.get("x-kubernetes-validations") {
                for r in rules {
                    out.push(r["message"].as_str().unwrap_or_default().to_owned());
                }
            }
            m.values().for_each(|c| collect_messages(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| collect_messages(c, out)),
        _ => {}
    }
}

#[test]
fn every_documented_rule_is_present() {
    use valkey_api::{
        backup, backup_store, bootstrap, cluster, config, networking, persistence,
        scheduled_backup, scheduling, users,
    };
    let mut messages = vec![];
    collect_messages(&crd_json("valkeyclusters"), &mut messages);
    let documented = [
        cluster::NAME_MESSAGE,
        cluster::WORKLOAD_TYPE_IMMUTABLE_MESSAGE,
        cluster::PERSISTENCE_REQUIRES_STATEFULSET_MESSAGE,
        cluster::PERSISTENCE_ADD_REMOVE_MESSAGE,
        persistence::SIZE_FORMAT_MESSAGE,
        persistence::SIZE_SHRINK_MESSAGE,
        persistence::STORAGE_CLASS_IMMUTABLE_MESSAGE,
        scheduling::NODE_SPREAD_MESSAGE,
        scheduling::ZONE_SPREAD_MESSAGE,
        scheduling::HOSTNAME_COLLISION_MESSAGE,
        scheduling::ZONE_COLLISION_MESSAGE,
        users::UNIQUE_NAMES_MESSAGE,
        users::RESERVED_NAME_MESSAGE,
        users::DEFAULT_USER_MESSAGE,
        users::NAME_FORMAT_MESSAGE,
        users::PASSWORD_EXCLUSIVE_MESSAGE,
        users::PASSWORD_KEYS_MESSAGE,
        users::TOKEN_MESSAGE,
        users::PERMISSIONS_MESSAGE,
        config::OWNED_KEY_MESSAGE,
        config::KEY_FORMAT_MESSAGE,
        config::VALUE_NEWLINE_MESSAGE,
        networking::TLS_SECRET_MESSAGE,
        bootstrap::BOOTSTRAP_IMMUTABLE_MESSAGE,
        bootstrap::BACKUP_SOURCE_MESSAGE,
    ];
    collect_messages(&crd_json("valkeybackups"), &mut messages);
    collect_messages(&crd_json("valkeyscheduledbackups"), &mut messages);
    let documented = documented.into_iter().chain([
        backup::BACKUP_NAME_MESSAGE,
        backup::BACKUP_SPEC_IMMUTABLE_MESSAGE,
        backup_store::ONE_STORE_MESSAGE,
        backup_store::ENDPOINT_SCHEME_MESSAGE,
        backup_store::PREFIX_MESSAGE,
        scheduled_backup::SCHEDULE_MESSAGE,
        scheduled_backup::MAX_AGE_MESSAGE,
        scheduled_backup::SCHEDULE_NAME_MESSAGE,
    ]);
    for m in documented {
        assert!(messages.iter().any(|x| x == m), "rule missing: {m}");
    }
    // Every rule carries a message telling the user what to change.
    assert!(messages.iter().all(|m| !m.is_empty()), "{messages:#?}");
}

#[test]
fn schema_bounds_and_defaults() {
    let crd = crd_json("valkeyclusters");
    let v = &crd["spec"]["versions"][0];
    let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let p = &spec["properties"];
    assert_eq!(spec["required"], serde_json::json!(["shards"]));
    assert_eq!(p["shards"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(p["replicas"]["minimum"].as_f64(), Some(0.0));
    assert_eq!(p["replicas"]["default"], 0);
    assert_eq!(
        p["terminationGracePeriodSeconds"]["minimum"].as_f64(),
        Some(1.0)
    );
    assert_eq!(p["image"]["default"], "valkey/valkey:9.0.0");
    assert_eq!(p["workloadType"]["default"], "StatefulSet");
    assert_eq!(
        p["exporter"]["default"],
        serde_json::json!({"enabled": true, "image": "oliver006/redis_exporter:v1.80.0"})
    );
    assert_eq!(p["exporter"]["properties"]["enabled"]["default"], true);
    assert_eq!(
        p["podDisruptionBudget"]["default"],
        serde_json::json!({"mode": "Cluster"})
    );
    let disabled = serde_json::json!({"mode": "Disabled"});
    let spread = serde_json::json!({"shard": disabled, "primaries": disabled, "pods": disabled});
    assert_eq!(
        p["scheduling"]["default"],
        serde_json::json!({"node": {"spread": spread}, "zone": {"spread": spread}})
    );
    assert_eq!(
        p["persistence"]["properties"]["reclaimPolicy"]["default"],
        "Retain"
    );
    assert_eq!(p["config"]["maxProperties"], 256);
    assert_eq!(p["users"]["maxItems"], 64);

    let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    assert_eq!(
        status["conditions"]["x-kubernetes-list-map-keys"],
        serde_json::json!(["type"])
    );
    assert_eq!(status["state"]["default"], "Initializing");
}

#[test]
fn names_columns_and_subresources() {
    for (plural, short, columns) in [
        (
            "valkeyclusters",
            "vkc",
            vec!["State", "Reason", "Shards", "ReadyShards", "Age"],
        ),
        (
            "valkeynodes",
            "vkn",
            vec!["Ready", "Role", "Shard", "Pod", "IP", "Age"],
        ),
        (
            "valkeybackups",
            "vkb",
            vec!["Cluster", "Phase", "Shards", "Bytes", "Age"],
        ),
        (
            "valkeyscheduledbackups",
            "vksb",
            vec!["Cluster", "Schedule", "Suspend", "Last", "Next"],
        ),
    ] {
        let crd = crd_json(plural);
        assert_eq!(crd["spec"]["group"], "valkey.io");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!([short])
        );
        assert_eq!(
            crd["spec"]["names"]["categories"],
            serde_json::json!(["valkey"])
        );
        let v = &crd["spec"]["versions"][0];
        assert_eq!(v["name"], "v1alpha1");
        assert!(v["subresources"]["status"].is_object());
        let names: Vec<&str> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, columns);
    }
}

/// Structural-schema checks the apiserver applies: every node has a type (or is int-or-string
/// / preserve-unknown-fields), and no anyOf/oneOf/allOf carries types.
fn assert_structural(v: &Value, path: &str) {
    let Value::Object(m) = v else { return };
    let typed = m.contains_key("type")
        || m.contains_key("x-kubernetes-int-or-string")
        || m.contains_key("x-kubernetes-preserve-unknown-fields");
    assert!(typed, "schema node without type at {path}: {v}");
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(alts)) = m.get(key) {
            for alt in alts {
                assert!(alt.get("type").is_none(), "typed {key} at {path}");
            }
        }
    }
    assert!(!m.contains_key("$ref"), "$ref at {path}");
    if let Some(Value::Object(props)) = m.get("properties") {
        for (k, c) in props {
            assert_structural(c, &format!("{path}.{k}"));
        }
    }
    if let Some(items) = m.get("items") {
        assert_structural(items, &format!("{path}[]"));
    }
    if let Some(ap @ Value::Object(_)) = m.get("additionalProperties") {
        assert_structural(ap, &format!("{path}{{}}"));
    }
}

#[test]
fn schemas_are_structural() {
    for plural in ["valkeyclusters", "valkeynodes"] {
        let crd = crd_json(plural);
        assert_structural(
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            plural,
        );
    }
}

/// Paths of schema properties without a description (`kubectl explain` would print nothing).
fn undocumented(v: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(Value::Object(props)) = v.get("properties") {
        for (k, c) in props {
            let p = format!("{path}.{k}");
            if c.get("description")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                out.push(p.clone());
            }
            undocumented(c, &p, out);
        }
    }
    if let Some(items) = v.get("items") {
        undocumented(items, &format!("{path}[]"), out);
    }
}

#[test]
fn every_field_is_documented() {
    for plural in ["valkeyclusters", "valkeynodes"] {
        let crd = crd_json(plural);
        let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut missing = vec![];
        for part in ["spec", "status"] {
            assert!(root["properties"][part]["description"].is_string());
            undocumented(
                &root["properties"][part],
                &format!("{plural}.{part}"),
                &mut missing,
            );
        }
        assert!(missing.is_empty(), "undocumented fields: {missing:#?}");
    }
}
