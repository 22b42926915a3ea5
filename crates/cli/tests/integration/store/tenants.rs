//! Tenants and keys: a tenant is held to its names and cannot link
//! another's replicas; the admin credential; revocation; the cluster key
//! rotated under load.

use super::*;

/// A rename's `Link` binds existing replicas under a new name, so a
/// tenant's Link must carry a link proof for exactly those replicas,
/// issued to that tenant by a metadata node that answered its
/// `GetLinkProof` of a name in its scope. Tenant bee, which learned
/// acme's replica addresses (here from the admin's lookup), tries to bind
/// them under `bee/stolen` with no proof, a forged one, a genuine proof
/// for its own other replicas, and acme's genuine proof: each is refused
/// as forbidden, saying why; nothing is bound and no ticket handed out. A
/// proved Link (and its resend) and `strata obj mv` within a tenant's
/// scope still work, and the data reads back.
#[test]
fn a_tenant_cannot_link_another_tenants_replicas_under_its_own_names() {
    use strata_store_protocol::auth::unix_ms;
    use strata_store_protocol::wire::{Code, Record, RenameLink};
    let dir = tmp();
    let d = dir.path().join("cluster");
    let store = Store::up(&d, REPLICATED);
    let dp = p(&d);
    let credential = |tenant: &str| {
        strata_ok(&["store", "tenant", "add", "--dir", &dp, "--tenant", tenant]);
        let file = d.join(format!("{tenant}.credential"));
        (TenantCredential::load(&file).unwrap(), p(&file))
    };
    let (acme, acme_file) = credential("acme");
    let (bee, bee_file) = credential("bee");
    let secret_src = dir.path().join("secret");
    std::fs::write(&secret_src, pattern(5000, 7)).unwrap();
    let own_src = dir.path().join("own");
    // Over the inline limit: bee's object has replicas of its own.
    std::fs::write(&own_src, pattern(5000, 8)).unwrap();
    let put = |cred: &str, src: &Path, name: &str| {
        store.ok(&["obj", "put", "--credential", cred, &p(src), name]);
    };
    put(&acme_file, &secret_src, "acme/secret");
    put(&bee_file, &own_src, "bee/own");
    let before = store.json(&["obj", "stat", "acme/secret"]);
    let (rt, client) = connect_client(store.on);
    let table = client.table();
    let coordinator = |name: &str| {
        let addr = table.meta_addrs(name)[0];
        (addr, table.mn_endpoint(addr).unwrap())
    };
    // What the admin sees, bee learns: acme's replica addresses.
    let record_of =
        |name: &str| match ask_copy(&admin(store.on), &table, table.meta_addrs(name)[0], name).1 {
            Body::Found { record, .. } => record,
            b => panic!("{name}: {b:?}"),
        };
    let secret = record_of("acme/secret");
    let own = record_of("bee/own");
    assert!(!secret.replicas.is_empty());
    let ask_proof = |cred: &TenantCredential, name: &str| {
        let (addr, mn) = coordinator(name);
        let q = Msg::new(700, addr, Body::GetLinkProof { name: name.into() });
        udp_ask(mn, &q.seal_tenant(cred, unix_ms()).unwrap())
    };
    let proof_of = |cred: &TenantCredential, name: &str| match ask_proof(cred, name).body {
        Body::LinkProof { record, proof } => {
            assert_eq!(record.name, name);
            assert!(!proof.is_empty(), "no proof for {name}");
            proof
        }
        b => panic!("{name}: {b:?}"),
    };
    let acme_proof = proof_of(&acme, "acme/secret");
    let bee_proof = proof_of(&bee, "bee/own");
    // bee cannot ask for a proof of acme's name.
    let err = error_text(&ask_proof(&bee, "acme/secret"));
    assert!(
        err.contains("tenant 'bee' may only use names under 'bee/'"),
        "{err}"
    );
    let mut forged = bee_proof.clone();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    let stolen = Record {
        name: "bee/stolen".into(),
        rename: Some(RenameLink::From("bee/own".into())),
        ..secret.clone()
    };
    let (addr, mn) = coordinator("bee/stolen");
    let attempts = [
        (Vec::new(), "it carries no link proof for its replicas"),
        (
            forged,
            "does not match this cluster's key for tenant \"bee\"",
        ),
        (bee_proof.clone(), "but the Link binds"),
        (acme_proof.clone(), "issued to another tenant"),
    ];
    for (i, (proof, want)) in attempts.into_iter().enumerate() {
        let link = Msg::new(
            710 + i as u64,
            addr,
            Body::Link {
                record: stolen.clone(),
                proof,
            },
        );
        let reply = udp_ask(mn, &link.seal_tenant(&bee, unix_ms()).unwrap());
        match &reply.body {
            Body::Error { code, message } => {
                assert_eq!(*code, Code::Forbidden, "{message}");
                assert!(message.contains(want), "{message:?} lacks {want:?}");
                assert!(
                    message.contains("Link of \"bee/stolen\" refused"),
                    "{message}"
                );
                assert!(message.ends_with("nothing done"), "{message}");
            }
            other => panic!("attempt {i} not refused: {other:?}"),
        }
    }
    // Nothing was bound: no copy of bee/stolen anywhere, so no Get ticket
    // for acme's replicas under it.
    std::thread::sleep(Duration::from_millis(300));
    for meta in table.meta_addrs("bee/stolen") {
        match ask_copy(&bee, &table, meta, "bee/stolen").1 {
            Body::Error { code, .. } => assert_eq!(code, Code::NotFound),
            b => panic!("bee/stolen bound: {b:?}"),
        }
    }
    let err = store.fails(&["obj", "stat", "--credential", &bee_file, "bee/stolen"]);
    assert!(err.contains("no object named"), "{err}");
    // A proved Link works, and its resend (same request, same socket) is
    // answered the same from the reply cache.
    let (addr, mn) = coordinator("acme/alias");
    let alias = Msg::new(
        720,
        addr,
        Body::Link {
            record: Record {
                name: "acme/alias".into(),
                rename: Some(RenameLink::From("acme/secret".into())),
                ..secret.clone()
            },
            proof: acme_proof,
        },
    );
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let bytes = alias.seal_tenant(&acme, unix_ms()).unwrap();
    let mut versions = Vec::new();
    for _ in 0..2 {
        sock.send_to(&bytes, mn).unwrap();
        let mut buf = vec![0u8; 70_000];
        let (n, _) = sock.recv_from(&mut buf).unwrap();
        match Msg::decode(&buf[..n]).unwrap().body {
            Body::Done { version } => versions.push(version),
            b => panic!("a proved Link refused: {b:?}"),
        }
    }
    assert_eq!(versions[0], versions[1]);
    // `strata obj mv` within each tenant's scope, and the data reads back.
    let back = dir.path().join("back");
    store.ok(&[
        "obj",
        "mv",
        "--credential",
        &bee_file,
        "bee/own",
        "bee/moved",
    ]);
    store.ok(&[
        "obj",
        "get",
        "--credential",
        &bee_file,
        "bee/moved",
        &p(&back),
    ]);
    assert!(std::fs::read(&back).unwrap() == pattern(5000, 8));
    assert_eq!(record_of("bee/moved").replicas, own.replicas);
    let err = store.fails(&["obj", "stat", "--credential", &bee_file, "bee/own"]);
    assert!(err.contains("\"bee/own\" was deleted"), "{err}");
    // acme's object is as it was, and reads back.
    assert_eq!(store.json(&["obj", "stat", "acme/secret"]), before);
    let (_, got) = rt.block_on(client.get_bytes("acme/secret")).unwrap();
    assert!(got == pattern(5000, 7));
}

/// `strata store up --dir D` writes an admin credential that `strata obj
/// --dir D` uses; `strata store tenant add` writes a tenant's, which
/// works in its scope and is refused outside it.
#[test]
fn the_admin_credential_works_and_a_tenant_is_held_to_its_names() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tmp();
    let d = dir.path().join("cluster");
    let store = Store::up(&d, &[]);
    let on = store.on.to_string();
    // No STRATA_CREDENTIAL from the test's Store::run here.
    let obj = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .arg("obj")
            .args(args)
            .args(["--cluster", &on])
            .env_remove(CREDENTIAL_ENV)
            .output()
            .expect("run strata obj")
    };
    let ok = |args: &[&str]| {
        let out = obj(args);
        assert!(
            out.status.success(),
            "strata obj {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let fails = |args: &[&str]| {
        let out = obj(args);
        assert!(!out.status.success(), "strata obj {args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let admin_file = d.join(ADMIN_CREDENTIAL_FILE);
    let mode = std::fs::metadata(&admin_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(10_000, 3)).unwrap();
    let back = dir.path().join("back");
    let dp = p(&d);
    ok(&["put", "--dir", &dp, &p(&src), "other/x"]);
    ok(&["get", "--dir", &dp, "other/x", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(10_000, 3));
    // Without any credential: refused before sending, with what to do.
    let err = fails(&["stat", "other/x"]);
    assert!(
        err.contains("--credential") && err.contains("store tenant add"),
        "{err}"
    );

    let out = strata_ok(&[
        "store", "tenant", "add", "--dir", &dp, "--tenant", "acme", "--output", "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let cred = PathBuf::from(v["credential"].as_str().unwrap());
    assert_eq!(cred, d.join("acme.credential"));
    assert_eq!(v["scope"], "names under 'acme/'");
    let mode = std::fs::metadata(&cred).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let c = p(&cred);
    ok(&["put", "--credential", &c, &p(&src), "acme/a"]);
    ok(&["get", "--credential", &c, "acme/a", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(10_000, 3));
    ok(&["mv", "--credential", &c, "acme/a", "acme/b"]);
    let listed = ok(&["ls", "--credential", &c, "acme/"]);
    assert!(listed.contains("acme/b"), "{listed}");
    let scope = "tenant 'acme' may only use names under 'acme/'";
    for args in [
        vec!["put", "--credential", &c, &p(&src), "other/y"],
        vec!["get", "--credential", &c, "other/x", &p(&back)],
        vec!["stat", "--credential", &c, "other/x"],
        vec!["rm", "--credential", &c, "other/x"],
        vec!["mv", "--credential", &c, "acme/b", "other/b"],
        vec!["ls", "--credential", &c, ""],
    ] {
        let err = fails(&args);
        assert!(err.contains(scope), "{args:?}: {err}");
    }
    // Nothing of that happened: the admin sees other/x unchanged, acme/b
    // still there, and no other/y or other/b.
    let stat = |name: &str| obj(&["stat", "--dir", &dp, name]);
    assert!(stat("other/x").status.success());
    assert!(stat("acme/b").status.success());
    assert!(!stat("other/y").status.success());
    assert!(!stat("other/b").status.success());
    // The environment variable names a credential too.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["obj", "stat", "other/x", "--cluster", &on])
        .env(CREDENTIAL_ENV, &cred)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains(scope));
    // A bad tenant id is refused with the rule.
    let out = strata(&["store", "tenant", "add", "--dir", &dp, "--tenant", "a/b"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid"));
}

/// `strata store tenant revoke` cuts one tenant's credential off within
/// the table refresh bound, leaves every other tenant alone, lets the
/// next generation in, and survives an orchestrator restart.
#[test]
fn a_revoked_tenant_credential_is_refused_and_the_next_generation_works() {
    let dir = tmp();
    let d = dir.path().join("cluster");
    let mut store = Store::up(&d, &[]);
    let dp = p(&d);
    let src = dir.path().join("src");
    std::fs::write(&src, pattern(5_000, 7)).unwrap();
    let back = dir.path().join("back");
    // Issued by asking the orchestrator (--cluster, added by `run`).
    let issue = |store: &Store, tenant: &str, out: &Path| {
        let v = store.json(&[
            "store",
            "tenant",
            "add",
            "--dir",
            &dp,
            "--tenant",
            tenant,
            "--out",
            &p(out),
        ]);
        v["generation"].as_u64().expect("a generation")
    };
    let acme_old = dir.path().join("acme-old.credential");
    let bee = dir.path().join("bee.credential");
    assert_eq!(issue(&store, "acme", &acme_old), 0);
    assert_eq!(issue(&store, "bee", &bee), 0);
    // Never revoked: its generation-0 credential must work throughout.
    let cat = dir.path().join("cat.credential");
    assert_eq!(issue(&store, "cat", &cat), 0);
    let obj = |store: &Store, cred: &Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .arg("obj")
            .args(args)
            .args(["--cluster", &store.on.to_string(), "--credential", &p(cred)])
            .env_remove(CREDENTIAL_ENV)
            .output()
            .expect("run strata obj")
    };
    let ok = |store: &Store, cred: &Path, args: &[&str]| {
        let out = obj(store, cred, args);
        assert!(
            out.status.success(),
            "strata obj {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ok(&store, &acme_old, &["put", &p(&src), "acme/a"]);
    ok(&store, &acme_old, &["get", "acme/a", &p(&back)]);
    ok(&store, &bee, &["put", &p(&src), "bee/a"]);
    ok(&store, &cat, &["put", &p(&src), "cat/a"]);

    let v = store.json(&["store", "tenant", "revoke", "--tenant", "acme"]);
    assert_eq!(v["revoked_below"], 1, "{v}");
    let bound = v["takes_effect_within_ms"].as_u64().expect("a bound");
    assert_eq!(
        u128::from(bound),
        strata_store::runtime::REVOCATION_BOUND.as_millis()
    );
    assert_eq!(store.status()["revoked_tenants"], 1);
    let human = store.ok(&[
        "store", "tenant", "revoke", "--tenant", "bee", "--output", "human",
    ]);
    assert!(human.contains("within") && human.contains("ms"), "{human}");
    // bee was revoked too, just above: give it its next generation.
    let bee_new = dir.path().join("bee-new.credential");
    assert_eq!(issue(&store, "bee", &bee_new), 1);
    // The bound, with slack for a loaded machine.
    std::thread::sleep(Duration::from_millis(bound + 500));
    let revoked = "tenant 'acme' credential generation 0 was revoked";
    for args in [
        vec!["get", "acme/a", &p(&back)],
        vec!["put", &p(&src), "acme/new"],
        vec!["rm", "acme/a"],
    ] {
        let out = obj(&store, &acme_old, &args);
        assert!(
            !out.status.success(),
            "{args:?} accepted after the revocation"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(revoked) && err.contains("ask the operator for a new one"),
            "{args:?}: {err}"
        );
    }
    // Nothing of that happened.
    let admin = d.join(ADMIN_CREDENTIAL_FILE);
    ok(&store, &admin, &["stat", "acme/a"]);
    assert!(!obj(&store, &admin, &["stat", "acme/new"]).status.success());
    // The next generation works; the other tenant's new one too, and its
    // old one is refused like acme's.
    let acme_new = dir.path().join("acme-new.credential");
    assert_eq!(issue(&store, "acme", &acme_new), 1);
    let text = std::fs::read_to_string(&acme_new).unwrap();
    assert!(text.contains("generation 1"), "{text}");
    ok(&store, &acme_new, &["get", "acme/a", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(5_000, 7));
    ok(&store, &acme_new, &["put", &p(&src), "acme/b"]);
    ok(&store, &bee_new, &["get", "bee/a", &p(&back)]);
    assert!(!obj(&store, &bee, &["stat", "bee/a"]).status.success());
    ok(&store, &cat, &["get", "cat/a", &p(&back)]);
    ok(&store, &cat, &["put", &p(&src), "cat/b"]);
    // The admin tenant cannot be revoked alone.
    let err = store.fails(&["store", "tenant", "revoke", "--tenant", "*"]);
    assert!(err.contains("rotate the cluster key"), "{err}");

    // The revocation survives a restart (the orchestrator stores it with
    // its table).
    store.stop();
    let store = Store::up(&d, &[]);
    let out = obj(&store, &acme_old, &["stat", "acme/a"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(revoked));
    ok(&store, &acme_new, &["stat", "acme/a"]);
    ok(&store, &cat, &["stat", "cat/b"]);
    assert_eq!(
        issue(&store, "acme", &dir.path().join("again.credential")),
        1
    );
}

#[test]
fn the_cluster_key_is_rotated_in_three_reloads_under_load_without_a_failed_request() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use strata_store_protocol::auth::{open_answer, unix_ms, ClusterKey};
    let dir = tmp();
    let cdir = dir.path().join("cluster");
    let store = Store::up(
        &cdir,
        &["--mn", "2", "--sn", "2", "--replication", "2,2,2,2"],
    );
    // A storage node in a process of its own, with the same key files.
    let node = Node::add(&store, &cdir.join("sn-added"), "sn");
    store.wait_for_nodes("storage", 3);
    let added = store.status()["storage_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .nth(2)
        .unwrap();
    let pids = [store.pid(), node.0.id()];
    let mut before = Vec::new();
    for i in 0..6usize {
        let data = pattern(1000 + i * 50_000, i as u64);
        let src = dir.path().join(format!("in-{i}"));
        std::fs::write(&src, &data).unwrap();
        let name = format!("rot/{i}");
        store.ok(&["obj", "put", &p(&src), &name]);
        before.push((name, data));
    }
    let old_file = dir.path().join("old.key");
    std::fs::copy(store.key_path(), &old_file).unwrap();
    let old = ClusterKey::load(&old_file).unwrap();
    let old_fp = old.fingerprints().active;
    every_node_shows_the_keys_of(&store, &cdir, (old_fp, None));
    // Tenants' credentials are derived from the key: the clients run
    // with the admin credential of the old key until step 3, then with
    // the one `strata store up` issued again on its step-2 reload.
    let old_admin = admin(store.on);
    let start_clients = || {
        let stop = Arc::new(AtomicBool::new(false));
        let reader = spawn_reader(store.on, stop.clone(), before.clone());
        let load = {
            let stop = stop.clone();
            let on = store.on;
            std::thread::spawn(move || run_load(on, stop))
        };
        (stop, reader, load)
    };
    let check_clients = |(stop, reader, load): Clients| {
        stop.store(true, Ordering::Relaxed);
        let load = load.join().unwrap();
        let (gets, failures) = reader.join().unwrap();
        assert!(
            failures.is_empty(),
            "{} of {gets} Gets failed: {failures:?}",
            failures.len()
        );
        assert!(
            load.failed.is_empty() && load.get_failures.is_empty(),
            "{} of {} Puts and {} of {} Gets failed: {:?} {:?}",
            load.failed.len(),
            load.failed.len() + load.acked.len(),
            load.get_failures.len(),
            load.gets,
            load.failed,
            load.get_failures
        );
        assert!(
            load.acked.len() > 5 && gets > 5,
            "{} {gets}",
            load.acked.len()
        );
        load
    };
    let clients = start_clients();
    let under_load = || std::thread::sleep(Duration::from_millis(1500));
    under_load();

    // 1: a new key, accepted everywhere, used nowhere.
    let out = strata_ok(&["store", "key", "new", "--dir", &p(&cdir)]);
    assert!(out.contains("cluster.key.next"), "{out}");
    let new = ClusterKey::load(&cdir.join("cluster.key.next")).unwrap();
    let new_fp = new.fingerprints().active;
    assert_ne!(new_fp, old_fp);
    // A second `new` does not overwrite it.
    let out = strata(&["store", "key", "new", "--dir", &p(&cdir)]);
    assert!(!out.status.success());
    for pid in pids {
        hangup(pid);
    }
    wait_until("the orchestrator accepts the new key", || {
        open_answer(&sealed_table_ask(store.on, &new), None, 0)
            .is_some_and(|m| matches!(m.body, Body::Table { .. }))
    });
    // Still sealing with the old key.
    assert!(open_answer(&sealed_table_ask(store.on, &old), Some(&old), unix_ms()).is_some());
    // Every node says so before the next step.
    every_node_shows_the_keys_of(&store, &cdir, (old_fp, Some(new_fp)));
    under_load();

    // 2: swapped, one process after the other: the added node seals with
    // the new key while the others still seal (and issue tickets) with
    // the old one.
    strata_ok(&["store", "key", "swap", "--dir", &p(&cdir)]);
    assert!(cdir.join("cluster.key.prev").exists() && !cdir.join("cluster.key.next").exists());
    hangup(pids[1]);
    under_load();
    hangup(pids[0]);
    wait_until("the orchestrator seals with the new key", || {
        let answer = sealed_table_ask(store.on, &old);
        open_answer(&answer, Some(&new), unix_ms())
            .is_some_and(|m| matches!(m.body, Body::Table { .. }))
    });
    every_node_shows_the_keys_of(&store, &cdir, (new_fp, Some(old_fp)));
    under_load();
    // The admin credential was issued again with the new key; clients
    // switch to it before step 3 (as every tenant must).
    wait_until("the admin credential issued with the new key", || {
        admin(store.on).secret_bytes() != old_admin.secret_bytes()
    });
    let mut acked = check_clients(clients).acked;
    let clients = start_clients();
    under_load();

    // 3: the old key is gone.
    std::fs::remove_file(cdir.join("cluster.key.prev")).unwrap();
    for pid in pids {
        hangup(pid);
    }
    wait_until("the orchestrator refuses the old key", || {
        let answer = Msg::decode(&sealed_table_ask(store.on, &old)).unwrap();
        matches!(answer.body, Body::Error { .. })
    });
    every_node_shows_the_keys_of(&store, &cdir, (new_fp, None));
    under_load();
    let mut load = check_clients(clients);
    acked.append(&mut load.acked);
    load.acked = acked;
    // A credential of the old key is refused now, saying what to do.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stale = rt
        .block_on(strata_store_client::client::Client::connect(
            store.on, old_admin,
        ))
        .unwrap();
    let err = rt
        .block_on(stale.get_bytes("rot/0"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("issue it again"), "{err}");
    // Everything reads back.
    let (rt, client) = connect_client(store.on);
    for (name, want) in &before {
        assert_eq!(
            &rt.block_on(client.get_bytes(name)).unwrap().1,
            want,
            "{name}"
        );
    }
    for (name, seed) in &load.acked {
        let want = pattern((seed * 7919) % 200_000, *seed as u64);
        assert_eq!(
            rt.block_on(client.get_bytes(name)).unwrap().1,
            want,
            "{name}"
        );
    }
    // A control request sealed with the old key is refused, clearly; with
    // the new one it works.
    let err = store.fails(&["store", "node", "remove", "--key", &p(&old_file), &added]);
    assert!(err.contains("does not match"), "{err}");
    assert_eq!(store.status()["storage_nodes"][2]["state"], "up");
    let out = store.ok(&["store", "node", "remove", &added]);
    assert!(out.contains("retir"), "{out}");
}
