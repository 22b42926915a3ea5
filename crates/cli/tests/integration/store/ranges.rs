//! Ranged reads (`strata obj get --range FIRST-LAST`), as real
//! processes: a range of a 64 MiB object is served from the chunks
//! covering it (the storage nodes' `/metrics` count the bytes they sent),
//! a chunk damaged on disk inside the range is caught by its CRC-32C and
//! another replica serves it, a replica of layout 1 (no chunk table) is
//! read whole and cut, and an erasure-coded object's ranges read back
//! exact with the node of one data fragment killed.

use super::*;

/// `obj get --range FIRST-LAST NAME` must give `want[FIRST..=LAST]`.
fn range_is(store: &Store, dir: &Path, name: &str, first: usize, last: usize, want: &[u8]) {
    let out = dir.join("range.out");
    let range = format!("{first}-{last}");
    store.ok(&["obj", "get", "--range", &range, name, &p(&out)]);
    let got = std::fs::read(&out).unwrap();
    assert!(
        got == want[first..=last],
        "{name} {range}: {} bytes, not the {} asked or other bytes",
        got.len(),
        last - first + 1
    );
}

#[test]
fn a_range_reads_only_its_chunks_and_a_damaged_chunk_is_read_elsewhere() {
    let dir = tmp();
    let mut extra = REPLICATED.to_vec();
    extra.extend(["--metrics", "127.0.0.1:0"]);
    let store = Store::up(&dir.path().join("cluster"), &extra);
    let size = 64 << 20;
    let data = pattern(size, 41);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    store.ok(&["obj", "put", &p(&src), "big"]);
    std::fs::remove_file(&src).unwrap();

    // 1 MiB from the middle: the nodes send its chunks (at most one
    // 64 KiB chunk more at each end), not the 64 MiB object.
    let sent = || store.metric_sum("strata_read_bytes_total");
    let ranges = || store.metric_sum("strata_range_reads_total");
    let (sent_before, ranges_before) = (sent(), ranges());
    let (first, last) = (40_000_000, 40_000_000 + (1 << 20) - 1);
    range_is(&store, dir.path(), "big", first, last, &data);
    let read = sent() - sent_before;
    assert!(
        ((1 << 20) as f64..=(1 << 20) as f64 + 2.0 * 65_536.0).contains(&read),
        "a 1 MiB range made the nodes send {read} bytes"
    );
    assert_eq!(ranges() - ranges_before, 1.0);
    // Edges: the first and last bytes, one byte, across a chunk boundary.
    for (first, last) in [(0, 0), (size - 1, size - 1), (65_535, 65_536), (0, 200_000)] {
        range_is(&store, dir.path(), "big", first, last, &data);
    }
    // Bad ranges are refused with the reason, before anything is read.
    let beyond = store.fails(&["obj", "get", "--range", "0-67108864", "big", "-"]);
    assert!(beyond.contains("holds 67108864 bytes"), "{beyond}");
    let backwards = store.fails(&["obj", "get", "--range", "9-3", "big", "-"]);
    assert!(backwards.contains("ends before it starts"), "{backwards}");
    let junk = store.fails(&["obj", "get", "--range", "ten-20", "big", "-"]);
    assert!(junk.contains("FIRST-LAST"), "{junk}");

    // A byte flipped in the first replica, inside the range: its chunk
    // fails its CRC-32C, another replica serves the range exact, and the
    // damaged replica is reported and repaired away.
    let replicas = store.addresses_of("big");
    let damaged = replicas[0].clone();
    let path = file_of_address(&store.dir, &damaged).expect("the first replica's file");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20 + first + 300_000] ^= 0x04;
    std::fs::write(&path, &bytes).unwrap();
    drop(bytes);
    let out = dir.path().join("range.out");
    let range = format!("{first}-{last}");
    let args = [
        "obj",
        "get",
        "--replica-choice",
        "primary",
        "--range",
        &range,
    ];
    store.ok(&[&args[..], &["big", &p(&out)]].concat());
    assert!(std::fs::read(&out).unwrap() == data[first..=last]);
    wait_until("the damaged replica repaired away", || {
        !store.addresses_of("big").contains(&damaged)
    });
    range_is(&store, dir.path(), "big", first, last, &data);

    // Replicas written before chunk tables (layout 1: header and data
    // only) are read whole and cut: the same bytes, no ranged read.
    let old = pattern(300_000, 43);
    std::fs::write(&src, &old).unwrap();
    store.ok(&["obj", "put", &p(&src), "old"]);
    for addr in store.addresses_of("old") {
        let path = file_of_address(&store.dir, &addr).expect("a replica file");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[4] = 1;
        bytes.truncate(20 + old.len());
        std::fs::write(&path, &bytes).unwrap();
    }
    let ranges_before = ranges();
    range_is(&store, dir.path(), "old", 70_000, 200_000, &old);
    assert_eq!(
        ranges(),
        ranges_before,
        "a layout 1 replica had a chunk table"
    );
}

#[test]
fn an_erasure_coded_object_s_ranges_survive_a_dead_data_fragment() {
    let dir = tmp();
    let store = Store::up(
        &dir.path().join("cluster"),
        &["--mn", "1", "--sn", "4", "--bucket-class", "ec=ec(4,2)"],
    );
    let mut extra = Node::add(&store, &dir.path().join("sn-a"), "sn");
    let _other = Node::add(&store, &dir.path().join("sn-b"), "sn");
    store.wait_for_nodes("storage", 6);
    std::thread::sleep(Duration::from_millis(1200));
    let size = 5_000_000;
    let data = pattern(size, 52);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    // An object with a data fragment (of the first k = 4) on the node
    // that will be killed.
    let name = (0..40)
        .map(|i| format!("ec/r{i}"))
        .find(|name| {
            store.ok(&["obj", "put", &p(&src), name]);
            store.addresses_of(name)[..4]
                .iter()
                .any(|f| file_of_address(&dir.path().join("sn-a"), f).is_some())
        })
        .expect("an object with a data fragment on sn-a");
    let spans = [
        (0, 0),
        (size - 1, size - 1),
        (1_000_000, 1_300_000),
        (123, 4_999_000),
        (262_100, 262_200),
    ];
    for &(first, last) in &spans {
        range_is(&store, dir.path(), &name, first, last, &data);
    }
    extra.kill9();
    // Decoded from the other fragments where the dead one held bytes.
    for &(first, last) in &spans {
        range_is(&store, dir.path(), &name, first, last, &data);
    }
}
