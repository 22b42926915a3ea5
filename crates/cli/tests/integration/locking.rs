//! Image locks between Strata processes and the real QEMU tools, both
//! ways: a second writer is refused, readers share as QEMU's do, `-U`
//! reads anyway, a refused opener changes no byte, and a killed holder's
//! locks are free at once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A server process (strata serve or qemu-nbd) on a Unix socket, killed
/// on drop.
struct Holder {
    child: Child,
    name: &'static str,
}

impl Holder {
    /// Starts `strata serve ARGS -k SOCKET IMAGE` and waits until it holds
    /// the image's locks.
    fn strata(image: &Path, socket: &Path, args: &[&str]) -> Holder {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_strata"));
        cmd.arg("serve").args(args).arg("-k").arg(socket).arg(image);
        Holder::spawn(cmd, image, socket, "strata serve")
    }

    /// Starts `qemu-nbd ARGS -k SOCKET IMAGE` and waits until it holds
    /// the image's locks.
    fn qemu_nbd(image: &Path, socket: &Path, args: &[&str]) -> Holder {
        let mut cmd = Command::new("qemu-nbd");
        cmd.args(["-f", "qcow2"])
            .args(args)
            .arg("-k")
            .arg(socket)
            .arg(image);
        Holder::spawn(cmd, image, socket, "qemu-nbd")
    }

    /// Spawns `cmd` and waits for its socket: both servers listen only
    /// once their image is open, so its locks are all taken by then.
    fn spawn(mut cmd: Command, image: &Path, socket: &Path, name: &'static str) -> Holder {
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let mut holder = Holder { child, name };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() || lock_bytes(image).is_empty() {
            if let Ok(Some(status)) = holder.child.try_wait() {
                panic!(
                    "{name} exited ({status}) before it locked {}",
                    image.display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not lock {} within 20 s",
                image.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        holder
    }

    /// Stops the holder with SIGTERM, as an operator would, and waits
    /// for its clean exit.
    fn stop(mut self) {
        // SAFETY: sending a signal to our own child, which is not reaped yet.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    assert!(status.success(), "{} exited with {status}", self.name);
                    return;
                }
                _ if Instant::now() > deadline => panic!("{} ignored SIGTERM", self.name),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Kills the holder with SIGKILL and reaps it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            eprintln!("stopping {}", self.name);
        }
        self.kill();
    }
}

/// Asserts that `out` is a refusal that names `image` and `lock`.
fn assert_refused(what: &str, out: &Output, image: &Path, lock: &str) {
    let said = output_text(out);
    assert!(
        !out.status.success(),
        "{what} should have been refused:\n{said}"
    );
    assert!(
        said.contains(lock),
        "{what}: the refusal should name the {lock} lock:\n{said}"
    );
    let name = image.file_name().and_then(|n| n.to_str()).unwrap_or("");
    assert!(
        said.contains(name),
        "{what}: the refusal should name {name}:\n{said}"
    );
}

/// A 64 MiB qcow2 image with a pattern written by qemu-io.
fn image_with_data(dir: &tempfile::TempDir) -> PathBuf {
    let image = at(dir, "disk.qcow2");
    qemu_create(&image, "", "64M");
    qemu_io(&image, &["write -P 0x5a 0 1M"]);
    image
}

fn contents(path: &Path) -> Vec<u8> {
    std::fs::read(path).expect("read image")
}

#[test]
fn strata_takes_the_bytes_qemu_takes() {
    let dir = tmp();
    let image = image_with_data(&dir);
    let writer = Holder::strata(&image, &at(&dir, "s.sock"), &[]);
    assert_eq!(lock_bytes(&image), vec![100, 101, 103, 201, 203]);
    drop(writer);
    let reader = Holder::strata(&image, &at(&dir, "r.sock"), &["-r"]);
    assert_eq!(lock_bytes(&image), vec![100, 201, 203]);
    drop(reader);
    let shared = Holder::strata(&image, &at(&dir, "u.sock"), &["-r", "-U"]);
    assert_eq!(lock_bytes(&image), vec![100]);
    drop(shared);
}

#[test]
fn a_second_strata_writer_is_refused_and_changes_no_byte() {
    let dir = tmp();
    let image = image_with_data(&dir);
    let _first = Holder::strata(&image, &at(&dir, "a.sock"), &[]);
    let before = contents(&image);
    let second = run_tool(
        env!("CARGO_BIN_EXE_strata"),
        &["serve", "-k", &p(&at(&dir, "b.sock")), &p(&image)],
    );
    assert_refused("a second strata serve", &second, &image, "\"write\" lock");
    let reader = run_tool(
        env!("CARGO_BIN_EXE_strata"),
        &["serve", "-r", "-k", &p(&at(&dir, "c.sock")), &p(&image)],
    );
    assert_refused("a strata reader", &reader, &image, "shared \"write\" lock");
    assert!(
        contents(&image) == before,
        "a refused opener changed the image"
    );
}

#[test]
fn strata_refuses_an_image_qemu_nbd_writes_and_reads_it_with_force_share() {
    let dir = tmp();
    let image = image_with_data(&dir);
    let _qemu = Holder::qemu_nbd(&image, &at(&dir, "q.sock"), &[]);
    let before = contents(&image);
    let serve = run_tool(
        env!("CARGO_BIN_EXE_strata"),
        &["serve", "-k", &p(&at(&dir, "s.sock")), &p(&image)],
    );
    assert_refused("strata serve", &serve, &image, "\"write\" lock");
    let info = run_tool(env!("CARGO_BIN_EXE_strata"), &["img", "info", &p(&image)]);
    assert_refused("strata img info", &info, &image, "shared \"write\" lock");
    let shared = strata_ok(&["img", "info", "-U", &p(&image)]);
    assert!(shared.contains("virtual size"), "img info -U: {shared}");
    let convert = run_tool(
        env!("CARGO_BIN_EXE_strata"),
        &[
            "img",
            "convert",
            "-O",
            "raw",
            &p(&image),
            &p(&at(&dir, "copy.raw")),
        ],
    );
    assert_refused("strata img convert", &convert, &image, "\"write\" lock");
    strata_ok(&[
        "img",
        "convert",
        "-U",
        "-O",
        "raw",
        &p(&image),
        &p(&at(&dir, "copy.raw")),
    ]);
    assert!(
        contents(&image) == before,
        "a refused opener changed the image"
    );
}

#[test]
fn qemu_tools_are_refused_on_an_image_strata_serves() {
    let dir = tmp();
    let image = image_with_data(&dir);
    let _strata = Holder::strata(&image, &at(&dir, "s.sock"), &[]);
    let before = contents(&image);
    let write = run_tool("qemu-io", &["-c", "write -P 0x77 0 4k", &p(&image)]);
    assert_refused("qemu-io write", &write, &image, "\"write\" lock");
    let resize = run_tool("qemu-img", &["resize", &p(&image), "128M"]);
    assert_refused("qemu-img resize", &resize, &image, "\"write\" lock");
    let nbd = run_tool(
        "qemu-nbd",
        &["-f", "qcow2", "-k", &p(&at(&dir, "q.sock")), &p(&image)],
    );
    assert_refused("qemu-nbd", &nbd, &image, "\"write\" lock");
    let info = run_tool("qemu-img", &["info", &p(&image)]);
    assert_refused("qemu-img info", &info, &image, "shared \"write\" lock");
    let shared = run_tool("qemu-img", &["info", "-U", &p(&image)]);
    assert!(
        shared.status.success(),
        "qemu-img info -U: {}",
        output_text(&shared)
    );
    assert!(
        contents(&image) == before,
        "a refused opener changed the image"
    );
}

#[test]
fn readers_share_and_a_backing_file_stays_readable_but_not_writable() {
    let dir = tmp();
    let base = image_with_data(&dir);
    let top = at(&dir, "top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        &p(&base),
        "-F",
        "qcow2",
        &p(&top),
    ]);
    let _writer = Holder::strata(&top, &at(&dir, "w.sock"), &[]);
    // The backing file is read by the writer: readers are welcome...
    let _reader = Holder::strata(&base, &at(&dir, "r.sock"), &["-r"]);
    let info = run_tool("qemu-img", &["info", &p(&base)]);
    assert!(
        info.status.success(),
        "qemu-img info base: {}",
        output_text(&info)
    );
    let read = run_tool("qemu-io", &["-r", "-c", "read -P 0x5a 0 1M", &p(&base)]);
    assert!(
        read.status.success(),
        "qemu-io -r base: {}",
        output_text(&read)
    );
    // ...writers are not.
    let write = run_tool("qemu-io", &["-c", "write 0 4k", &p(&base)]);
    assert_refused("qemu-io write to the backing file", &write, &base, "lock");
}

#[test]
fn the_locks_of_a_killed_holder_are_free_at_once() {
    let dir = tmp();
    let image = image_with_data(&dir);
    let mut strata = Holder::strata(&image, &at(&dir, "s.sock"), &[]);
    strata.kill();
    assert!(lock_bytes(&image).is_empty(), "locks outlived their holder");
    let write = run_tool("qemu-io", &["-c", "write -P 0x77 0 4k", &p(&image)]);
    assert!(
        write.status.success(),
        "qemu-io after kill -9: {}",
        output_text(&write)
    );
}

#[test]
fn creating_over_an_image_in_use_is_refused_and_changes_no_byte() {
    let dir = tmp();
    let image = image_with_data(&dir);
    let _qemu = Holder::qemu_nbd(&image, &at(&dir, "q.sock"), &[]);
    let before = contents(&image);
    let create = run_tool(
        env!("CARGO_BIN_EXE_strata"),
        &["img", "create", "-f", "qcow2", &p(&image), "1G"],
    );
    assert_refused(
        "strata img create over it",
        &create,
        &image,
        "\"write\" lock",
    );
    assert!(
        contents(&image) == before,
        "a refused create changed the image"
    );
}

/// qemu-io writing through the NBD export on `socket`.
fn qemu_io_over_nbd(socket: &Path, cmds: &[&str]) {
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(&uri);
    let out = run_tool("qemu-io", &args);
    let said = output_text(&out);
    assert!(
        out.status.success() && !said.contains("failed"),
        "qemu-io over NBD: {said}"
    );
}

#[test]
fn qemu_writes_after_strata_was_killed_holding_an_image_leave_no_stale_index() {
    let dir = tmp();
    let base = image_with_data(&dir);
    let top = at(&dir, "top.qcow2");
    strata_ok(&["img", "snapshot", "-q", &p(&base), &p(&top)]);
    let socket = at(&dir, "s.sock");
    let mut strata = Holder::strata(&top, &socket, &[]);
    qemu_io_over_nbd(
        &socket,
        &["write -P 0x61 2M 256k", "flush", "write -P 0x62 8M 64k"],
    );
    strata.kill();
    // QEMU finds the image dirty, repairs it, and allocates new L2 tables
    // and data clusters wherever it likes, the index space included.
    qemu_io(
        &top,
        &[
            "write -P 0x71 32M 1M",
            "write -P 0x72 2M 4k",
            "write -P 0x73 60M 64k",
        ],
    );
    let info = strata_ok(&["img", "info", "--backing-chain", &p(&top)]);
    assert!(
        !info.contains("Strata chain index: in use"),
        "an index that QEMU's writes made stale is still trusted:\n{info}"
    );
    assert_same_view(&top, dir.path());
    // Strata writes again: it rebuilds the index without overwriting
    // anything QEMU wrote, and both checks stay clean.
    let socket = at(&dir, "t.sock");
    let strata = Holder::strata(&top, &socket, &[]);
    qemu_io_over_nbd(&socket, &["write -P 0x81 40M 128k", "flush"]);
    strata.stop();
    let info = strata_ok(&["img", "info", "--backing-chain", &p(&top)]);
    assert!(info.contains("Strata chain index: in use"), "{info}");
    assert_eq!(qemu_check(&top), 0, "qemu-img check after the rebuild");
    let check = strata_ok(&["img", "check", &p(&top)]);
    assert!(check.contains("matches the chain"), "{check}");
    assert_same_view(&top, dir.path());
    let reads = run_tool(
        "qemu-io",
        &[
            "-r",
            "-c",
            "read -P 0x5a 0 1M",
            "-c",
            "read -P 0x72 2M 4k",
            "-c",
            "read -P 0x61 2101248 252k",
            "-c",
            "read -P 0x71 32M 1M",
            "-c",
            "read -P 0x81 40M 128k",
            "-c",
            "read -P 0x73 60M 64k",
            &p(&top),
        ],
    );
    let said = output_text(&reads);
    assert!(
        reads.status.success() && !said.contains("Pattern verification failed"),
        "data lost: {said}"
    );
}
