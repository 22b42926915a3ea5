//! The S3 gateway with the file-tree clients people use on buckets:
//! rclone's copy, check and sync of a tree, and s3fs's mount.

use crate::common::store::Store;
use crate::common::{output_text, p, pattern, tmp};
use crate::s3::{aws_ok, endpoint, multipart_names, tenant, Keys};
use std::path::Path;
use std::process::{Command, Output};

/// `rclone ARGS` against the gateway `s3` as the tenant of `keys`, from
/// environment variables alone (remote `strata:`); no configuration file
/// of the host's is read.
fn rclone(s3: &str, keys: &Keys, home: &Path, args: &[&str]) -> Output {
    Command::new("rclone")
        .args(args)
        .env("RCLONE_CONFIG", home.join("rclone.conf"))
        .env("RCLONE_CONFIG_STRATA_TYPE", "s3")
        .env("RCLONE_CONFIG_STRATA_PROVIDER", "Other")
        .env("RCLONE_CONFIG_STRATA_ENDPOINT", s3)
        .env("RCLONE_CONFIG_STRATA_REGION", "us-east-1")
        .env("RCLONE_CONFIG_STRATA_ACCESS_KEY_ID", &keys.access)
        .env("RCLONE_CONFIG_STRATA_SECRET_ACCESS_KEY", &keys.secret)
        // rclone's AWS SDK refuses its plain-HTTP transport when a CA
        // bundle is named, and the gateway speaks plain HTTP.
        .env_remove("AWS_CA_BUNDLE")
        .output()
        .expect("run rclone (apt-get install rclone)")
}

/// [`rclone`], which must succeed; its standard output and error.
fn rclone_ok(s3: &str, keys: &Keys, home: &Path, args: &[&str]) -> String {
    let out = rclone(s3, keys, home, args);
    let text = output_text(&out);
    assert!(out.status.success(), "rclone {args:?} failed: {text}");
    text
}

/// Writes a tree of 1,000 files of mixed sizes under `root`: 990 small
/// ones (0 to 30,000 bytes) in 10 directories, and 10 at the top, of
/// which `big3.bin` (12 MiB) and `big4.bin` (7 MiB) are over rclone's
/// upload cutoff as the test sets it (5 MiB), so they go in parts.
fn write_tree(root: &Path) -> usize {
    let sizes = [0, 1, 100, 1000, 4096, 10_000, 30_000];
    let mut files = 0;
    for dir in 0..10u64 {
        std::fs::create_dir_all(root.join(format!("d{dir}/sub"))).unwrap();
        for i in 0..99u64 {
            let sub = if i % 3 == 0 { "sub/" } else { "" };
            let path = root.join(format!("d{dir}/{sub}f{i}.bin"));
            let size = sizes[((i + dir) % sizes.len() as u64) as usize];
            std::fs::write(path, pattern(size, dir * 1000 + i)).unwrap();
            files += 1;
        }
    }
    let big = [
        1 << 20,
        2 << 20,
        3 << 20,
        12 << 20,
        7 << 20,
        100,
        200,
        300,
        400,
        500,
    ];
    for (j, size) in big.into_iter().enumerate() {
        std::fs::write(
            root.join(format!("big{j}.bin")),
            pattern(size, 77 + j as u64),
        )
        .unwrap();
        files += 1;
    }
    files
}

/// rclone copies a tree of 1,000 files (two of them in parts), finds no
/// difference with `check`, and after files were deleted and changed
/// locally, `sync` makes the bucket match again, the parts of the
/// deleted multipart file deleted with it.
#[test]
fn rclone_copies_checks_and_syncs_a_tree_of_a_thousand_files() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    let tree = home.join("tree");
    assert_eq!(write_tree(&tree), 1000);
    let run = |args: &[&str]| rclone_ok(&s3, &keys, home, args);
    let tree_path = p(&tree);
    let parts = ["--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M"];
    let mut copy = vec!["copy", &tree_path, "strata:acme/tree", "--transfers", "8"];
    copy.extend(parts);
    run(&copy);
    let checked = run(&["check", &tree_path, "strata:acme/tree"]);
    assert!(checked.contains("0 differences found"), "{checked}");
    assert!(checked.contains("1000 matching files"), "{checked}");
    // Two 3-part and 2-part uploads: five part objects, no upload pending.
    assert_eq!(multipart_names(&store, "acme").len(), 5);

    std::fs::remove_dir_all(tree.join("d3")).unwrap();
    std::fs::remove_file(tree.join("big3.bin")).unwrap();
    std::fs::write(tree.join("d0/f1.bin"), b"changed locally\n").unwrap();
    let mut sync = vec!["sync", &tree_path, "strata:acme/tree"];
    sync.extend(parts);
    run(&sync);
    let checked = run(&["check", &tree_path, "strata:acme/tree"]);
    assert!(checked.contains("0 differences found"), "{checked}");
    assert!(checked.contains("900 matching files"), "{checked}");
    let listed = run(&["lsf", "-R", "--files-only", "strata:acme/tree"]);
    assert_eq!(listed.lines().filter(|l| l.ends_with(".bin")).count(), 900);
    assert!(!listed.contains("d3/"), "{listed}");
    let changed = run(&["cat", "strata:acme/tree/d0/f1.bin"]);
    assert!(changed.contains("changed locally"), "{changed}");
    // big3.bin's three parts went with it; big4.bin's two stay.
    assert_eq!(multipart_names(&store, "acme").len(), 2);
}

/// An s3fs mount, stopped and unmounted when dropped (also when a test
/// fails midway).
struct Mount {
    point: std::path::PathBuf,
    child: std::process::Child,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.point).output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `point` is mounted now.
fn mounted(point: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let point = p(point);
    mounts
        .lines()
        .any(|line| line.split(' ').nth(1) == Some(point.as_str()))
}

/// s3fs mounts a bucket: files written through it (one in parts) are
/// read back, listed, renamed and removed, and the store holds what was
/// written; then it unmounts.
#[test]
fn s3fs_mounts_a_bucket_and_writes_reads_and_lists_files() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    aws_ok(&s3, &keys, home, &["s3", "mb", "s3://acme"]);
    let passwd = home.join("passwd");
    std::fs::write(&passwd, format!("{}:{}\n", keys.access, keys.secret)).unwrap();
    std::fs::set_permissions(&passwd, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let point = home.join("mnt");
    std::fs::create_dir(&point).unwrap();
    let child = Command::new("s3fs")
        .args(["acme", &p(&point), "-f", "-o", &format!("url={s3}")])
        .args(["-o", "use_path_request_style", "-o", "endpoint=us-east-1"])
        .args(["-o", &format!("passwd_file={}", p(&passwd))])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run s3fs (apt-get install s3fs; it needs /dev/fuse)");
    let mount = Mount {
        point: point.clone(),
        child,
    };
    crate::common::store::wait_until("s3fs to mount the bucket", || mounted(&point));

    std::fs::write(point.join("hello.txt"), b"hello through fuse\n").unwrap();
    std::fs::create_dir(point.join("docs")).unwrap();
    // Over s3fs's 10 MB multipart size: uploaded in parts.
    let data = pattern(12 << 20, 9);
    std::fs::write(point.join("docs/big.bin"), &data).unwrap();
    assert_eq!(
        std::fs::read(point.join("hello.txt")).unwrap(),
        b"hello through fuse\n"
    );
    assert!(std::fs::read(point.join("docs/big.bin")).unwrap() == data);
    let mut names: Vec<String> = std::fs::read_dir(&point)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["docs", "hello.txt"]);
    std::fs::rename(point.join("docs/big.bin"), point.join("docs/moved.bin")).unwrap();
    assert!(std::fs::read(point.join("docs/moved.bin")).unwrap() == data);
    std::fs::remove_file(point.join("hello.txt")).unwrap();
    // What s3fs wrote is in the bucket, under the keys it shows.
    let copy = home.join("moved.bin");
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", "s3://acme/docs/moved.bin", &p(&copy)],
    );
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "the store holds other bytes"
    );
    let listed = store.ok(&["obj", "ls", "acme/"]);
    assert!(
        !listed.contains("hello.txt") && !listed.contains("big.bin"),
        "{listed}"
    );

    let unmounted = Command::new("umount").arg(&point).output().unwrap();
    assert!(
        unmounted.status.success(),
        "umount: {}",
        output_text(&unmounted)
    );
    assert!(!mounted(&point));
    drop(mount);
}
