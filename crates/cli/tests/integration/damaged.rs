//! Damaged images served over NBD: a client's write never lands on the
//! image's metadata (EIO and the corrupt bit, as qemu-nbd does), an image
//! whose metadata is out of place is served read-only with a warning, and
//! what clients read never changes because the image was served.
//!
//! The images are made by qemu-img and qemu-io and damaged by byte edits,
//! with the layout qemu-img gives a fresh 64 MiB image of 64 KiB clusters
//! once guest 0..128 KiB and 1 MiB..+64 KiB are written: header 0x0,
//! refcount table 0x10000, refcount block 0x20000, L1 table 0x30000, L2
//! table 0x40000, data from 0x50000; the file ends at 0x80000.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::common::*;

const REFCOUNT_TABLE: u64 = 0x10000;
const L1_TABLE: u64 = 0x30000;
const L2_TABLE: u64 = 0x40000;
const COPIED: u64 = 1 << 63;
/// Where qemu-img's file ends.
const ORIGINAL_END: u64 = 0x80000;

/// The healthy image of the module documentation.
fn qemu_image(dir: &Path) -> PathBuf {
    let image = dir.join("disk.qcow2");
    qemu_create(&image, "cluster_size=64k", "64M");
    qemu_io(&image, &["write -P 0x5a 0 128k", "write -P 0x6b 1M 64k"]);
    assert_eq!(std::fs::metadata(&image).expect("stat").len(), ORIGINAL_END);
    image
}

/// [`qemu_image`] with the 8 bytes at file offset `at` set to `value`.
fn damaged_image(dir: &Path, at: u64, value: u64) -> PathBuf {
    let image = qemu_image(dir);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .expect("open");
    file.write_all_at(&value.to_be_bytes(), at).expect("damage");
    image
}

/// The image's metadata and data clusters as qemu-io left them (the
/// refcount table up to the end of the original file). The header
/// cluster is left out: a writer sets its dirty bit and records its chain
/// index there, and the index itself goes past the original end.
fn tables_and_data(image: &Path) -> Vec<u8> {
    let bytes = std::fs::read(image).expect("read");
    bytes[REFCOUNT_TABLE as usize..ORIGINAL_END as usize].to_vec()
}

/// `strata serve -k SOCKET IMAGE`, ready (its readiness line is on
/// stdout), with what it said on stderr until then.
fn serve(image: &Path, socket: &Path) -> (Child, String) {
    let log = socket.with_extension("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "-k", &p(socket), &p(image)])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("create log"))
        .spawn()
        .expect("spawn strata serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut ready = String::new();
    let _ = BufReader::new(stdout).read_line(&mut ready);
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    if !ready.contains("serving") {
        let _ = child.kill();
        panic!("strata serve exited before it was ready:\n{said}");
    }
    (child, said)
}

fn stop(mut child: Child) {
    // SAFETY: signalling our own child, not reaped yet.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let status = child.wait().expect("wait");
    assert!(status.success(), "strata serve exited with {status}");
}

fn qemu_io_nbd(socket: &Path, cmds: &[&str]) -> Output {
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(&uri);
    Command::new("qemu-io")
        .args(&args)
        .output()
        .expect("spawn qemu-io")
}

/// The whole guest disk as qemu-img reads it (with -U: the server may
/// still hold the image).
fn guest(image: &Path, dir: &Path) -> Vec<u8> {
    let out = dir.join("guest.raw");
    let st = Command::new("qemu-img")
        .args(["convert", "-U", "-O", "raw", &p(image), &p(&out)])
        .status()
        .expect("qemu-img convert");
    assert!(st.success(), "qemu-img convert {}", image.display());
    let data = std::fs::read(&out).expect("read");
    let _ = std::fs::remove_file(&out);
    data
}

#[test]
fn a_client_write_through_an_l2_entry_on_the_refcount_table_gets_eio_and_changes_no_metadata() {
    let dir = tmp();
    let image = damaged_image(dir.path(), L2_TABLE, REFCOUNT_TABLE | COPIED);
    let before = tables_and_data(&image);
    let guest_before = guest(&image, dir.path());
    let socket = at(&dir, "s.sock");
    let (server, _) = serve(&image, &socket);
    let write = qemu_io_nbd(&socket, &["write -P 0xee 0x2000 4k"]);
    let text = output_text(&write);
    assert!(
        text.contains("Input/output error"),
        "the write over the refcount table was not refused with EIO: {text}"
    );
    // Reads go on, and read what they read before.
    let read = qemu_io_nbd(&socket, &["read -P 0x6b 1M 64k"]);
    assert!(
        !output_text(&read).contains("failed"),
        "reads stopped: {}",
        output_text(&read)
    );
    stop(server);
    assert!(
        tables_and_data(&image) == before,
        "serving the damaged image changed its bytes"
    );
    let info = run_ok("qemu-img", &["info", &p(&image)]);
    assert!(
        info.contains("corrupt: true"),
        "not marked corrupt:\n{info}"
    );
    assert!(
        guest(&image, dir.path()) == guest_before,
        "guest content changed"
    );
}

fn served_read_only_unchanged(at_offset: u64, value: u64, named: &str) {
    let dir = tmp();
    let image = damaged_image(dir.path(), at_offset, value);
    let before = std::fs::read(&image).expect("read");
    let guest_before = guest(&image, dir.path());
    let socket = at(&dir, "s.sock");
    let (server, stderr) = serve(&image, &socket);
    for part in [named, "read-only", "strata img check -r all"] {
        assert!(stderr.contains(part), "{part:?} missing from:\n{stderr}");
    }
    let write = qemu_io_nbd(&socket, &["write -P 0xee 0 4k"]);
    assert!(
        output_text(&write).contains("failed") || !write.status.success(),
        "a read-only export took a write: {}",
        output_text(&write)
    );
    let read = qemu_io_nbd(&socket, &["read -P 0x5a 0 128k"]);
    assert!(
        !output_text(&read).contains("failed"),
        "reads of the intact part failed: {}",
        output_text(&read)
    );
    stop(server);
    assert!(
        std::fs::read(&image).expect("read") == before,
        "serving the image changed a byte"
    );
    assert!(
        guest(&image, dir.path()) == guest_before,
        "guest content changed"
    );
}

#[test]
fn an_l1_entry_on_the_l1_table_is_served_read_only_and_unchanged() {
    served_read_only_unchanged(L1_TABLE, L1_TABLE | COPIED, "overlaps the L1 table");
}

#[test]
fn an_l2_table_beyond_the_end_of_the_file_is_served_read_only_and_unchanged() {
    // Guest 512 MiB's L2 table would be the L1's second entry: 64 MiB has
    // one entry only, so damage the first one to point past the end.
    served_read_only_unchanged(L1_TABLE, 0x200000 | COPIED, "beyond the end of the file");
}

#[test]
fn a_truncated_image_keeps_what_clients_read_and_takes_writes_elsewhere() {
    let dir = tmp();
    let image = qemu_image(dir.path());
    // Cut inside guest 64 KiB's data cluster: guest 1 MiB's lies beyond.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .expect("open");
    file.set_len(0x68000).expect("truncate");
    drop(file);
    let guest_before = guest(&image, dir.path());
    let socket = at(&dir, "s.sock");
    let (server, _) = serve(&image, &socket);
    let write = qemu_io_nbd(&socket, &["write -P 0xc1 2M 64k", "flush"]);
    assert!(write.status.success(), "{}", output_text(&write));
    stop(server);
    let mut expected = guest_before;
    expected[2 << 20..(2 << 20) + (64 << 10)].fill(0xc1);
    assert!(
        guest(&image, dir.path()) == expected,
        "what clients read changed beyond the write"
    );
    assert_eq!(qemu_check(&image), 0, "qemu-img check after serving");
}
