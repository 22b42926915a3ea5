//! `strata mirror` with real processes on loopback: a repository (HTTP
//! range server or file), several mirrors linked as peers, read through
//! NBD with nbdcopy, libnbd and qemu-img; a hostile peer played by the test.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::store::Store;
use crate::common::{p, run_ok, tmp, Launch, Proc};
use strata_mirror::digest::Manifest;
use strata_mirror::wire::{self, Limits, Msg};

const MIB: usize = 1 << 20;
const CHUNK: usize = 32 * 1024;

/// What a mirror or repository server prints on its readiness line.
impl Proc {
    /// `nbd://IP:PORT` of a mirror.
    fn nbd(&self) -> String {
        format!("nbd://{}", self.word_after("nbd://"))
    }

    /// Peer address of a mirror.
    fn peer(&self) -> String {
        self.word_after(" peer listen address ")
    }

    /// URL of a repository server.
    fn url(&self) -> String {
        format!("http://{}", self.word_after("http://"))
    }
}

/// A random image of `size` bytes with its manifest.
fn image(dir: &Path, size: usize) -> PathBuf {
    let path = dir.join("base.raw");
    let mut data = vec![0u8; size];
    let mut x: u64 = 0x1234_5678_9abc_def1 ^ size as u64;
    for b in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes()[..b.len()]);
    }
    std::fs::write(&path, &data).unwrap();
    crate::common::strata_ok(&["mirror", "digest", &p(&path)]);
    path
}

fn mirror(repo: &str, dir: &Path, extra: &[&str]) -> Proc {
    let d = p(dir);
    let mut args = vec!["mirror", "--repo", repo, "--dir", &d, "-p", "0"];
    args.extend_from_slice(extra);
    Proc::start(&args)
}

/// The mirror's counters (waits for the periodic stats file to catch up).
fn stats(dir: &Path) -> serde_json::Value {
    std::thread::sleep(Duration::from_millis(700));
    let out = crate::common::strata_ok(&["mirror", "stats", "--output", "json", &p(dir)]);
    serde_json::from_str(&out).expect("stats json")
}

fn n(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// Copies the whole export with nbdcopy and returns its bytes.
fn read_all(nbd: &str, dir: &Path, name: &str) -> Vec<u8> {
    let out = dir.join(name);
    run_ok("nbdcopy", &[nbd, &p(&out)]);
    std::fs::read(out).unwrap()
}

/// Reads `len` bytes at `off` through libnbd (Python), 32 KiB at a time, in order.
fn read_range(nbd: &str, off: usize, len: usize) -> Vec<u8> {
    let script = format!(
        "import nbd, sys\nh = nbd.NBD()\nh.connect_uri('{nbd}')\nout = bytearray()\nfor o in range({off}, {end}, 32768):\n    out += h.pread(min(32768, {end} - o), o)\nsys.stdout.buffer.write(out)\n",
        end = off + len
    );
    let out = Command::new(crate::common::nbd_python())
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "libnbd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn eight_mirrors_read_the_image_identically_sharing_chunks() {
    let dir = tmp();
    let img = image(dir.path(), 16 * MIB);
    let data = std::fs::read(&img).unwrap();
    // The repository is the scarce link, as in a cloud (8 MB/s for eight
    // 16 MiB readers): on a loaded test machine, peers slowed by the CPU
    // still beat it.
    let repo = Proc::start(&["mirror", "repo-serve", "-p", "0", "--rate", "8M", &p(&img)]);
    let url = repo.url();
    let mut mirrors: Vec<Proc> = Vec::new();
    for i in 0..8 {
        let peers = mirrors.iter().map(Proc::peer).collect::<Vec<_>>().join(",");
        let d = dir.path().join(format!("m{i}"));
        let mut extra = vec!["--fanout", "3"];
        if !peers.is_empty() {
            extra.extend(["--peers", &peers]);
        }
        mirrors.push(mirror(&url, &d, &extra));
    }
    let readers: Vec<_> = mirrors
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (nbd, out) = (m.nbd(), dir.path().join(format!("out{i}.raw")));
            std::thread::spawn(move || run_ok("nbdcopy", &[&nbd, &p(&out)]))
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let mut from_repo = 0;
    let mut from_peers = 0;
    let mut deferred = 0;
    for i in 0..8 {
        let got = std::fs::read(dir.path().join(format!("out{i}.raw"))).unwrap();
        assert!(got == data, "mirror {i} differs from the image");
        let s = stats(&dir.path().join(format!("m{i}")));
        assert_eq!(n(&s, "corrupt_from_peers"), 0);
        assert_eq!(s["remote"], 0, "{s}");
        from_repo += n(&s, "repo_demand") + n(&s, "repo_prefetch");
        from_peers += n(&s, "peer_demand") + n(&s, "peer_prefetch");
        deferred += n(&s, "repo_deferred");
    }
    // Mirrors reading the same chunks at once held repository fetches
    // back for the peer first in line.
    assert!(deferred > 0, "no repository fetch was deferred to a peer");
    // qemu-img agrees, through the NBD export.
    run_ok(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            &p(&img),
            &mirrors[7].nbd(),
        ],
    );
    let chunks = (16 * MIB / CHUNK) as u64;
    eprintln!("8 mirrors: {from_repo} chunks from the repository, {from_peers} from peers");
    // A read that claims a chunk under prefetch fetches it too: a few
    // chunks arrive twice.
    let fetched = from_repo + from_peers;
    assert!(
        fetched >= 8 * chunks && fetched <= 8 * chunks + 8 * chunks / 10,
        "{fetched}"
    );
    assert!(
        from_repo < 4 * chunks,
        "peers must carry most chunks: {from_repo} from the repository, {from_peers} from peers"
    );
}

#[test]
fn local_writes_stay_local_and_a_restarted_mirror_resumes() {
    let dir = tmp();
    let img = image(dir.path(), 4 * MIB);
    let data = std::fs::read(&img).unwrap();
    let chunks = (4 * MIB / CHUNK) as u64;
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    let mut a = mirror(&p(&img), &da, &[]);
    // B links to A first, so it hears A advertise every chunk it reads.
    let b = mirror(&p(&img), &db, &["--peers", &a.peer(), "--unmatched", "0"]);
    wait_until("B linked to A", 10, || n(&stats(&db), "links") == 1);
    assert_eq!(read_all(&a.nbd(), dir.path(), "a1.raw"), data);
    // Then A writes four whole chunks and part of chunk 32.
    run_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0xab 0 128k",
            "-c",
            "write -P 0xcd 1048586 100",
            &a.nbd(),
        ],
    );
    let mut expected = data.clone();
    expected[..128 * 1024].fill(0xab);
    expected[MIB + 10..MIB + 110].fill(0xcd);
    assert_eq!(read_all(&a.nbd(), dir.path(), "a2.raw"), expected);

    // B asks A for everything; A refuses what it wrote, B gets the
    // image's data from the repository.
    assert_eq!(read_all(&b.nbd(), dir.path(), "b.raw"), data);
    let (sa, sb) = (stats(&da), stats(&db));
    assert_eq!(n(&sa, "refused"), 5, "{sa}");
    assert_eq!(n(&sa, "served"), chunks - 5);
    assert_eq!(n(&sa, "written"), 5);
    assert_eq!(
        n(&sb, "repo_demand"),
        5,
        "the written chunks come from the repository: {sb}"
    );
    assert_eq!(n(&sb, "peer_unavailable"), 5);
    assert_eq!(n(&sb, "peer_demand"), chunks - 5);
    assert_eq!(n(&sb, "corrupt_from_peers"), 0);
    // A new peer is not even told about written chunks.
    let dc = dir.path().join("c");
    let c = mirror(&p(&img), &dc, &["--peers", &a.peer(), "--unmatched", "0"]);
    wait_until("C linked to A", 10, || n(&stats(&dc), "links") == 1);
    assert!(read_range(&c.nbd(), 0, 256 * 1024) == data[..256 * 1024]);
    let sc = stats(&dc);
    assert_eq!(n(&sc, "peer_unavailable"), 0, "{sc}");
    assert_eq!(
        (n(&sc, "repo_demand"), n(&sc, "peer_demand")),
        (4, 4),
        "{sc}"
    );
    drop(c);
    drop(b);

    // Restart A after damaging one stored chunk: only that one is fetched again.
    a.stop_ok();
    let raw = da.join("image.raw");
    let mut stored = std::fs::read(&raw).unwrap();
    stored[10 * CHUNK + 7] ^= 0xff;
    std::fs::write(&raw, stored).unwrap();
    let a = mirror(&p(&img), &da, &["--no-peers"]);
    assert!(
        a.line.contains(&format!("{} held", chunks - 1)),
        "{}",
        a.line
    );
    assert_eq!(read_all(&a.nbd(), dir.path(), "a3.raw"), expected);
    let s = stats(&da);
    assert_eq!(n(&s, "recovered"), chunks - 1);
    assert_eq!(n(&s, "repo_demand"), 1, "{s}");
    assert_eq!(n(&s, "written"), 5);
}

#[test]
fn a_peer_killed_mid_transfer_costs_only_a_fallback() {
    let dir = tmp();
    let img = image(dir.path(), 8 * MIB);
    let data = std::fs::read(&img).unwrap();
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    // A holds everything but sends to peers at 512 KiB/s: B's copy is
    // still running when A dies.
    let a = mirror(&p(&img), &da, &["--peer-rate", "512k"]);
    assert_eq!(read_all(&a.nbd(), dir.path(), "a.raw"), data);
    let b = mirror(
        &p(&img),
        &db,
        &[
            "--peers",
            &a.peer(),
            "--unmatched",
            "0",
            "--demand-timeout",
            "3",
        ],
    );
    wait_until("B linked to A", 10, || n(&stats(&db), "links") == 1);
    let nbd = b.nbd();
    let out = dir.path().join("b.raw");
    let copy = std::thread::spawn({
        let out = out.clone();
        move || run_ok("nbdcopy", &[&nbd, &p(&out)])
    });
    std::thread::sleep(Duration::from_millis(1500));
    drop(a); // SIGKILL
    copy.join().unwrap();
    assert!(
        std::fs::read(&out).unwrap() == data,
        "B differs from the image"
    );
    let s = stats(&db);
    assert!(
        n(&s, "peer_demand") > 0,
        "some chunks came from A before it died: {s}"
    );
    assert!(
        n(&s, "repo_demand") > 0,
        "the rest from the repository: {s}"
    );
    assert_eq!(n(&s, "links"), 0);
}

/// Plays a peer that advertises every chunk and answers with garbage;
/// counts the lies told.
fn lying_peer(listener: TcpListener, manifest: Manifest, lies: Arc<AtomicU64>) {
    let me = listener.local_addr().unwrap().to_string();
    let limits = Limits {
        chunks: manifest.chunks(),
        chunk_size: manifest.chunk_size,
    };
    while let Ok((mut s, _)) = listener.accept() {
        let m = manifest.clone();
        let me = me.clone();
        let lies = lies.clone();
        std::thread::spawn(move || {
            let hello = Msg::Hello {
                image_id: m.id(),
                chunk_size: m.chunk_size,
                chunks: m.chunks(),
                listen: me,
            };
            if s.write_all(&wire::encode(&hello)).is_err() {
                return;
            }
            if wire::read_frame(&mut s, 256).is_err() {
                return;
            }
            let _ = s.write_all(&wire::encode(&Msg::Have((0..m.chunks()).collect())));
            while let Ok(body) = wire::read_frame(&mut s, limits.max_frame()) {
                if let Ok(Msg::Want { req, chunk, .. }) = wire::decode(&body, &limits) {
                    let data = vec![0x5a; m.extent(chunk).1];
                    let reply = Msg::Data { req, chunk, data };
                    lies.fetch_add(1, Ordering::SeqCst);
                    if s.write_all(&wire::encode(&reply)).is_err() {
                        return;
                    }
                }
            }
        });
    }
}

#[test]
fn a_peer_sending_corrupt_chunks_is_detected_and_ignored() {
    let dir = tmp();
    let img = image(dir.path(), 2 * MIB);
    let data = std::fs::read(&img).unwrap();
    let mut digest_path = img.clone().into_os_string();
    digest_path.push(".digest");
    let manifest = Manifest::decode(&std::fs::read(digest_path).unwrap(), "test").unwrap();
    let liar = TcpListener::bind("127.0.0.1:0").unwrap();
    let liar_addr = liar.local_addr().unwrap().to_string();
    let lies = Arc::new(AtomicU64::new(0));
    let told = lies.clone();
    std::thread::spawn(move || lying_peer(liar, manifest, told));
    let db = dir.path().join("b");
    let b = mirror(&p(&img), &db, &["--peers", &liar_addr, "--unmatched", "0"]);
    wait_until("B linked to the liar", 10, || n(&stats(&db), "links") == 1);
    // The liar announces every chunk right after the handshake; on a busy
    // machine that message can trail the link count, and a read before it
    // would ask the repository only.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(read_all(&b.nbd(), dir.path(), "b.raw"), data);
    // The stats file is rewritten every 0.5 s: wait for it to show the
    // reads' end before comparing.
    let lies = lies.load(Ordering::SeqCst);
    wait_until("stats counting every lie", 10, || {
        n(&stats(&db), "corrupt_from_peers") == lies
    });
    let s = stats(&db);
    // Every lie is caught, and the liar is marked suspect after its first:
    // requests already in flight then are the only others it gets, so no
    // chunk is asked of it twice (at most one lie per chunk).
    assert!(
        (1..=(2 * MIB / CHUNK) as u64).contains(&lies),
        "the liar is ignored after its first lie: {lies}"
    );
    assert_eq!(n(&s, "repo_demand"), (2 * MIB / CHUNK) as u64);
    assert_eq!(n(&s, "peer_demand"), 0);
}

/// Sends `bytes` to the mirror's peer port; true if it then closed the link.
fn closes_after(peer: &str, bytes: &[u8]) -> bool {
    let mut s = TcpStream::connect(peer).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // its HELLO and HAVE
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn malformed_peer_messages_get_a_clean_disconnect() {
    let dir = tmp();
    let img = image(dir.path(), MIB);
    let data = std::fs::read(&img).unwrap();
    let mut digest_path = img.clone().into_os_string();
    digest_path.push(".digest");
    let manifest = Manifest::decode(&std::fs::read(digest_path).unwrap(), "test").unwrap();
    let da = dir.path().join("a");
    let a = mirror(&p(&img), &da, &[]);
    let hello = |id: [u8; 32]| {
        wire::encode(&Msg::Hello {
            image_id: id,
            chunk_size: manifest.chunk_size,
            chunks: manifest.chunks(),
            listen: "127.0.0.1:2".into(),
        })
    };
    let good = hello(manifest.id());
    let then = |tail: &[u8]| [good.as_slice(), tail].concat();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "garbage instead of HELLO",
            b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        ),
        ("another image", hello([7; 32])),
        ("4 GiB frame", then(&[0xff, 0xff, 0xff, 0xff, 2])),
        (
            "chunk beyond the image",
            then(&wire::encode(&Msg::Have(vec![manifest.chunks()]))),
        ),
        ("unknown type", then(&[0, 0, 0, 1, 99])),
        ("truncated WANT", then(&[0, 0, 0, 3, 3, 0, 0])),
        ("second HELLO", then(&good)),
    ];
    for (what, bytes) in &cases {
        assert!(closes_after(&a.peer(), bytes), "{what}: link not closed");
    }
    // Still serving, correctly.
    assert_eq!(read_all(&a.nbd(), dir.path(), "a.raw"), data);
    // Links close asynchronously, after the socket does.
    wait_until("every hostile link closed", 20, || {
        n(&stats(&da), "links") == 0
    });
    let s = stats(&da);
    assert!(n(&s, "malformed_links") >= 4, "{s}");
    assert_eq!(n(&s, "links"), 0, "{s}");
}

#[test]
fn divergent_access_stops_prefetch_and_convergent_access_resumes_it() {
    let dir = tmp();
    let img = image(dir.path(), 8 * MIB);
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    let a = mirror(&p(&img), &da, &[]);
    let b = mirror(
        &p(&img),
        &db,
        &[
            "--peers",
            &a.peer(),
            "--unmatched",
            "16",
            "--resume-hits",
            "4",
            "--prefetch-threads",
            "1",
        ],
    );
    wait_until("B linked to A", 10, || n(&stats(&db), "links") == 1);
    // A reads the first half: B prefetches what A advertises, reads none of it.
    read_range(&a.nbd(), 0, 4 * MIB);
    wait_until("B stops prefetching", 20, || {
        stats(&db)["policy"]["switched_off"] == 1
    });
    // B reads elsewhere (divergent): prefetch stays off, nothing more is wasted.
    read_range(&b.nbd(), 6 * MIB, MIB);
    let s = stats(&db);
    assert_eq!(s["policy"]["prefetch_on"], false, "{s}");
    assert!(
        n(&s, "local_unread") <= 17,
        "at most the threshold is wasted: {s}"
    );
    assert!(s["policy"]["declined"].as_u64().unwrap() >= 100, "{s}");
    assert_eq!(n(&s, "peer_prefetch"), n(&s, "local_unread"));
    // B now reads what A read (convergent): declined chunks come from A on demand.
    read_range(&b.nbd(), 2 * MIB, MIB);
    let s = stats(&db);
    assert!(s["policy"]["switched_on"].as_u64().unwrap() >= 1, "{s}");
    assert!(n(&s, "peer_demand") >= 4, "{s}");
}

#[test]
fn a_recorded_trace_drives_prefetch_of_the_next_mirror() {
    let dir = tmp();
    let img = image(dir.path(), 4 * MIB);
    let data = std::fs::read(&img).unwrap();
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    // A boots from a scattered pattern and records it.
    let mut a = mirror(&p(&img), &da, &["--no-peers", "--record-trace"]);
    let pattern = [(3 * MIB, MIB), (0, MIB / 2), (2 * MIB, MIB / 4)];
    for (off, len) in pattern {
        assert!(read_range(&a.nbd(), off, len) == data[off..off + len]);
    }
    a.stop_ok();
    let mut trace = img.clone().into_os_string();
    trace.push(".trace");
    assert!(
        Path::new(&trace).exists(),
        "the trace is stored next to the image"
    );
    let sa = stats(&da);
    let trace_chunks = (MIB + MIB / 2 + MIB / 4) / CHUNK;
    assert_eq!(n(&sa, "repo_demand") as usize, trace_chunks);
    // B follows the trace: it fetches ahead of its reads.
    let b = mirror(
        &p(&img),
        &db,
        &["--no-peers", "--trace", "--trace-window", "16"],
    );
    for (off, len) in pattern {
        assert!(read_range(&b.nbd(), off, len) == data[off..off + len]);
    }
    let s = stats(&db);
    assert!(n(&s, "trace_prefetch") as usize >= trace_chunks / 2, "{s}");
    assert_eq!(
        (n(&s, "repo_demand") + n(&s, "repo_prefetch")) as usize,
        trace_chunks,
        "nothing outside the trace is fetched: {s}"
    );
    assert_eq!(n(&s, "local_unread"), 0);
}

#[test]
fn mirrors_find_each_other_through_the_repository() {
    let dir = tmp();
    let img = image(dir.path(), 2 * MIB);
    let data = std::fs::read(&img).unwrap();
    let repo = Proc::start(&["mirror", "repo-serve", "-p", "0", &p(&img)]);
    let dirs: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("m{i}"))).collect();
    let ms: Vec<Proc> = dirs
        .iter()
        .map(|d| mirror(&repo.url(), d, &["--rendezvous", "--unmatched", "0"]))
        .collect();
    for d in &dirs {
        wait_until("links through rendezvous", 15, || {
            n(&stats(d), "links") >= 1
        });
    }
    assert_eq!(read_all(&ms[0].nbd(), dir.path(), "0.raw"), data);
    wait_until("advertisements", 60, || {
        dirs[1..].iter().all(|d| n(&stats(d), "links") == 2)
    });
    assert_eq!(read_all(&ms[1].nbd(), dir.path(), "1.raw"), data);
    let s = stats(&dirs[1]);
    assert_eq!(n(&s, "peer_demand"), (2 * MIB / CHUNK) as u64, "{s}");
}

#[test]
fn bad_setups_are_refused_with_a_clear_error() {
    let dir = tmp();
    let img = image(dir.path(), MIB);
    let d = p(&dir.path().join("m"));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--repo".into(), p(&dir.path().join("none.raw"))],
            "cannot open repository image",
        ),
        (vec!["--repo".into(), "ftp://x/y".into()], "only http://"),
        (
            vec![
                "--repo".into(),
                p(&img),
                "--chunk-size".into(),
                "64k".into(),
            ],
            "--chunk-size",
        ),
        (
            vec![
                "--repo".into(),
                p(&img),
                "--unmatched".into(),
                "lots".into(),
            ],
            "--unmatched",
        ),
    ];
    for (args, msg) in cases {
        let mut all: Vec<&str> = vec!["mirror", "--dir", &d, "-p", "0"];
        all.extend(args.iter().map(String::as_str));
        let out = crate::common::strata(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{all:?}");
        assert!(err.contains(msg), "{all:?}: {err}");
    }
    // No manifest next to the image.
    let bare = dir.path().join("bare.raw");
    std::fs::write(&bare, vec![1u8; 65536]).unwrap();
    let out = crate::common::strata(&["mirror", "--repo", &p(&bare), "--dir", &d, "-p", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("strata mirror digest"));
    // A corrupt manifest.
    let mut dp = bare.clone().into_os_string();
    dp.push(".digest");
    std::fs::write(&dp, b"STRDGST1 nonsense").unwrap();
    let out = crate::common::strata(&["mirror", "--repo", &p(&bare), "--dir", &d, "-p", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid chunk manifest"));
}

#[test]
fn a_prefetch_that_times_out_falls_back_to_the_repository() {
    let dir = tmp();
    let img = image(dir.path(), 2 * MIB);
    let data = std::fs::read(&img).unwrap();
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    // A holds everything but uploads at 64 KiB/s: most of B's prefetch
    // requests cannot be answered within B's 0.5 s prefetch timeout.
    let a = mirror(&p(&img), &da, &["--peer-rate", "64k"]);
    assert_eq!(read_all(&a.nbd(), dir.path(), "a.raw"), data);
    // B's repository answers each read after 300 ms, as a remote one
    // would: B's prefetch cannot take the whole image from it before its
    // link to A is up (a local file could, on a loaded machine), so it
    // asks A first for most chunks.
    let repo = Proc::start(&[
        "mirror",
        "repo-serve",
        "-p",
        "0",
        "--latency-ms",
        "300",
        &p(&img),
    ]);
    let b = mirror(
        &repo.url(),
        &db,
        &[
            "--peers",
            &a.peer(),
            "--unmatched",
            "unlimited",
            "--prefetch-timeout",
            "0.5",
            "--prefetch-threads",
            "8",
        ],
    );
    let chunks = (2 * MIB / CHUNK) as u64;
    wait_until("B prefetches the whole image", 30, || {
        n(&stats(&db), "remote") == 0
    });
    let s = stats(&db);
    assert!(n(&s, "peer_timeouts") > 0, "{s}");
    assert!(
        n(&s, "repo_prefetch") > 0,
        "timed-out prefetches come from the repository: {s}"
    );
    assert_eq!(
        n(&s, "repo_prefetch") + n(&s, "peer_prefetch"),
        chunks,
        "{s}"
    );
    assert_eq!(read_all(&b.nbd(), dir.path(), "b.raw"), data);
}

/// An image published to the object store and mirrored from it: three
/// mirrors find each other through the store (rendezvous objects), read
/// the image identically through NBD, and the later ones get chunks from
/// their peers; a missing image or an unreachable store is a clear error.
#[test]
fn mirrors_read_an_image_published_in_the_object_store() {
    let dir = tmp();
    let img = image(dir.path(), 2 * MIB + 4096);
    let data = std::fs::read(&img).unwrap();
    let store = Store::up(&dir.path().join("store"), &[]);
    let on = store.on.to_string();
    // The mirror acts as the store's admin tenant: its credential comes
    // from the environment of each command (never the test's own, which
    // every test of this binary shares).
    let credential = dir
        .path()
        .join("store")
        .join(strata_store_protocol::tenant::ADMIN_CREDENTIAL_FILE);
    let as_admin = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(args)
            .env(strata_store_protocol::tenant::CREDENTIAL_ENV, &credential)
            .output()
            .expect("run strata")
    };
    let out = as_admin(&[
        "mirror",
        "publish",
        "--cluster",
        &on,
        "--part-size",
        "64k",
        "--output",
        "json",
        &p(&img),
        "images/base",
    ]);
    assert!(out.status.success(), "{}", crate::common::output_text(&out));
    let published: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(published["parts"], 33, "{published}");
    let repo = format!("store://{on}/images/base");
    assert_eq!(published["repo"], repo.as_str());
    let dirs: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("m{i}"))).collect();
    let ms: Vec<Proc> = dirs
        .iter()
        .map(|d| {
            let mut args = vec!["mirror", "--repo", &repo, "--dir"];
            let d = p(d);
            args.extend([d.as_str(), "-p", "0", "--rendezvous", "--unmatched", "0"]);
            Launch::strata(&args)
                .env(strata_store_protocol::tenant::CREDENTIAL_ENV, &credential)
                .start()
        })
        .collect();
    for d in &dirs {
        wait_until("links through rendezvous in the store", 15, || {
            n(&stats(d), "links") >= 1
        });
    }
    let len = data.len();
    assert_eq!(
        &read_all(&ms[0].nbd(), dir.path(), "0.raw")[..len],
        &data[..]
    );
    wait_until("advertisements", 60, || {
        dirs[1..].iter().all(|d| n(&stats(d), "links") == 2)
    });
    assert_eq!(
        &read_all(&ms[1].nbd(), dir.path(), "1.raw")[..len],
        &data[..]
    );
    let s = stats(&dirs[1]);
    assert!(n(&s, "peer_demand") > 0, "no chunk came from a peer: {s}");
    assert_eq!(n(&s, "corrupt_from_peers"), 0, "{s}");
    drop(ms);

    // Bad repositories: a name never published, a store nobody runs.
    let bad = |spec: &str, want: &str| {
        let d = p(&dir.path().join("bad"));
        let out = as_admin(&["mirror", "--repo", spec, "--dir", &d, "-p", "0"]);
        assert!(!out.status.success(), "{spec} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{spec}: {err}");
    };
    bad(
        &format!("store://{on}/images/none"),
        "no image named 'images/none'",
    );
    bad("store://127.0.0.1:1/x", "cannot reach the store");
    bad("store://localhost/x", "expected store://HOST:PORT/NAME");
    drop(store);
}

/// `repo-serve --latency-ms` answers each image read after the delay (the
/// benchmark's stand-in for a remote repository), and side files at once.
#[test]
fn repo_serve_latency_delays_image_reads() {
    let dir = tmp();
    let img = image(dir.path(), MIB);
    let repo = Proc::start(&[
        "mirror",
        "repo-serve",
        "-p",
        "0",
        "--latency-ms",
        "300",
        &p(&img),
    ]);
    let url = repo.url();
    let hostport = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let get = |path: &str, range: Option<&str>| {
        let mut s = TcpStream::connect(&hostport).unwrap();
        let range = range
            .map(|r| format!("Range: bytes={r}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "GET /{path} HTTP/1.1\r\nHost: x\r\n{range}Connection: close\r\n\r\n"
        )
        .unwrap();
        let t = Instant::now();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).unwrap();
        (
            t.elapsed(),
            String::from_utf8_lossy(&reply[..12]).into_owned(),
        )
    };
    let (took, status) = get("base.raw", Some("0-4095"));
    assert!(status.contains("206"), "{status}");
    assert!(
        took >= Duration::from_millis(300),
        "image read answered in {took:?}"
    );
    let (took, status) = get("base.raw.digest", None);
    assert!(status.contains("200"), "{status}");
    assert!(
        took < Duration::from_millis(300),
        "side file delayed: {took:?}"
    );
}

/// A mirror holds its file's write lock, as QEMU would: a second mirror
/// of the same directory and `qemu-io` are refused, and the mirror file
/// is unchanged by them.
#[test]
fn a_mirror_file_has_one_writer() {
    let dir = tmp();
    let img = image(dir.path(), MIB);
    let m = dir.path().join("m");
    let mut first = mirror(&p(&img), &m, &[]);
    let file = m.join("image.raw");
    let before = std::fs::read(&file).unwrap();
    let d = p(&m);
    let second = crate::common::strata(&["mirror", "--repo", &p(&img), "--dir", &d, "-p", "0"]);
    let said = String::from_utf8_lossy(&second.stderr);
    assert_eq!(
        second.status.code(),
        Some(1),
        "a second mirror started: {said}"
    );
    assert!(
        said.contains("lock") && said.contains("another mirror"),
        "{said}"
    );
    let qemu = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x77 0 4k", &p(&file)])
        .output()
        .expect("qemu-io");
    assert!(!qemu.status.success(), "qemu-io wrote a served mirror file");
    assert!(
        std::fs::read(&file).unwrap() == before,
        "a refused opener changed the mirror"
    );
    first.stop_ok();
}

/// `repo-serve` bounds its connections: 2,000 half-open connections (a
/// request head begun and never finished) neither stop a real client's
/// range read nor keep their descriptors past the header timeout.
#[test]
fn repo_serve_sheds_half_open_connections() {
    let dir = tmp();
    let img = image(dir.path(), MIB);
    let data = std::fs::read(&img).unwrap();
    let repo = Proc::start(&[
        "mirror",
        "repo-serve",
        "-p",
        "0",
        "--header-timeout-ms",
        "1000",
        "--body-timeout-ms",
        "1000",
        &p(&img),
    ]);
    let url = repo.url();
    let hostport = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let fd_dir = format!("/proc/{}/fd", repo.pid());
    let open_fds = || std::fs::read_dir(&fd_dir).map_or(usize::MAX, |d| d.count());
    let idle_fds = open_fds();

    let mut half_open = Vec::new();
    for i in 0..2000 {
        let mut s = TcpStream::connect(&hostport)
            .unwrap_or_else(|e| panic!("connection {i} to {hostport} refused: {e}"));
        // The server may already have pushed this one out: that is fine.
        let _ = s.write_all(b"GET /x HTTP/1.1\r\nX-Slow: ");
        half_open.push(s);
    }

    let started = Instant::now();
    let mut s = TcpStream::connect(&hostport).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    write!(
        s,
        "GET /base.raw HTTP/1.1\r\nHost: x\r\nRange: bytes=4096-8191\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)
        .expect("the range read did not finish within 3 s");
    let took = started.elapsed();
    let head_end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no end of head in the reply")
        + 4;
    let head = String::from_utf8_lossy(&reply[..head_end]);
    assert!(head.starts_with("HTTP/1.1 206"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-range: bytes 4096-8191/1048576"),
        "{head}"
    );
    assert_eq!(&reply[head_end..], &data[4096..8192], "wrong bytes");
    assert!(took < Duration::from_secs(3), "range read took {took:?}");

    // The connection cap alone keeps the server under 300 descriptors;
    // the header timeout (1 s) brings it back near where it started.
    wait_until("fewer than 300 open descriptors", 10, || open_fds() < 300);
    wait_until("half-open connections to time out", 10, || {
        open_fds() < idle_fds + 16
    });
    drop(half_open);

    // A body begun and never finished gets 408 after the body timeout.
    let mut s = TcpStream::connect(&hostport).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    write!(
        s,
        "PUT /base.raw.trace HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789"
    )
    .unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let head = String::from_utf8_lossy(&reply);
    assert!(head.starts_with("HTTP/1.1 408"), "{head:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "408 after {took:?}"
    );
}
