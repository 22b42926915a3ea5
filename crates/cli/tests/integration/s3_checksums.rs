//! The S3 gateway's multipart attempts and checksums through real
//! clients: re-uploads of listed parts racing CompleteMultipartUpload
//! (boto3, `s3_race.py`), with the store's names counted afterwards, and
//! checksums kept with objects and parts through aws-cli, compared with
//! values computed here by the sha2 and crc32c crates.

use crate::common::store::Store;
use crate::common::{output_text, p, pattern, tmp};
use crate::s3::{aws, aws_ok, endpoint, multipart_names, tenant};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::process::Command;

/// Rounds of the race: each completes one two-part object.
const ROUNDS: usize = 12;

/// Re-uploads of a listed part number racing the Complete never change
/// or break the object, and once the races settle, the store holds
/// exactly the completed objects' parts: no attempt a Complete or Abort
/// left out, no upload state.
#[test]
fn reuploads_racing_a_complete_never_change_the_object_or_leak_parts() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    aws_ok(&s3, &keys, dir.path(), &["s3", "mb", "s3://acme"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/integration/s3_race.py");
    let out = Command::new("python3")
        .arg(script)
        .args([&s3, "acme", &keys.access, &keys.secret])
        .arg(ROUNDS.to_string())
        .output()
        .expect("run python3 (apt-get install python3-boto3)");
    let text = output_text(&out);
    assert!(out.status.success(), "s3_race.py failed:\n{text}");
    assert!(text.contains("rounds passed"), "{text}");
    // Which way the racing UploadParts went (stored, or refused).
    eprintln!("{}", text.lines().last().unwrap_or_default());
    let names = multipart_names(&store, "acme");
    assert_eq!(
        names.len(),
        2 * ROUNDS,
        "two parts per completed object, nothing else: {names:#?}"
    );
    assert!(
        names
            .iter()
            .all(|name| name.contains("/.strata-multipart/p/")),
        "an upload state was left: {names:#?}"
    );
    // Deleting the objects takes their parts.
    for round in 0..ROUNDS {
        let key = format!("s3://acme/race/{round}");
        aws_ok(&s3, &keys, dir.path(), &["s3", "rm", &key]);
    }
    assert_eq!(multipart_names(&store, "acme"), Vec::<String>::new());
}

/// The base64 SHA-256 of `bytes`.
fn sha256(bytes: &[u8]) -> String {
    STANDARD.encode(Sha256::digest(bytes))
}

/// The base64 CRC-32C of `bytes` (big-endian, as S3 writes it).
fn crc32c(bytes: &[u8]) -> String {
    STANDARD.encode(crc32c::crc32c(bytes).to_be_bytes())
}

/// aws-cli's `--checksum-algorithm` and `--checksum-crc32-c`: the gateway
/// checks the value, keeps it, and answers it with `--checksum-mode
/// ENABLED` (aws-cli then checks the body it downloads against it); a
/// multipart upload answers S3's composite of its parts' checksums; a
/// wrong checksum stores nothing.
#[test]
fn aws_cli_checksums_are_checked_kept_and_answered() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    std::fs::write(
        home.join("aws-config"),
        "[default]\ns3 =\n    multipart_threshold = 5MB\n    multipart_chunksize = 5MB\n",
    )
    .unwrap();
    let run = |args: &[&str]| aws_ok(&s3, &keys, home, args);
    let head = |key: &str| -> serde_json::Value {
        let args = ["s3api", "head-object", "--bucket", "acme", "--key", key];
        let out = run(&[&args[..], &["--checksum-mode", "ENABLED"]].concat());
        serde_json::from_str(&out).unwrap()
    };
    run(&["s3", "mb", "s3://acme"]);

    // One PutObject, SHA-256 computed by aws-cli.
    let small = pattern(300 << 10, 9);
    let small_file = home.join("small.bin");
    std::fs::write(&small_file, &small).unwrap();
    let cp = ["s3", "cp", &p(&small_file), "s3://acme/small.bin"];
    run(&[&cp[..], &["--checksum-algorithm", "SHA256"]].concat());
    let shown = head("small.bin");
    assert_eq!(shown["ChecksumSHA256"], sha256(&small), "{shown}");
    // Without the mode, no checksum is answered.
    let plain = run(&[
        "s3api",
        "head-object",
        "--bucket",
        "acme",
        "--key",
        "small.bin",
    ]);
    assert!(!plain.contains("ChecksumSHA256"), "{plain}");
    // aws-cli checks the download against the checksum answered.
    let back = home.join("back.bin");
    let get = ["s3", "cp", "s3://acme/small.bin", &p(&back)];
    run(&[&get[..], &["--checksum-mode", "ENABLED"]].concat());
    assert!(std::fs::read(&back).unwrap() == small);

    // Three parts of 5 MiB, 5 MiB and 2 MiB: the composite SHA-256 is
    // the SHA-256 of the parts' digests, then "-3".
    let big = pattern(12 << 20, 10);
    let big_file = home.join("big.bin");
    std::fs::write(&big_file, &big).unwrap();
    let cp = ["s3", "cp", &p(&big_file), "s3://acme/big.bin"];
    run(&[&cp[..], &["--checksum-algorithm", "SHA256"]].concat());
    let digests: Vec<u8> = big
        .chunks(5 << 20)
        .flat_map(|part| Sha256::digest(part).to_vec())
        .collect();
    let composite = format!("{}-3", sha256(&digests));
    let shown = head("big.bin");
    assert_eq!(shown["ChecksumSHA256"], composite, "{shown}");
    assert_eq!(shown["ContentLength"], big.len() as u64, "{shown}");
    run(&["s3", "cp", "s3://acme/big.bin", &p(&back)]);
    assert!(std::fs::read(&back).unwrap() == big);

    // A CRC-32C given by value (aws-cli computes none without the CRT).
    let put = [
        "s3api",
        "put-object",
        "--bucket",
        "acme",
        "--key",
        "crc.bin",
        "--body",
    ];
    let small_path = p(&small_file);
    let answer = run(&[
        &put[..],
        &[&small_path, "--checksum-crc32-c", &crc32c(&small)],
    ]
    .concat());
    assert!(answer.contains(&crc32c(&small)), "{answer}");
    assert_eq!(head("crc.bin")["ChecksumCRC32C"], crc32c(&small));
    // A wrong one over it: BadDigest, naming the algorithm, and nothing
    // stored (the key keeps its body and checksum).
    let wrong = crc32c(b"other bytes");
    let refused = aws(
        &s3,
        &keys,
        home,
        &[&put[..], &[&small_path, "--checksum-crc32-c", &wrong]].concat(),
    );
    let text = output_text(&refused);
    assert!(!refused.status.success(), "a wrong CRC32C was taken");
    assert!(
        text.contains("BadDigest") && text.contains("CRC32C"),
        "{text}"
    );
    let shown = head("crc.bin");
    assert_eq!(shown["ChecksumCRC32C"], crc32c(&small), "{shown}");
    assert_eq!(shown["ContentLength"], small.len() as u64, "{shown}");
}

/// CRC-32C computed by boto3 itself (through the AWS CRT, which only
/// Debian's system Python has here): checked, kept and answered for a
/// PutObject and for each part and the composite of a multipart upload;
/// a wrong value is `BadDigest` and leaves the object as it was.
#[test]
fn boto3_with_the_crt_computes_crc32c_and_the_gateway_checks_it() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    aws_ok(&s3, &keys, dir.path(), &["s3", "mb", "s3://acme"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/integration/s3_crc32c.py"
    );
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .args([&s3, "acme", &keys.access, &keys.secret])
        .output()
        .expect("run /usr/bin/python3 (apt-get install python3-boto3 python3-awscrt)");
    let text = output_text(&out);
    assert!(out.status.success(), "s3_crc32c.py failed:\n{text}");
    assert!(text.contains("crc32c: 11 checks passed"), "{text}");
}
