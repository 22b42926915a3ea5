//! Gets sent with `sendfile`: a client that stops reading holds only its
//! own connection, and a Get racing a Delete gets the whole object or a
//! clear error, never a mix.

use super::*;

/// The first replica address of `name`, from `strata obj stat`.
fn first_replica(store: &Store, name: &str) -> u128 {
    let stat = store.json(&["obj", "stat", name]);
    let text = stat["replicas"][0].as_str().expect("a replica address");
    u128::from(
        text.parse::<std::net::Ipv6Addr>()
            .expect("an IPv6 replica address"),
    )
}

/// The data timeout of the stall test, in ms.
const STALL_MS: u64 = 6000;

/// A client that reads the reply's header of a 48 MB Get and then
/// nothing: other clients are served meanwhile, in full and at once, and
/// the stalled connection is closed after the data timeout.
#[test]
fn a_client_that_stops_reading_mid_send_blocks_nobody_and_is_dropped() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &["--data-timeout-ms", &STALL_MS.to_string()],
    );
    let big = dir.path().join("big");
    let content = pattern(48 << 20, 9);
    std::fs::write(&big, &content).unwrap();
    store.ok(&["obj", "put", &p(&big), "big"]);
    let small = dir.path().join("small");
    std::fs::write(&small, pattern(300_000, 3)).unwrap();
    store.ok(&["obj", "put", &p(&small), "small"]);

    let sn = first_endpoint(&store, "storage");
    let key = strata_store_protocol::auth::ClusterKey::load(&store.key_path()).unwrap();
    let get = Request::Get {
        addr: first_replica(&store, "big"),
    }
    .encode(Credential::Seal(&key));
    let mut stalled = TcpStream::connect(sn).unwrap();
    stalled.write_all(&get).unwrap();
    let mut head = [0u8; 9];
    stalled.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0, "the Get was refused");
    assert_eq!(u64::from_be_bytes(head[1..].try_into().unwrap()), 48 << 20);
    let stalled_at = Instant::now();

    // Others are served in full while it stalls (before its timeout).
    let back = dir.path().join("back");
    store.ok(&["obj", "get", "small", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == pattern(300_000, 3));
    let whole = dir.path().join("whole");
    store.ok(&["obj", "get", "big", &p(&whole)]);
    assert!(std::fs::read(&whole).unwrap() == content);
    assert!(
        stalled_at.elapsed() < Duration::from_millis(STALL_MS),
        "the other Gets took {:?}: they may have waited for the stalled one",
        stalled_at.elapsed()
    );

    // Read nothing past the timeout: then the connection has ended,
    // short of the object.
    std::thread::sleep(Duration::from_millis(STALL_MS + 1500).saturating_sub(stalled_at.elapsed()));
    stalled
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let ended = stalled.read_to_end(&mut rest);
    assert!(
        ended.is_ok()
            || ended
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the stalled connection was not closed: {ended:?}"
    );
    assert!(
        (rest.len() as u64) < (48 << 20),
        "a stalled client got the whole object ({} bytes) and a trailer",
        rest.len()
    );
}

/// Gets of a 24 MB object race its Delete: each returns the whole object,
/// bit for bit, or fails with an error naming the object; none writes a
/// mix or a short file and calls it done.
#[test]
fn a_get_racing_a_delete_returns_the_whole_object_or_a_clear_error() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("cluster"), &[]);
    let content = pattern(24 << 20, 5);
    let src = dir.path().join("src");
    std::fs::write(&src, &content).unwrap();
    for round in 0..3 {
        let name = format!("racing/{round}");
        store.ok(&["obj", "put", &p(&src), &name]);
        let readers: Vec<_> = (0..4)
            .map(|i| {
                let out = dir.path().join(format!("out-{round}-{i}"));
                let child = store.command(&["obj", "get", &name, &p(&out)]);
                (out, child)
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20 * round as u64));
        store.ok(&["obj", "rm", &name]);
        for (out, child) in readers {
            let done = child.wait_with_output().unwrap();
            if done.status.success() {
                assert!(
                    std::fs::read(&out).unwrap() == content,
                    "a Get that succeeded wrote other bytes than the object"
                );
            } else {
                let err = String::from_utf8_lossy(&done.stderr);
                assert!(
                    err.contains(&name) || err.contains("not found") || err.contains("no replica"),
                    "an unclear error: {err}"
                );
            }
        }
    }
}
