//! A mirror keeps the block-device contract: the conformance suite of
//! `strata-block` on mirrors of an image in a file repository and behind
//! an HTTP repository server, each on a fresh mirror directory, so every
//! first read fetches and checks chunks and every write stays local.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::conformance::{check_device, Subject};
use strata_block::BlockDevice;
use strata_mirror::digest::{Manifest, SUFFIX};
use strata_mirror::repo::{FileRepo, HttpRepo, Repository};
use strata_mirror::repo_server::{RepoServer, RepoServerConfig};
use strata_mirror::{Mirror, MirrorConfig};

/// Chunk size of the manifest: the mirror's allocation unit.
const CHUNK: u32 = 64 * 1024;
/// A size that leaves the last chunk partial.
const SIZE: u64 = 16 * CHUNK as u64 + 20_000;

/// The image in the repository, with its manifest beside it.
fn image(dir: &Path) -> (PathBuf, Vec<u8>) {
    let content: Vec<u8> = (0..SIZE)
        .map(|i| {
            if (i / 100_000) % 3 == 1 {
                0
            } else {
                (i % 251) as u8 | 0x02
            }
        })
        .collect();
    let path = dir.join("image.raw");
    std::fs::write(&path, &content).unwrap();
    let manifest = Manifest::compute(&path, CHUNK, |_| {}).unwrap();
    let mut sidecar = path.clone().into_os_string();
    sidecar.push(SUFFIX);
    std::fs::write(sidecar, manifest.encode()).unwrap();
    (path, content)
}

/// Runs the suite on mirrors of the image that `repository` opens, then
/// shuts every one down cleanly.
fn check_mirrors(root: &Path, content: &[u8], repository: &dyn Fn() -> Box<dyn Repository>) {
    let mut mirrors: Vec<Arc<Mirror>> = Vec::new();
    check_device(&mut || {
        let dir = root.join(format!("mirror-{}", mirrors.len()));
        let mut config = MirrorConfig::new(dir);
        config.prefetch_threads = 1;
        let mirror = Arc::new(Mirror::open(repository(), config).unwrap());
        mirrors.push(mirror.clone());
        let device: Arc<dyn BlockDevice> = mirror;
        Subject::holding(Box::new(device), content.to_vec())
    });
    assert!(
        mirrors.len() >= 10,
        "the suite made only {} mirrors",
        mirrors.len()
    );
    for mirror in mirrors {
        mirror.shutdown().unwrap();
    }
}

#[test]
fn a_mirror_of_a_file_repository_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let (path, content) = image(dir.path());
    let spec = path.to_str().unwrap().to_string();
    check_mirrors(dir.path(), &content, &|| {
        Box::new(FileRepo::open(&spec).unwrap())
    });
}

#[test]
fn a_mirror_of_an_http_repository_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let (path, content) = image(dir.path());
    let server = Arc::new(
        RepoServer::bind(&RepoServerConfig {
            image: path,
            bind: "127.0.0.1:0".into(),
            rate: None,
            latency: std::time::Duration::ZERO,
            limits: Default::default(),
        })
        .unwrap(),
    );
    let stop = server.stopper();
    let serving = {
        let server = server.clone();
        std::thread::spawn(move || server.run())
    };
    let url = server.url();
    check_mirrors(dir.path(), &content, &|| Box::new(HttpRepo::new(&url)));
    assert!(server.bytes_sent() > 0, "no chunk came from the server");
    stop();
    serving.join().unwrap();
}
