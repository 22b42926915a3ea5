//! F3 range fetches: a large ephemeral file another node holds is
//! fetched where it is read (plus a read-ahead), never pulled whole in
//! the background; every chunk is fetched once; a holder that goes away
//! or a file written again fails the copy with EIO, never with bytes of
//! another content. Real agents on loopback, read through their FUSE
//! mounts (the harness of [`crate::f3`]).

use crate::common::{pattern, strata};
use crate::f3::{agent_metric, F3, LEASE_MS, READ_LIMIT};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: u64 = 1024 * 1024;

/// The bytes node `a`'s transfer service has sent to other nodes.
fn served(f3: &F3) -> u64 {
    agent_metric(f3, 0, "strata_f3_served_bytes_total")
}

/// The bytes of `path` node `node` holds, as the locality service has it.
fn held(f3: &F3, path: &str, node: &str) -> u64 {
    let answer = f3.f3_json(&["where", path]);
    answer["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == node)
        .map(|n| n["bytes"].as_u64().unwrap())
        .unwrap_or(0)
}

/// Writes `data` to `path` through a mount, 1 MiB at a time.
fn write_file(path: &Path, data: &[u8]) {
    let mut file = std::fs::File::create(path).unwrap();
    for piece in data.chunks(MIB as usize) {
        file.write_all(piece).unwrap();
    }
}

/// `length` bytes at `offset` of an open file (fewer only at its end).
fn read_at(file: &std::fs::File, offset: u64, length: usize) -> std::io::Result<Vec<u8>> {
    let mut buffer = vec![0; length];
    let mut done = 0;
    while done < length {
        let n = file.read_at(&mut buffer[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buffer.truncate(done);
    Ok(buffer)
}

/// A 160 MiB file written on node a: node b reads 1 MiB at 150 MiB and
/// a few scattered ranges, right, while a serves only a few MiB and b
/// counts and reports only those; then a sequential read of the whole
/// file on b is right, and a has served each byte exactly once.
#[test]
fn a_large_remote_file_is_fetched_where_it_is_read_and_each_chunk_once() {
    let f3 = F3::up();
    let size = 160 * MIB;
    let data = pattern(size as usize, 30);
    write_file(&f3.mount(0).join("big.eph"), &data);
    let before = served(&f3);

    let file = std::fs::File::open(f3.mount(1).join("big.eph")).unwrap();
    let started = Instant::now();
    let first = read_at(&file, 150 * MIB, MIB as usize).unwrap();
    let first_took = started.elapsed();
    assert!(first == data[150 * MIB as usize..151 * MIB as usize]);
    // Scattered: inside a chunk, across a chunk boundary, the file's end.
    for (offset, length) in [
        (3 * MIB + 12_345, 200_000),
        (77 * MIB - 10, 4096),
        (size - 1000, 64 * 1024),
        (20 * MIB, 1),
    ] {
        let bytes = read_at(&file, offset, length).unwrap();
        let end = (offset as usize + length).min(size as usize);
        assert!(bytes == data[offset as usize..end], "at {offset}");
    }
    assert!(read_at(&file, size, 10).unwrap().is_empty(), "past the end");
    let scattered = served(&f3) - before;
    assert!(
        (5 * MIB..=12 * MIB).contains(&scattered),
        "node a served {scattered} bytes for 6 scattered chunks and a read-ahead, not the file"
    );
    // Node b counts (quota) and reports (locality) only what arrived.
    let copies = agent_metric(&f3, 1, "strata_f3_local_bytes{node=\"b\",kind=\"copies\"}");
    assert!(copies <= 12 * MIB, "b's copies take {copies} bytes");
    let reported = held(&f3, "/big.eph", "b");
    assert!(
        (MIB..=scattered).contains(&reported),
        "b reported holding {reported} bytes, having fetched {scattered}"
    );
    eprintln!("first 1 MiB at 150 MiB of a 160 MiB remote file: {first_took:?}");

    let whole = std::fs::read(f3.mount(1).join("big.eph")).unwrap();
    assert_eq!(whole.len() as u64, size);
    assert!(
        whole == data,
        "the sequential read differs from what a wrote"
    );
    assert_eq!(
        served(&f3) - before,
        size,
        "every chunk fetched exactly once"
    );
    crate::common::store::wait_until("b reports the whole copy", || {
        held(&f3, "/big.eph", "b") == size
    });
    // Complete now: read again on b from its copy alone.
    let again = std::fs::File::open(f3.mount(1).join("big.eph")).unwrap();
    assert!(
        read_at(&again, 100 * MIB, MIB as usize).unwrap()
            == data[100 * MIB as usize..101 * MIB as usize]
    );
    assert_eq!(served(&f3) - before, size);
    drop(file);
}

/// A large file written again on its holder while node b reads it: b's
/// open handle gets EIO for a chunk it did not have (never the new
/// bytes), still reads the old chunks it has, and a new open reads the
/// new content. b copies it by range, or whole when it opens the file
/// before the holder's close (FUSE sends it after `close` returns) has
/// reached the service: both copies must refuse the new content.
#[test]
fn a_file_written_again_fails_the_ranged_copy_rather_than_mix_contents() {
    let f3 = F3::up();
    let size = 80 * MIB;
    let old = pattern(size as usize, 31);
    let new = pattern(size as usize, 32);
    write_file(&f3.mount(0).join("re.eph"), &old);
    let file = std::fs::File::open(f3.mount(1).join("re.eph")).unwrap();
    let at = |data: &[u8], offset: u64| data[offset as usize..(offset + MIB) as usize].to_vec();
    assert!(read_at(&file, 10 * MIB, MIB as usize).unwrap() == at(&old, 10 * MIB));

    write_file(&f3.mount(0).join("re.eph"), &new);
    // EIO for a chunk b did not have yet; a chunk its copy already held
    // (on a slow machine its copy can get that far first) reads as the
    // old content. Never the new bytes.
    match read_at(&file, 50 * MIB, MIB as usize) {
        Err(error) => assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}"),
        Ok(bytes) => assert!(
            bytes == at(&old, 50 * MIB),
            "the old handle read bytes that are not the old content (the new content: {})",
            bytes == at(&new, 50 * MIB)
        ),
    }
    assert!(read_at(&file, 10 * MIB, MIB as usize).unwrap() == at(&old, 10 * MIB));

    let reopened = std::fs::File::open(f3.mount(1).join("re.eph")).unwrap();
    assert!(read_at(&reopened, 50 * MIB, MIB as usize).unwrap() == at(&new, 50 * MIB));
    assert!(read_at(&reopened, 10 * MIB, MIB as usize).unwrap() == at(&new, 10 * MIB));
}

/// A file node b pulls whole (its writer was open when b opened it),
/// opened again for writing with truncation on its holder before b has
/// it all: b's open handle gets EIO past the bytes it had, never the new
/// content after the old, and a new open reads the new content.
#[test]
fn a_whole_copy_of_a_file_written_again_never_mixes_contents() {
    let f3 = F3::up();
    let old = pattern(64 * 1024, 41);
    let new = pattern(256 * 1024, 42);
    let mut first = std::fs::File::create(f3.mount(0).join("again.eph")).unwrap();
    first.write_all(&old).unwrap();
    let reader = std::fs::File::open(f3.mount(1).join("again.eph")).unwrap();
    assert!(read_at(&reader, 0, old.len()).unwrap() == old);

    // A second writer empties it and writes another content while b's
    // copy waits at the end of the old one.
    write_file(&f3.mount(0).join("again.eph"), &new);
    drop(first);
    match read_at(&reader, old.len() as u64, 4096) {
        Err(error) => assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}"),
        Ok(bytes) => panic!(
            "the old handle read {} bytes past the old content (the new content's: {})",
            bytes.len(),
            bytes[..] == new[old.len()..old.len() + bytes.len()]
        ),
    }
    let reopened = std::fs::File::open(f3.mount(1).join("again.eph")).unwrap();
    assert!(read_at(&reopened, 0, new.len()).unwrap() == new);
}

/// The holder killed while node b reads its large file by range: a read
/// of a chunk b does not have gets EIO after the lease (never a hang,
/// never sooner than half of it); the chunks b has still read.
#[test]
fn a_ranged_copy_of_a_killed_holder_s_file_gives_eio_after_the_lease() {
    let mut f3 = F3::up();
    let size = 70 * MIB;
    let data = pattern(size as usize, 33);
    write_file(&f3.mount(0).join("gone.eph"), &data);
    let file = std::fs::File::open(f3.mount(1).join("gone.eph")).unwrap();
    assert!(read_at(&file, 0, MIB as usize).unwrap() == data[..MIB as usize]);

    let pid = f3.agents[0].1.as_ref().unwrap().pid();
    // SAFETY: signalling the agent this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let killed = Instant::now();
    let error = read_at(&file, 60 * MIB, 4096).expect_err("the holder is gone");
    let took = killed.elapsed();
    assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
    assert!(took < READ_LIMIT, "EIO after {took:?}");
    assert!(
        took < Duration::from_millis(LEASE_MS) + Duration::from_secs(3),
        "EIO after {took:?}"
    );
    assert!(
        took >= Duration::from_millis(LEASE_MS) / 2,
        "EIO after {took:?}, before the lease"
    );
    assert!(read_at(&file, 0, 4096).unwrap() == data[..4096]);
    f3.agents[1].1.as_mut().unwrap().assert_running();
}

/// A threshold that is no size is refused before anything starts.
#[test]
fn a_bad_range_threshold_is_refused() {
    let out = strata(&[
        "node",
        "--dir",
        "/nonexistent",
        "--mount",
        "/nonexistent",
        "--range-threshold",
        "lots",
    ]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("invalid size 'lots'"), "{text}");
}
