//! Needs real `valkey-server` binaries (see the `valkey-testkit` crate): least-privilege system users,
//! `ACL LOAD` with revision verification, `CONFIG SET` of several keys, authentication errors.

use valkey_ops::client::{self, ClientConfig, ClientError, NodePool};
use valkey_ops::commands::{self, AclLoadOutcome, acl};
use valkey_testkit::*;

async fn allowed(pool: &NodePool, addr: &str, args: &[&str]) -> Result<(), String> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    match pool.query::<redis::Value>(addr, &c).await {
        Ok(_) => Ok(()),
        Err(e) if e.server_code() == Some("NOPERM") => Err("NOPERM".into()),
        // Any other error reply means the command was permitted and ran.
        Err(ClientError::Server { .. }) => Ok(()),
        Err(e) => panic!("{args:?}: {e}"),
    }
}

/// Asserts that `who` (`pool`) may run each of `cmds` on `addr`.
async fn assert_allowed(pool: &NodePool, addr: &str, who: &str, cmds: &[&[&str]]) {
    for cmd in cmds {
        assert_eq!(allowed(pool, addr, cmd).await, Ok(()), "{who} {cmd:?}");
    }
}

/// Asserts that `who` (`pool`) is refused each of `cmds` on `addr` (`NOPERM`).
async fn assert_refused(pool: &NodePool, addr: &str, who: &str, cmds: &[&[&str]]) {
    for cmd in cmds {
        assert_eq!(
            allowed(pool, addr, cmd).await,
            Err("NOPERM".into()),
            "{who} {cmd:?}"
        );
    }
}

async fn check_users(flavor: Flavor) {
    init_tracing();
    let server = Server::start(flavor, None);
    let a = server.addr();
    let op = operator_pool(None);
    commands::add_slots_range(&op, &a, &split_slots(1))
        .await
        .unwrap();
    wait_cluster_ok(
        &op,
        std::slice::from_ref(&a),
        std::time::Duration::from_secs(10),
    )
    .await;
    let app = app_pool(None);
    let () = app
        .query(&a, redis::cmd("SET").arg("k").arg("v"))
        .await
        .unwrap();

    assert_allowed(
        &op,
        &a,
        "operator",
        &[
            &["PING"][..],
            &["INFO", "replication"],
            &["CLUSTER", "INFO"],
            &["CLUSTER", "NODES"],
            &["CLUSTER", "MYID"],
            &["CLUSTER", "COUNTKEYSINSLOT", "0"],
            &["CLUSTER", "GETKEYSINSLOT", "0", "10"],
            &["CONFIG", "GET", "maxmemory"],
            &["CONFIG", "SET", "slowlog-max-len", "200"],
            &["ACL", "USERS"],
            &["ACL", "LOAD"],
            &["WAIT", "0", "10"],
            &["DBSIZE"],
            &["ROLE"],
            &["CLIENT", "LIST"],
        ],
    )
    .await;
    assert_refused(
        &op,
        &a,
        "operator",
        &[
            &["GET", "k"][..],
            &["SET", "k", "x"],
            &["DEL", "k"],
            &["KEYS", "*"],
            &["SCAN", "0"],
            &["HGETALL", "k"],
            &["FLUSHALL"],
            &["EVAL", "return 1", "0"],
            &["SHUTDOWN", "NOSAVE"],
            &["BGSAVE"],
            &["MONITOR"],
        ],
    )
    .await;

    let exp = pool_for(acl::EXPORTER_USER, EXPORTER_PASSWORD, None);
    assert_allowed(
        &exp,
        &a,
        "exporter",
        &[
            &["PING"][..],
            &["INFO", "all"],
            &["CLUSTER", "INFO"],
            &["CLUSTER", "NODES"],
            &["CLIENT", "LIST"],
            &["SLOWLOG", "LEN"],
            &["LATENCY", "LATEST"],
            &["MEMORY", "STATS"],
            &["DBSIZE"],
        ],
    )
    .await;
    // Nothing that reads a password or data: the monitoring credential cannot escalate.
    assert_refused(
        &exp,
        &a,
        "exporter",
        &[
            &["GET", "k"][..],
            &["SET", "k", "x"],
            &["SCAN", "0"],
            &["CONFIG", "GET", "primaryauth"],
            &["CONFIG", "GET", "masterauth"],
            &["CONFIG", "GET", "requirepass"],
            &["CONFIG", "GET", "*"],
            &["ACL", "LIST"],
            &["ACL", "GETUSER", acl::REPLICATION_USER],
            &["ACL", "USERS"],
            &["SLOWLOG", "GET", "10"],
            &["CONFIG", "SET", "maxmemory", "1"],
            &["CLUSTER", "MEET", "127.0.0.1", "1"],
            &["ACL", "LOAD"],
            &["FLUSHALL"],
        ],
    )
    .await;

    let rep = pool_for(acl::REPLICATION_USER, REPLICATION_PASSWORD, None);
    assert_eq!(allowed(&rep, &a, &["PING"]).await, Ok(()));
    // The replication user reads no password either (on 9.x it reads and writes keys: atomic
    // slot migration runs the source's stream with its permissions).
    assert_refused(
        &rep,
        &a,
        "replication",
        &[
            &["CONFIG", "SET", "maxmemory", "1"][..],
            &["CONFIG", "GET", "primaryauth"],
            &["CONFIG", "GET", "requirepass"],
            &["ACL", "LIST"],
            &["ACL", "GETUSER", acl::OPERATOR_USER],
            &["CLUSTER", "MEET", "127.0.0.1", "1"],
            &["ACL", "LOAD"],
            &["FLUSHALL"],
        ],
    )
    .await;
    if flavor == Flavor::V8 {
        assert_eq!(allowed(&rep, &a, &["GET", "k"]).await, Err("NOPERM".into()));
    }

    // `default` is off and wrong passwords fail: authentication errors, no fallback.
    for cfg in [
        ClientConfig::new("default", "anything"),
        ClientConfig::new("_operator", "wrong"),
        ClientConfig::new("nobody", "x"),
    ] {
        let e = client::connect(&a, &cfg).await.unwrap_err();
        assert!(matches!(e, ClientError::Auth { .. }), "{e:?}");
    }
    assert!(matches!(
        client::connect(&a, &ClientConfig::new("", ""))
            .await
            .unwrap_err(),
        ClientError::Config(_)
    ));

    // A changed system user shows in the digest, and is set again from the file; another
    // user's change does not show.
    let file = acl_lines(flavor, ACL_REVISION).join("\n") + "\n";
    let before = acl::acl_state(&op, &a).await.unwrap();
    assert_eq!(before.revision.as_deref(), Some(ACL_REVISION));
    let () = op
        .query(
            &a,
            redis::cmd("ACL").arg(&["SETUSER", "_exporter", "+config|get"]),
        )
        .await
        .unwrap();
    let changed = acl::acl_state(&op, &a).await.unwrap();
    assert_ne!(changed.system_digest, before.system_digest);
    assert_eq!(
        allowed(&exp, &a, &["CONFIG", "GET", "primaryauth"]).await,
        Ok(())
    );
    commands::restore_system_users(&op, &a, &file)
        .await
        .unwrap();
    assert_eq!(acl::acl_state(&op, &a).await.unwrap(), before);
    assert_eq!(
        allowed(&exp, &a, &["CONFIG", "GET", "primaryauth"]).await,
        Err("NOPERM".into())
    );
    let () = op
        .query(&a, redis::cmd("ACL").arg(&["SETUSER", APP_USER, "-get"]))
        .await
        .unwrap();
    assert_eq!(
        acl::acl_state(&op, &a).await.unwrap().system_digest,
        before.system_digest
    );

    // ACL LOAD with revision verification.
    assert_eq!(
        commands::acl_load(&op, &a, ACL_REVISION).await.unwrap(),
        AclLoadOutcome::AlreadyCurrent
    );
    let mut lines = acl_lines(flavor, "rev2");
    lines.push("user extra reset on >extra-pw ~* +get".into());
    std::fs::write(server.acl_path(), lines.join("\n") + "\n").unwrap();
    // Asking for a revision the file does not have fails and names the one found.
    let e = commands::acl_load(&op, &a, "rev3").await.unwrap_err();
    assert!(
        matches!(&e, commands::CommandError::NotReady(m) if m.contains("rev2")),
        "{e}"
    );
    assert_eq!(
        commands::acl_load(&op, &a, "rev2").await.unwrap(),
        AclLoadOutcome::AlreadyCurrent
    );
    let extra = pool_for("extra", "extra-pw", None);
    let v: Option<String> = extra.query(&a, redis::cmd("GET").arg("k")).await.unwrap();
    assert_eq!(v.as_deref(), Some("v"));
    // A broken file is rejected as a whole; the loaded rules stay.
    std::fs::write(server.acl_path(), "user broken on +nosuchcommand\n").unwrap();
    assert!(commands::acl_load(&op, &a, "rev4").await.is_err());
    assert_eq!(
        acl::loaded_revision(&op, &a).await.unwrap().as_deref(),
        Some("rev2")
    );

    // CONFIG SET of several keys: only differing ones are sent; a second call is a no-op.
    let params = [
        ("maxmemory-policy", "allkeys-lru"),
        ("slowlog-log-slower-than", "5000"),
        ("cluster-node-timeout", "2000"),
    ];
    let changed = commands::config_set(&op, &a, &params).await.unwrap();
    assert_eq!(changed, vec!["maxmemory-policy", "slowlog-log-slower-than"]);
    assert!(
        commands::config_set(&op, &a, &params)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_system_users_acl_load_and_config() {
    check_users(Flavor::V9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_system_users_acl_load_and_config() {
    check_users(Flavor::V8).await;
}

/// User rules checked by the server itself on a disabled scratch user: accepted rules leave
/// nothing behind; refused ones come back with the server's reason.
async fn check_rules(flavor: Flavor) {
    init_tracing();
    let server = Server::start(flavor, None);
    let a = server.addr();
    let op = operator_pool(None);
    let rules = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    for ok in [
        "+@all ~* &*",
        "+get +set ~app:* %R~ro:*",
        "-@all +ping",
        "+config|get",
    ] {
        let v = commands::check_user_rules(&op, &a, "t1", &rules(ok))
            .await
            .expect("asked");
        assert_eq!(v, None, "{flavor:?} refused {ok:?}");
    }
    for (bad, why) in [
        ("+nosuchcommand", "nosuchcommand"),
        ("+@nosuchcategory", "nosuchcategory"),
        ("~* bogus-rule", "bogus-rule"),
        ("+get|x|y", ""),
    ] {
        let v = commands::check_user_rules(&op, &a, "t2", &rules(bad))
            .await
            .expect("asked");
        let Some(reason) = v else {
            panic!("{flavor:?} accepted {bad:?}");
        };
        assert!(reason.contains(why), "{flavor:?} {bad:?}: {reason}");
    }
    let users: Vec<String> = op
        .query(&a, redis::cmd("ACL").arg("USERS"))
        .await
        .expect("ACL USERS");
    assert!(
        !users.iter().any(|u| u.starts_with(acl::CHECK_USER_PREFIX)),
        "{users:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_user_rules_checked_by_the_server() {
    check_rules(Flavor::V9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_user_rules_checked_by_the_server() {
    check_rules(Flavor::V8).await;
}

/// On a replica, `ACL LOAD` crashes Valkey 8.0 (valkey-io/valkey#1832; `acl_load_unsafe`
/// says so from the version); `acl_apply` brings the replica to the file's rules without it:
/// users added, changed and removed, the revision marker verified, the replication link kept.
async fn apply_on_replica(flavor: Flavor, load_crashes: bool) {
    init_tracing();
    let mut servers = start_servers(flavor, 2, None);
    let op = operator_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    form_cluster(&op, &addrs[..1], &addrs[1..]).await;
    let replica = &addrs[1];
    wait_replica_synced(&op, replica, "replica synced").await;
    let info = commands::observe_node(&op, replica).await.expect("observe");
    let version = info.server.expect("server info").version;
    assert_eq!(
        commands::acl_load_unsafe(version),
        load_crashes,
        "{version:?}"
    );

    let mut lines = acl_lines(flavor, "rev2");
    lines.retain(|l| !l.starts_with(&format!("user {APP_USER} ")));
    lines.push("user extra reset on >extra-pw ~* +get".into());
    let content = lines.join("\n") + "\n";
    assert_eq!(
        commands::acl_apply(&op, replica, &content, "rev2")
            .await
            .expect("apply"),
        AclLoadOutcome::Loaded
    );
    assert_eq!(
        commands::acl_apply(&op, replica, &content, "rev2")
            .await
            .expect("apply"),
        AclLoadOutcome::AlreadyCurrent
    );
    let users: Vec<String> = op
        .query(replica, redis::cmd("ACL").arg("USERS"))
        .await
        .expect("users");
    assert!(users.iter().any(|u| u == "extra"), "{users:?}");
    assert!(!users.iter().any(|u| u == APP_USER), "{users:?}");
    let extra = pool_for("extra", "extra-pw", None);
    // A replica answers GET with MOVED: the user is authenticated and allowed.
    match extra
        .query::<Option<String>>(replica, redis::cmd("GET").arg("k"))
        .await
    {
        Ok(_) => {}
        Err(e) => assert_eq!(e.server_code(), Some("MOVED"), "extra on the replica: {e}"),
    }
    wait_replica_synced(&op, replica, "replica still synced").await;

    if load_crashes {
        // Shows why: the same file through ACL LOAD kills the replica.
        let changed = content.replace("+get", "+get +set").replace("rev2", "rev3");
        std::fs::write(servers[1].acl_path(), changed).expect("write");
        let _ = op
            .query::<redis::Value>(replica, redis::cmd("ACL").arg("LOAD"))
            .await;
        // The server writes a crash report naming the function.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !servers[1].log().contains("crashed by signal")
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let log = servers[1].log();
        assert!(
            log.contains("crashed by signal") && log.contains("ACLLoadFromFile"),
            "ACL LOAD no longer crashes {version:?} replicas"
        );
        servers[1].kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey8_acl_apply_on_a_replica_without_acl_load() {
    apply_on_replica(Flavor::V8, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_valkey9_acl_apply_on_a_replica() {
    apply_on_replica(Flavor::V9, false).await;
}
