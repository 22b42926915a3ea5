//! The QEMU provider's edge paths against a real qemu-storage-daemon,
//! checked from outside: qemu-io and qemu-img over NBD, and
//! `qemu-img info --backing-chain` on the layer files.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

use super::QemuProvider;
use crate::provider::{Provider, Stages};

const MIB: u64 = 1 << 20;

fn start(dir: &tempfile::TempDir) -> QemuProvider {
    QemuProvider::start(&dir.path().join("qemu"), &dir.path().join("qemu.log"))
        .expect("qemu-storage-daemon starts")
}

fn uri(provider: &QemuProvider, volume: &str) -> String {
    provider.uri(volume).expect("the QEMU provider has URIs")
}

/// Writes `length` bytes of `pattern` at `offset` of `volume` over NBD.
fn write(provider: &QemuProvider, volume: &str, pattern: u8, offset: u64, length: u64) {
    let out = Command::new("qemu-io")
        .args(["-f", "raw", "-c"])
        .arg(format!("write -P {pattern} {offset} {length}"))
        .arg(uri(provider, volume))
        .output()
        .expect("run qemu-io");
    assert!(
        out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("failed"),
        "qemu-io write to {volume}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every byte of `volume`, read over NBD.
fn read_all(provider: &QemuProvider, volume: &str, dir: &tempfile::TempDir) -> Vec<u8> {
    let file = dir.path().join(format!("{volume}.raw"));
    let out = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(uri(provider, volume))
        .arg(&file)
        .output()
        .expect("run qemu-img convert");
    assert!(
        out.status.success(),
        "qemu-img convert from {volume}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    bytes
}

/// `size` bytes of zeros with `pattern` over each (offset, length).
fn expected(size: u64, writes: &[(u8, u64, u64)]) -> Vec<u8> {
    let mut bytes = vec![0; size as usize];
    for &(pattern, offset, length) in writes {
        bytes[offset as usize..(offset + length) as usize].fill(pattern);
    }
    bytes
}

/// Asserts two images' bytes are equal, naming the first difference
/// rather than printing megabytes.
fn assert_same(seen: &[u8], wanted: &[u8], what: &str) {
    assert_eq!(seen.len(), wanted.len(), "{what}: size");
    if let Some(at) = seen.iter().zip(wanted).position(|(a, b)| a != b) {
        panic!(
            "{what}: byte {at} is {:#x}, was written as {:#x}",
            seen[at], wanted[at]
        );
    }
}

/// The files of the backing chain of `file`, top first.
fn chain(file: &Path) -> Vec<PathBuf> {
    let out = Command::new("qemu-img")
        .args(["info", "-U", "--backing-chain", "--output", "json"])
        .arg(file)
        .output()
        .expect("run qemu-img info");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let images: Vec<Value> = serde_json::from_slice(&out.stdout).expect("qemu-img info's JSON");
    images
        .iter()
        .map(|image| PathBuf::from(image["filename"].as_str().expect("a filename")))
        .collect()
}

fn top_file(provider: &QemuProvider, volume: &str) -> PathBuf {
    provider.volumes.lock()[volume]
        .files
        .last()
        .unwrap()
        .clone()
}

fn qcow2_files(dir: &tempfile::TempDir) -> usize {
    std::fs::read_dir(dir.path().join("qemu"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "qcow2"))
        .count()
}

/// Deleting snapshot S1 whose layer a live clone reads, but whose layer
/// above (S2's) no clone reads, streams S1's layer up into S2's: S1's
/// layer leaves the volume's chain, its file stays for the clone, and the
/// volume, the clone and S2 read back exactly what was written.
#[test]
fn a_snapshot_delete_under_a_clone_streams_its_layer_up_and_keeps_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start(&dir);
    let size = 4 * MIB;
    let mut stages = Stages::default();
    provider
        .create_volume("v", size, None, &mut stages)
        .unwrap();
    write(&provider, "v", 0x11, 0, MIB);
    provider.snapshot("v", "s1").unwrap();
    let s1_file = provider.snapshots.lock()[&("v".into(), "s1".into())].clone();
    provider
        .clone_snapshot("v", "s1", "c", &mut stages)
        .unwrap();
    write(&provider, "v", 0x22, MIB, MIB);
    write(&provider, "v", 0x33, 0, MIB / 2);
    provider.snapshot("v", "s2").unwrap();
    let s2_file = provider.snapshots.lock()[&("v".into(), "s2".into())].clone();
    write(&provider, "v", 0x44, 2 * MIB, MIB);
    assert_eq!(chain(&top_file(&provider, "v")).len(), 3);

    let detail = provider.delete_snapshot("v", "s1").unwrap().unwrap();
    assert_eq!(detail["merge"], "block-stream", "{detail}");
    assert_eq!(detail["layers_removed"], 1, "{detail}");

    // S1's layer is out of the volume's chain: S2's layer stands alone
    // under the top. The clone still reads S1's file, which stays.
    let volume_chain = chain(&top_file(&provider, "v"));
    assert_eq!(volume_chain.len(), 2, "{volume_chain:?}");
    assert_eq!(volume_chain[1], s2_file, "{volume_chain:?}");
    assert!(!volume_chain.contains(&s1_file), "{volume_chain:?}");
    let clone_chain = chain(&top_file(&provider, "c"));
    assert_eq!(clone_chain.len(), 2, "{clone_chain:?}");
    assert_eq!(clone_chain[1], s1_file, "{clone_chain:?}");
    assert!(s1_file.exists());
    assert_eq!(provider.volumes.lock()["v"].nodes.len(), 2);

    let first = (0x11, 0, MIB);
    let second = [(0x22, MIB, MIB), (0x33, 0, MIB / 2)];
    let mut at_s2 = vec![first];
    at_s2.extend(second);
    let mut now = at_s2.clone();
    now.push((0x44, 2 * MIB, MIB));
    assert_same(
        &read_all(&provider, "v", &dir),
        &expected(size, &now),
        "the volume",
    );
    assert_same(
        &read_all(&provider, "c", &dir),
        &expected(size, &[first]),
        "the clone of S1",
    );
    // S2 lives on in the layer S1's was streamed into.
    provider
        .clone_snapshot("v", "s2", "c2", &mut stages)
        .unwrap();
    assert_same(
        &read_all(&provider, "c2", &dir),
        &expected(size, &at_s2),
        "a clone of S2 made after the delete",
    );
    // The volume still takes writes, and a deleted snapshot is gone.
    write(&provider, "v", 0x55, 3 * MIB, MIB);
    let error = provider.delete_snapshot("v", "s1").unwrap_err();
    assert!(error.contains("no snapshot v@s1"), "{error}");

    provider.shutdown().unwrap();
    assert_eq!(qcow2_files(&dir), 0, "the layer files go at the end");
}

/// A qemu-io process holding an NBD connection to a volume open.
struct Client {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Client {
    fn open(uri: &str) -> Client {
        let mut child = Command::new("qemu-io")
            .args(["-f", "raw", uri])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run qemu-io");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let mut client = Client {
            child,
            input,
            output,
        };
        // Its first read's answer says the connection is up.
        client.command("read 0 512", "read 512/512");
        client
    }

    /// Sends `command` and waits for a line with `answer`.
    fn command(&mut self, command: &str, answer: &str) {
        writeln!(self.input, "{command}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.output.read_line(&mut line).unwrap();
            assert!(read > 0, "qemu-io ended before answering {command}");
            if line.contains(answer) {
                return;
            }
        }
    }

    fn close(mut self) {
        drop(self.input);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "qemu-io: {status}");
    }
}

/// A grow of a volume with an NBD client attached fails, saying why and
/// what to do; the volume keeps its size and data, its export goes on
/// serving (the attached client too), and once the client has left the
/// same grow succeeds.
#[test]
fn a_grow_under_an_nbd_client_fails_clearly_and_leaves_the_volume_serving() {
    let dir = tempfile::tempdir().unwrap();
    let provider = start(&dir);
    let size = 4 * MIB;
    let mut stages = Stages::default();
    provider
        .create_volume("v", size, None, &mut stages)
        .unwrap();
    write(&provider, "v", 0x5a, 0, MIB);
    let mut client = Client::open(&uri(&provider, "v"));

    let error = provider.resize("v", 8 * MIB).unwrap_err();
    assert!(error.contains("cannot grow volume v"), "{error}");
    assert!(
        error.contains("grow volumes no workload is using"),
        "{error}"
    );
    // The attached client still reads and writes through the export.
    client.command("write -P 0x6b 1048576 4096", "wrote 4096/4096");
    client.command("read -P 0x5a 0 4096", "read 4096/4096");
    // New clients see the old size and the data.
    assert_eq!(
        crate::provider::nbd_probe::attach(&uri(&provider, "v")).unwrap(),
        size
    );
    let mut written = vec![(0x5a, 0, MIB), (0x6b, MIB, 4096)];
    assert_same(
        &read_all(&provider, "v", &dir),
        &expected(size, &written),
        "the volume after the refused grow",
    );
    // The provider goes on: a snapshot of the volume is taken meanwhile.
    provider.snapshot("v", "s").unwrap();

    client.close();
    let detail = provider.resize("v", 8 * MIB).unwrap().unwrap();
    assert_eq!(detail["old_size"], size, "{detail}");
    assert_eq!(detail["new_size"], 8 * MIB, "{detail}");
    write(&provider, "v", 0x7c, 7 * MIB, MIB);
    written.push((0x7c, 7 * MIB, MIB));
    assert_same(
        &read_all(&provider, "v", &dir),
        &expected(8 * MIB, &written),
        "the volume after the grow",
    );
    provider.shutdown().unwrap();
}
