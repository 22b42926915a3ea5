//! Damaged replicas, as real processes: a byte flipped in a replica file
//! on disk is found by the storage node's scrub (or by a client's Get),
//! the metadata node repairs the record from a good copy and frees the
//! damaged one, and no Get ever returns bad bytes meanwhile.

use super::*;

/// One metadata node and four storage nodes, three replicas an object:
/// a repair copy always has a storage node of its own.
const CLUSTER: &[&str] = &["--mn", "1", "--sn", "4", "--replication", "1,1,3,2"];

/// Bytes of a replica file's header (`strata_store::storage::file`).
const HEADER: usize = 20;

/// The replica addresses of `name`'s record, as file names (32 hex
/// digits), in the record's order.
fn replica_names_of(store: &Store, name: &str) -> Vec<String> {
    store.json(&["obj", "stat", name])["replicas"]
        .as_array()
        .expect("a replica list")
        .iter()
        .map(|a| {
            let ip: std::net::Ipv6Addr = a.as_str().unwrap().parse().unwrap();
            format!("{:032x}", u128::from(ip))
        })
        .collect()
}

/// The file holding the replica named `file_name`, if a storage node
/// holds it.
fn replica_file(store: &Store, file_name: &str) -> Option<PathBuf> {
    store
        .replica_files()
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == file_name))
}

/// Whether the replica file at `path` is whole and its data has the
/// CRC-32C its header holds.
fn verifies(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    if bytes.len() < HEADER || &bytes[..4] != b"S6RP" {
        return false;
    }
    let size = u64::from_be_bytes(bytes[8..16].try_into().unwrap());
    let crc = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    // Layout 2: the data, then a CRC-32C per 64 KiB chunk of it.
    let table = size.div_ceil(64 << 10) * 4;
    let data = &bytes[HEADER..bytes.len().min(HEADER + size as usize)];
    bytes.len() as u64 == HEADER as u64 + size + table && crc32c::crc32c(data) == crc
}

/// Flips one bit of the data byte at `offset` in the replica file at
/// `path`, in place (what rot on the medium looks like).
fn flip(path: &Path, offset: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    f.read_exact_at(&mut byte, (HEADER + offset) as u64)
        .unwrap();
    byte[0] ^= 0x10;
    f.write_all_at(&byte, (HEADER + offset) as u64).unwrap();
    assert!(!verifies(path), "the flip is seen");
}

/// Posts `data` as `name` with `strata obj put`.
fn post(store: &Store, dir: &Path, name: &str, data: &[u8]) {
    let file = dir.join(name.replace('/', "_"));
    std::fs::write(&file, data).unwrap();
    store.ok(&["obj", "put", &p(&file), name]);
}

/// Waits until `name`'s record no longer names `bad` (a replica file
/// name) and names three replicas that all verify, and the damaged file
/// is freed.
fn wait_repaired(store: &Store, name: &str, bad: &str, limit: Duration) {
    let mut last = Vec::new();
    wait_until_long(&format!("{name} repaired"), limit, || {
        last = replica_names_of(store, name);
        !last.iter().any(|r| r == bad)
            && last.len() == 3
            && last
                .iter()
                .all(|r| replica_file(store, r).is_some_and(|f| verifies(&f)))
            && replica_file(store, bad).is_none()
    });
}

/// `strata obj get NAME -` in a loop until `stop`, each read compared
/// with the object's bytes: (Gets made, what went wrong).
fn spawn_cli_reader(
    store: &Store,
    objects: Vec<(String, Vec<u8>)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, Vec<String>)> {
    let (on, dir, key) = (store.on.to_string(), store.dir.clone(), store.key_path());
    std::thread::spawn(move || {
        let (mut gets, mut wrong) = (0u64, Vec::new());
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for (name, want) in &objects {
                let out = Command::new(env!("CARGO_BIN_EXE_strata"))
                    .args(["obj", "get", "--replica-choice", "primary", name, "-"])
                    .args(["--cluster", &on])
                    .env("STRATA_CLUSTER_KEY", &key)
                    .env(CREDENTIAL_ENV, dir.join(ADMIN_CREDENTIAL_FILE))
                    .output()
                    .expect("run strata obj get");
                gets += 1;
                if !out.status.success() {
                    wrong.push(format!(
                        "{name}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                } else if out.stdout != *want {
                    wrong.push(format!("{name}: wrong bytes ({} read)", out.stdout.len()));
                }
            }
        }
        (gets, wrong)
    })
}

/// The scrub finds replicas flipped on disk while clients read: the
/// metadata node repairs each record from a good copy and frees the
/// damaged replica, and no Get returns bad bytes. The scrubbed objects
/// are ones no client reads, so only the scrub can have found them.
#[test]
fn the_scrub_finds_flipped_replicas_and_they_are_repaired_while_gets_stay_correct() {
    let dir = tmp();
    let mut args = CLUSTER.to_vec();
    args.extend(["--scrub-rate", "64M", "--scrub-pause-ms", "300"]);
    let store = Store::up(&dir.path().join("cluster"), &args);
    let sizes = [1usize, 4_096, 300_000, 1_500_000];
    let mut read = Vec::new();
    let mut unread = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        for (list, prefix) in [(&mut read, "read"), (&mut unread, "scrubbed")] {
            let name = format!("{prefix}/{i}");
            let data = pattern(size, 7 + i as u64);
            post(&store, dir.path(), &name, &data);
            list.push((name, data));
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| spawn_cli_reader(&store, read.clone(), stop.clone()))
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    // One replica of every object flipped while the readers run: the read
    // objects' first replica (the one the readers' Gets, with the primary
    // choice, try first), the others' last.
    let mut flipped = Vec::new();
    for (k, (name, data)) in read.iter().chain(&unread).enumerate() {
        let replicas = replica_names_of(&store, name);
        assert_eq!(replicas.len(), 3, "{name}: {replicas:?}");
        let bad = if k < read.len() {
            replicas[0].clone()
        } else {
            replicas[2].clone()
        };
        let file = replica_file(&store, &bad).expect("the replica's file");
        flip(&file, data.len() / 2);
        flipped.push((name.clone(), bad));
        std::thread::sleep(Duration::from_millis(100));
    }
    for (name, bad) in &flipped {
        wait_repaired(&store, name, bad, Duration::from_secs(60));
    }
    // Reads go on over the repaired objects for a while.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for reader in readers {
        let (gets, wrong) = reader.join().unwrap();
        assert!(gets >= read.len() as u64, "{gets} Gets");
        assert!(
            wrong.is_empty(),
            "{} of {gets} Gets went wrong: {wrong:?}",
            wrong.len()
        );
    }
    // Every object reads back whole, and every replica file verifies.
    for (name, data) in read.iter().chain(&unread) {
        let out = store.run(&["obj", "get", name, "-"]);
        assert!(out.status.success() && out.stdout == *data, "{name}");
    }
    let bad: Vec<_> = store
        .replica_files()
        .into_iter()
        .filter(|f| !verifies(f))
        .collect();
    assert!(bad.is_empty(), "damaged replica files left: {bad:?}");
}

/// With the scrub off, a Get that meets a damaged replica (bytes failing
/// the CRC, or a file its node refuses as damaged) still returns the
/// object's bytes from another replica, and its report makes the
/// metadata node repair the record.
#[test]
fn a_get_of_a_damaged_replica_returns_the_right_bytes_and_reports_it_for_repair() {
    let dir = tmp();
    let mut args = CLUSTER.to_vec();
    args.extend(["--scrub-rate", "0"]);
    let store = Store::up(&dir.path().join("cluster"), &args);
    let flipped = pattern(200_000, 3);
    let torn = pattern(70_000, 4);
    post(&store, dir.path(), "get/flipped", &flipped);
    post(&store, dir.path(), "get/torn", &torn);
    // The first replica of each, which a Get with the primary choice
    // reads first.
    let bad_flipped = replica_names_of(&store, "get/flipped")[0].clone();
    flip(
        &replica_file(&store, &bad_flipped).unwrap(),
        flipped.len() - 1,
    );
    let bad_torn = replica_names_of(&store, "get/torn")[0].clone();
    let torn_file = replica_file(&store, &bad_torn).unwrap();
    let len = std::fs::metadata(&torn_file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&torn_file)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    // Nothing repairs them until they are read: no scrub, no node down.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(replica_names_of(&store, "get/flipped").contains(&bad_flipped));
    assert!(replica_names_of(&store, "get/torn").contains(&bad_torn));

    for (name, data, bad) in [
        ("get/flipped", &flipped, &bad_flipped),
        ("get/torn", &torn, &bad_torn),
    ] {
        let out = store.run(&["obj", "get", "--replica-choice", "primary", name, "-"]);
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == *data, "{name}: wrong bytes");
        wait_repaired(&store, name, bad, Duration::from_secs(20));
        let again = store.run(&["obj", "get", name, "-"]);
        assert!(again.status.success() && again.stdout == *data, "{name}");
    }
}
