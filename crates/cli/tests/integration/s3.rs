//! The S3 gateway, through the clients people use: aws-cli and boto3
//! against the gateway `strata store up` starts, and `strata s3` on its
//! own. Content, codes and headers are checked; a Python start-up costs
//! about half a second, so the aws-cli invocations are few and boto3's
//! checks share one script (`s3_boto3.py`).

use crate::common::store::Store;
use crate::common::{output_text, p, pattern, tmp, Launch};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output};

/// A tenant's S3 key pair, as `strata store tenant add` prints it.
pub(crate) struct Keys {
    /// The access key id.
    pub(crate) access: String,
    /// The secret access key.
    pub(crate) secret: String,
}

/// Issues tenant `tenant` of `store` and returns its S3 keys.
pub(crate) fn tenant(store: &Store, tenant: &str) -> Keys {
    let dir = p(&store.dir);
    let issued = store.json(&["store", "tenant", "add", "--dir", &dir, "--tenant", tenant]);
    let field = |name: &str| {
        issued[name]
            .as_str()
            .unwrap_or_else(|| panic!("no {name} in {issued}"))
            .to_string()
    };
    Keys {
        access: field("s3_access_key"),
        secret: field("s3_secret_key"),
    }
}

/// The gateway's endpoint on `store up`'s readiness line.
pub(crate) fn endpoint(store: &Store) -> String {
    let line = store.line();
    let at = line
        .find("s3 on ")
        .unwrap_or_else(|| panic!("no S3 endpoint on the readiness line {line:?}"));
    line[at + "s3 on ".len()..]
        .split([' ', ','])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The answer (head and body) of an unsigned `GET /metrics` to the
/// gateway at `address` (HOST:PORT).
pub(crate) fn scrape(address: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: s3\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut scraped = String::new();
    stream.read_to_string(&mut scraped).unwrap();
    scraped
}

/// `aws --endpoint-url ENDPOINT ARGS` as the tenant of `keys`, with no
/// configuration file of the host's.
pub(crate) fn aws(endpoint: &str, keys: &Keys, home: &Path, args: &[&str]) -> Output {
    Command::new("aws")
        .arg("--endpoint-url")
        .arg(endpoint)
        .args(args)
        .env("AWS_ACCESS_KEY_ID", &keys.access)
        .env("AWS_SECRET_ACCESS_KEY", &keys.secret)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        // A refusal is the answer under test: no retries with back-off.
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("AWS_CONFIG_FILE", home.join("aws-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("aws-credentials"))
        .env("HOME", home)
        .output()
        .expect("run aws (apt-get install awscli)")
}

/// [`aws`], which must succeed; its standard output.
pub(crate) fn aws_ok(endpoint: &str, keys: &Keys, home: &Path, args: &[&str]) -> String {
    let out = aws(endpoint, keys, home, args);
    assert!(
        out.status.success(),
        "aws {args:?} failed: {}",
        output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn aws_cli_copies_lists_ranges_and_removes_through_the_gateway() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    // Under aws-cli's 8 MiB multipart threshold: one PutObject.
    let data = pattern(3 << 20, 28);
    let file = home.join("big.bin");
    std::fs::write(&file, &data).unwrap();
    let run = |args: &[&str]| aws_ok(&s3, &keys, home, args);

    run(&["s3", "mb", "s3://acme"]);
    run(&[
        "s3",
        "cp",
        &p(&file),
        "s3://acme/docs/big.bin",
        "--metadata",
        "colour=red",
        "--content-type",
        "application/x-big",
    ]);
    let small = home.join("small.txt");
    std::fs::write(&small, b"small object\n").unwrap();
    run(&[
        "s3api",
        "put-object",
        "--bucket",
        "acme",
        "--key",
        "small.txt",
        "--body",
        &p(&small),
    ]);
    // A presigned GET URL from aws-cli, used with curl. aws-cli 1.x
    // presigns with SigV2 unless its configuration says s3v4.
    std::fs::write(
        home.join("aws-config"),
        "[default]\ns3 =\n    signature_version = s3v4\n",
    )
    .unwrap();
    let url = run(&["s3", "presign", "s3://acme/small.txt", "--expires-in", "60"]);
    assert!(url.contains("X-Amz-Signature="), "not a SigV4 URL: {url}");
    let fetched = Command::new("curl")
        .args(["-sS", "--fail", url.trim()])
        .output()
        .expect("run curl");
    assert!(
        fetched.status.success() && fetched.stdout == b"small object\n",
        "curl of a presigned URL: {}",
        output_text(&fetched)
    );
    let listed = run(&["s3", "ls", "s3://acme/docs/"]);
    assert!(
        listed.contains(&format!("{} big.bin", data.len())),
        "{listed}"
    );
    let back = home.join("back.bin");
    run(&["s3", "cp", "s3://acme/docs/big.bin", &p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "aws s3 cp read back other bytes"
    );

    let part = home.join("part.bin");
    let got = run(&[
        "s3api",
        "get-object",
        "--bucket",
        "acme",
        "--key",
        "docs/big.bin",
        "--range",
        "bytes=1000-1999",
        &p(&part),
    ]);
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(
        got["ContentRange"],
        format!("bytes 1000-1999/{}", data.len())
    );
    assert!(std::fs::read(&part).unwrap() == data[1000..2000]);
    // A range across the store client's 256 KiB chunks, from a later one.
    run(&[
        "s3api",
        "get-object",
        "--bucket",
        "acme",
        "--key",
        "docs/big.bin",
        "--range",
        "bytes=262000-600000",
        &p(&part),
    ]);
    assert!(std::fs::read(&part).unwrap() == data[262000..600001]);

    let head = run(&[
        "s3api",
        "head-object",
        "--bucket",
        "acme",
        "--key",
        "docs/big.bin",
    ]);
    let head: serde_json::Value = serde_json::from_str(&head).unwrap();
    assert_eq!(head["Metadata"]["colour"], "red", "{head}");
    assert_eq!(head["ContentType"], "application/x-big", "{head}");
    assert_eq!(head["ContentLength"], data.len() as u64, "{head}");
    let md5 = head["ETag"].as_str().unwrap().trim_matches('"').to_string();
    let md5sum = Command::new("md5sum").arg(&file).output().unwrap();
    assert!(String::from_utf8_lossy(&md5sum.stdout).starts_with(&md5));

    let keys_listed = run(&["s3api", "list-objects-v2", "--bucket", "acme"]);
    let keys_listed: serde_json::Value = serde_json::from_str(&keys_listed).unwrap();
    let names: Vec<&str> = keys_listed["Contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["Key"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["docs/big.bin", "small.txt"]);

    let deleted = run(&[
        "s3api",
        "delete-objects",
        "--bucket",
        "acme",
        "--delete",
        r#"{"Objects":[{"Key":"small.txt"}]}"#,
    ]);
    assert!(deleted.contains("small.txt"), "{deleted}");
    // A copy inside the bucket: one CopyObject under aws-cli's 8 MiB
    // multipart threshold, streamed across the store's 256 KiB chunks.
    run(&[
        "s3",
        "cp",
        "s3://acme/docs/big.bin",
        "s3://acme/docs/copy.bin",
    ]);
    let copy = home.join("copy.bin");
    run(&["s3", "cp", "s3://acme/docs/copy.bin", &p(&copy)]);
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "the copy holds other bytes"
    );
    let head = run(&[
        "s3api",
        "head-object",
        "--bucket",
        "acme",
        "--key",
        "docs/copy.bin",
    ]);
    let head: serde_json::Value = serde_json::from_str(&head).unwrap();
    assert_eq!(head["ETag"], format!("\"{md5}\""), "{head}");
    assert_eq!(head["Metadata"]["colour"], "red", "{head}");
    run(&["s3", "rm", "s3://acme/docs/copy.bin"]);
    run(&["s3", "rm", "s3://acme/docs/big.bin"]);
    assert_eq!(run(&["s3", "ls", "s3://acme/", "--recursive"]), "");
    // Nothing of the tenant's is left in the store but the bucket's marker.
    let left = store.ok(&["obj", "ls", "acme/", "--all"]);
    assert!(
        !left.contains("big.bin") && !left.contains("small"),
        "{left}"
    );
}

#[test]
fn an_object_stored_with_strata_obj_is_listed_and_read_through_s3() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    let run = |args: &[&str]| aws_ok(&s3, &keys, home, args);
    run(&["s3", "mb", "s3://acme"]);
    let data = pattern(300 << 10, 5);
    let file = home.join("plain.bin");
    std::fs::write(&file, &data).unwrap();
    store.ok(&["obj", "put", &p(&file), "acme/from-strata/plain.bin"]);
    let crc = crc32c::crc32c(&data);

    let listed = run(&["s3api", "list-objects-v2", "--bucket", "acme"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let entry = &listed["Contents"][0];
    assert_eq!(entry["Key"], "from-strata/plain.bin", "{listed}");
    assert_eq!(entry["Size"], data.len() as u64, "{listed}");
    // No S3 metadata was stored with it: its ETag is its CRC-32C.
    assert_eq!(entry["ETag"], format!("\"{crc:08x}\""), "{listed}");

    let back = home.join("back.bin");
    let got = run(&[
        "s3api",
        "get-object",
        "--bucket",
        "acme",
        "--key",
        "from-strata/plain.bin",
        &p(&back),
    ]);
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_eq!(got["ETag"], format!("\"{crc:08x}\""), "{got}");
    assert!(
        std::fs::read(&back).unwrap() == data,
        "S3 read back other bytes"
    );

    // And the other way: an S3 object is the plain store name, its bytes
    // the body.
    run(&["s3", "cp", &p(&file), "s3://acme/via-s3.bin"]);
    let names = store.ok(&["obj", "ls", "acme/"]);
    assert!(names.contains("acme/via-s3.bin"), "{names}");
    let copy = home.join("copy.bin");
    store.ok(&["obj", "get", "acme/via-s3.bin", &p(&copy)]);
    assert!(std::fs::read(&copy).unwrap() == data);
}

/// aws-cli downloads an object over its 8 MiB multipart threshold in
/// ranged GETs of 8 MiB, each of which the gateway reads as a ranged
/// read: the storage nodes send about the object's bytes once (a whole
/// read per range would send them once per range), and the bytes are
/// exact. A GET of one part of a multipart upload (`--part-number`) is
/// exact too.
#[test]
fn aws_cli_downloads_in_ranges_that_read_each_byte_about_once() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &["--metrics", "127.0.0.1:0"]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    let run = |args: &[&str]| aws_ok(&s3, &keys, home, args);
    run(&["s3", "mb", "s3://acme"]);
    let size = 40 << 20;
    let data = pattern(size, 29);
    let file = home.join("big.bin");
    std::fs::write(&file, &data).unwrap();
    // One PutObject: a single store object, read in five ranges.
    let body = p(&file);
    let put = [
        "s3api",
        "put-object",
        "--bucket",
        "acme",
        "--key",
        "big.bin",
    ];
    run(&[&put[..], &["--body", &body]].concat());
    let sent = || store.metric_sum("strata_read_bytes_total");
    let ranges = || store.metric_sum("strata_range_reads_total");
    let (sent_before, ranges_before) = (sent(), ranges());
    let back = home.join("back.bin");
    run(&["s3", "cp", "s3://acme/big.bin", &p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the download differs"
    );
    let read = sent() - sent_before;
    assert!(
        (size as f64..=1.1 * size as f64).contains(&read),
        "a {size}-byte download in ranges made the nodes send {read} bytes"
    );
    assert!(ranges() - ranges_before >= 5.0, "no ranged reads counted");

    // A multipart upload (8 MiB parts) read back one part at a time.
    let multi = pattern(20 << 20, 30);
    std::fs::write(&file, &multi).unwrap();
    run(&["s3", "cp", &p(&file), "s3://acme/multi.bin"]);
    let part = home.join("part.bin");
    let get = [
        "s3api",
        "get-object",
        "--bucket",
        "acme",
        "--key",
        "multi.bin",
    ];
    run(&[&get[..], &["--part-number", "2", &p(&part)]].concat());
    assert!(std::fs::read(&part).unwrap() == multi[8 << 20..16 << 20]);
    let range = "bytes=8388000-8389999";
    run(&[&get[..], &["--range", range, &p(&part)]].concat());
    assert!(std::fs::read(&part).unwrap() == multi[8_388_000..8_390_000]);
}

/// A replica damaged on disk (one bit flipped near its end): GetObject
/// holds back its last chunk until the replica's CRC-32C is checked, so
/// the client sees a failed read, never the whole body with the bad byte;
/// a Range over the damage fails too (its chunk fails its CRC-32C), while
/// a Range before it is served exact, from good chunks alone; a copy
/// fails, and stores nothing.
#[test]
fn a_damaged_replica_cuts_a_get_short_instead_of_serving_bad_bytes() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    let data = pattern(1 << 20, 12);
    let file = home.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    aws_ok(&s3, &keys, home, &["s3", "mb", "s3://acme"]);
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", &p(&file), "s3://acme/data.bin"],
    );
    // One storage node, one replica: the largest file is the object's
    // (the bucket's marker is the other). The flipped byte is data: the
    // header is at the file's start.
    let replica = store
        .replica_files()
        .into_iter()
        .max_by_key(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .unwrap();
    let mut bytes = std::fs::read(&replica).unwrap();
    // In the data, before the chunk table that follows it.
    let size = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let at = 20 + size - 10;
    bytes[at] ^= 0x10;
    std::fs::write(&replica, &bytes).unwrap();
    let back = home.join("back.bin");
    let tail = format!("bytes={}-{}", data.len() - 100, data.len() - 1);
    for range in [None, Some(tail.as_str())] {
        let mut args = vec![
            "s3api",
            "get-object",
            "--bucket",
            "acme",
            "--key",
            "data.bin",
        ];
        if let Some(range) = range {
            args.extend(["--range", range]);
        }
        let back_path = p(&back);
        args.push(&back_path);
        let out = aws(&s3, &keys, home, &args);
        assert!(
            !out.status.success(),
            "a damaged replica was served whole ({range:?}): {}",
            output_text(&out)
        );
    }
    // The good chunks before the damage are served by a ranged read.
    let head = home.join("head.bin");
    aws_ok(
        &s3,
        &keys,
        home,
        &[
            "s3api",
            "get-object",
            "--bucket",
            "acme",
            "--key",
            "data.bin",
            "--range",
            "bytes=0-99",
            &p(&head),
        ],
    );
    assert!(std::fs::read(&head).unwrap() == data[..100]);
    // A copy of it fails too, and stores nothing at the destination.
    let copy = aws(
        &s3,
        &keys,
        home,
        &[
            "s3api",
            "copy-object",
            "--bucket",
            "acme",
            "--key",
            "copy.bin",
            "--copy-source",
            "acme/data.bin",
        ],
    );
    assert!(
        !copy.status.success(),
        "a damaged replica was copied: {}",
        output_text(&copy)
    );
    let listed = aws_ok(&s3, &keys, home, &["s3", "ls", "s3://acme/"]);
    assert!(!listed.contains("copy.bin"), "a failed copy left {listed}");
}

/// The boto3 suite, on a store of three storage nodes so that a bucket
/// may be made in `ec(2,1)`; then the objects and part it stored there
/// must be kept in that class.
#[test]
fn boto3_runs_every_supported_operation_and_error() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &["--sn", "3"]);
    let acme = tenant(&store, "acme");
    let globex = tenant(&store, "globex");
    let admin = tenant(&store, "*");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/integration/s3_boto3.py");
    let out = Command::new("python3")
        .arg(script)
        .args([&endpoint(&store), "acme", &acme.access, &acme.secret])
        .args(["globex", &globex.access, &globex.secret])
        .args([&admin.access, &admin.secret])
        .output()
        .expect("run python3 (apt-get install python3-boto3)");
    let text = output_text(&out);
    assert!(out.status.success(), "s3_boto3.py failed:\n{text}");
    assert!(text.contains("checks passed"), "{text}");
    let mut names = vec!["classy/plain".to_string(), "classy/copied".to_string()];
    names.extend(
        store
            .ok(&["obj", "ls", "classy/.strata-multipart/p/"])
            .lines()
            .filter_map(|line| line.split_whitespace().find(|word| word.contains("/p/")))
            .map(str::to_string),
    );
    assert_eq!(names.len(), 3, "one part of classy/parted: {names:?}");
    for name in names {
        let stat = store.json(&["obj", "stat", &name]);
        assert_eq!(
            stat["class"], "ec(2,1)",
            "{name} is not in its bucket's class: {stat}"
        );
    }
    let plain = store.json(&["obj", "stat", "classless/plain"]);
    assert_eq!(
        plain["class"], "replicated(1)",
        "a bucket without a class: {plain}"
    );
}

#[test]
fn strata_s3_serves_a_cluster_alone_and_refuses_anonymous_requests() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let on = store.on.to_string();
    let key = p(&store.key_path());
    let gateway = Launch::strata(&[
        "s3",
        "--cluster",
        &on,
        "--listen",
        "127.0.0.1:0",
        "--key",
        &key,
    ])
    .start();
    let address = gateway.word_after("ready on http://");
    let s3 = format!("http://{address}");
    let home = dir.path();
    aws_ok(&s3, &keys, home, &["s3", "mb", "s3://acme"]);
    let wrong = Keys {
        access: keys.access.clone(),
        secret: "0".repeat(40),
    };
    let refused = aws(&s3, &wrong, home, &["s3", "ls", "s3://acme"]);
    assert!(!refused.status.success());
    assert!(
        output_text(&refused).contains("SignatureDoesNotMatch"),
        "{}",
        output_text(&refused)
    );

    // An unsigned request: AccessDenied, in S3's XML.
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream
        .write_all(b"GET /acme?list-type=2 HTTP/1.1\r\nHost: s3\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("<Code>AccessDenied</Code>"), "{answer}");
    // The bucket the signed request made is the store's `acme/` marker.
    store.ok(&["obj", "stat", "acme/"]);

    // /metrics: the requests above, and a Put and a Get of 5,000 bytes.
    let body = home.join("five.bin");
    std::fs::write(&body, pattern(5000, 2)).unwrap();
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", &p(&body), "s3://acme/five.bin"],
    );
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", "s3://acme/five.bin", &p(&home.join("back"))],
    );
    let scraped = scrape(&address);
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    assert!(scraped.contains("text/plain; version=0.0.4"), "{scraped}");
    let value = |sample: &str| -> f64 {
        let line = scraped
            .lines()
            .find(|line| line.starts_with(sample) && line[sample.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {sample} in /metrics:\n{scraped}"));
        line[sample.len()..].trim().parse().unwrap()
    };
    let requests = |operation: &str, status: u16| {
        value(&format!(
            "strata_s3_requests_total{{operation=\"{operation}\",status=\"{status}\"}}"
        ))
    };
    assert_eq!(requests("CreateBucket", 200), 1.0);
    assert_eq!(requests("PutObject", 200), 1.0);
    assert_eq!(requests("GetObject", 200), 1.0);
    // The anonymous listing was routed, then refused; the wrong
    // signature was refused before s3s routed it.
    assert_eq!(requests("ListObjectsV2", 403), 1.0);
    assert!(requests("unrouted", 403) >= 1.0);
    assert!(value("strata_s3_received_bytes_total{operation=\"PutObject\"}") >= 5000.0);
    assert!(value("strata_s3_sent_bytes_total{operation=\"GetObject\"}") >= 5000.0);
    let histogram = "strata_s3_request_duration_seconds";
    assert_eq!(
        value(&format!("{histogram}_count{{operation=\"PutObject\"}}")),
        1.0
    );
    assert_eq!(
        value(&format!(
            "{histogram}_bucket{{operation=\"PutObject\",le=\"+Inf\"}}"
        )),
        1.0
    );
    assert!(value(&format!("{histogram}_sum{{operation=\"PutObject\"}}")) > 0.0);
    // The replica choice of acme's store client: its Get read a node,
    // whose NAMI weight and reads show.
    let reads: f64 = scraped
        .lines()
        .filter(|line| line.starts_with("strata_s3_store_node_reads_total{tenant=\"acme\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(reads >= 1.0, "no store read on /metrics:\n{scraped}");
    assert!(
        scraped.contains("strata_s3_store_node_weight{tenant=\"acme\",node=\""),
        "{scraped}"
    );
}

/// The store names under the bucket `bucket` the gateway keeps for
/// multipart uploads (upload states and parts), as `strata obj ls` shows
/// them.
pub(crate) fn multipart_names(store: &Store, bucket: &str) -> Vec<String> {
    let listed = store.ok(&["obj", "ls", &format!("{bucket}/.strata-multipart/")]);
    listed
        .lines()
        .filter(|line| line.contains(".strata-multipart/"))
        .map(str::to_string)
        .collect()
}

/// aws-cli uploads a file over its multipart threshold (5 MB here) in
/// parts; the object reads back whole and by ranges across parts, has
/// S3's multipart ETag, copies in parts (UploadPartCopy), and leaves no
/// part behind once deleted.
#[test]
fn aws_cli_uploads_copies_and_deletes_in_parts() {
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
    // Three parts of 5 MiB, 5 MiB and the rest.
    let data = pattern(12 << 20, 40);
    let file = home.join("big.bin");
    std::fs::write(&file, &data).unwrap();
    run(&["s3", "mb", "s3://acme"]);
    run(&[
        "s3",
        "cp",
        &p(&file),
        "s3://acme/big.bin",
        "--metadata",
        "kind=parts",
    ]);
    let head = run(&[
        "s3api",
        "head-object",
        "--bucket",
        "acme",
        "--key",
        "big.bin",
    ]);
    let head: serde_json::Value = serde_json::from_str(&head).unwrap();
    assert_eq!(head["ContentLength"], data.len() as u64, "{head}");
    assert_eq!(head["Metadata"]["kind"], "parts", "{head}");
    let etag = head["ETag"].as_str().unwrap().trim_matches('"').to_string();
    assert!(etag.ends_with("-3"), "not a 3-part ETag: {etag}");
    let back = home.join("back.bin");
    run(&["s3", "cp", "s3://acme/big.bin", &p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "read back other bytes"
    );
    // A range across the first part boundary (5 MiB).
    let part = home.join("range.bin");
    let boundary = 5 << 20;
    let range = format!("bytes={}-{}", boundary - 1000, boundary + 999);
    run(&[
        "s3api",
        "get-object",
        "--bucket",
        "acme",
        "--key",
        "big.bin",
        "--range",
        &range,
        &p(&part),
    ]);
    assert!(std::fs::read(&part).unwrap() == data[boundary - 1000..boundary + 1000]);
    let listed = run(&["s3", "ls", "s3://acme/"]);
    assert!(
        listed.contains(&format!("{} big.bin", data.len())),
        "{listed}"
    );
    assert!(!listed.contains("strata-multipart"), "{listed}");
    // A copy above the threshold: aws-cli copies it in parts.
    run(&["s3", "cp", "s3://acme/big.bin", "s3://acme/copy.bin"]);
    run(&["s3", "cp", "s3://acme/copy.bin", &p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the copy holds other bytes"
    );
    assert_eq!(
        multipart_names(&store, "acme").len(),
        6,
        "two objects of 3 parts"
    );
    // Overwritten by a single Put, and deleted: no part is left.
    let small = home.join("small.txt");
    std::fs::write(&small, b"now small\n").unwrap();
    run(&["s3", "cp", &p(&small), "s3://acme/copy.bin"]);
    run(&["s3", "rm", "s3://acme/big.bin"]);
    assert_eq!(multipart_names(&store, "acme"), Vec::<String>::new());
    run(&["s3", "cp", "s3://acme/copy.bin", &p(&back)]);
    assert_eq!(std::fs::read(&back).unwrap(), b"now small\n");
}

/// An upload nobody completes is aborted once `--multipart-expiry` has
/// passed: its state and parts leave the store.
#[test]
fn abandoned_uploads_are_cleaned_after_the_expiry() {
    let dir = tmp();
    // Long enough for the two aws-cli calls below on a loaded machine
    // (each starts Python): the upload must not expire before its part.
    let store = Store::up(&dir.path().join("store"), &["--multipart-expiry", "8s"]);
    let keys = tenant(&store, "acme");
    let s3 = endpoint(&store);
    let home = dir.path();
    let run = |args: &[&str]| aws_ok(&s3, &keys, home, args);
    run(&["s3", "mb", "s3://acme"]);
    let created = run(&[
        "s3api",
        "create-multipart-upload",
        "--bucket",
        "acme",
        "--key",
        "left",
    ]);
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let upload = created["UploadId"].as_str().unwrap().to_string();
    let body = home.join("part.bin");
    std::fs::write(&body, pattern(1000, 3)).unwrap();
    let args = [
        "s3api",
        "upload-part",
        "--bucket",
        "acme",
        "--key",
        "left",
        "--part-number",
        "1",
    ];
    let mut args = args.to_vec();
    let body_path = p(&body);
    args.extend(["--upload-id", &upload, "--body", &body_path]);
    run(&args);
    assert_eq!(
        multipart_names(&store, "acme").len(),
        2,
        "the state and one part"
    );
    crate::common::store::wait_until("the expired upload to be cleaned", || {
        multipart_names(&store, "acme").is_empty()
    });
    let listed = run(&["s3api", "list-multipart-uploads", "--bucket", "acme"]);
    assert!(!listed.contains(&upload), "{listed}");

    // A Complete whose gateway died after writing the manifest leaves the
    // upload's state and the parts it left out: made here by hand around
    // a completed object. The cleaner takes them, and the object's parts
    // stay.
    std::fs::write(
        home.join("aws-config"),
        "[default]\ns3 =\n    multipart_threshold = 5MB\n    multipart_chunksize = 5MB\n",
    )
    .unwrap();
    let data = pattern(6 << 20, 8);
    let file = home.join("done.bin");
    std::fs::write(&file, &data).unwrap();
    run(&["s3", "cp", &p(&file), "s3://acme/done"]);
    let parts = multipart_names(&store, "acme");
    assert_eq!(parts.len(), 2, "{parts:?}");
    let first = parts[0].split_whitespace().last().unwrap().to_string();
    // The part's name is `.../p/HEX(KEY)/UPLOAD/00001-ATTEMPT`.
    let upload_dir = &first[..first.rfind('/').unwrap() + 1];
    let state = upload_dir
        .replacen("/.strata-multipart/p/", "/.strata-multipart/u/", 1)
        .trim_end_matches('/')
        .to_string();
    let empty = home.join("empty");
    std::fs::write(&empty, b"").unwrap();
    store.ok(&["obj", "put", &p(&empty), &state]);
    store.ok(&["obj", "put", &p(&body), &format!("{upload_dir}00009")]);
    // (No count here: the cleaner may already be at them.)
    crate::common::store::wait_until("the interrupted Complete to be cleaned", || {
        multipart_names(&store, "acme") == parts
    });
    let back = home.join("back.bin");
    run(&["s3", "cp", "s3://acme/done", &p(&back)]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the object lost bytes"
    );
}

/// A gateway killed (SIGKILL) while aws-cli uploads in parts: the
/// upload fails and no object is visible; retried through a new gateway
/// it completes, and the dead upload's names are cleaned at its expiry.
#[test]
fn a_gateway_killed_mid_upload_leaves_no_object_and_a_retry_completes() {
    let dir = tmp();
    let store = Store::up(&dir.path().join("store"), &[]);
    let keys = tenant(&store, "acme");
    let home = dir.path();
    let (on, key) = (store.on.to_string(), p(&store.key_path()));
    let gateway = || {
        Launch::strata(&[
            "s3",
            "--cluster",
            &on,
            "--listen",
            "127.0.0.1:0",
            "--key",
            &key,
        ])
        .start()
    };
    let first = gateway();
    let s3 = format!("http://{}", first.word_after("ready on http://"));
    std::fs::write(
        home.join("aws-config"),
        "[default]\ns3 =\n    multipart_threshold = 5MB\n    multipart_chunksize = 5MB\n    \
         max_concurrent_requests = 1\n",
    )
    .unwrap();
    aws_ok(&s3, &keys, home, &["s3", "mb", "s3://acme"]);
    let data = pattern(40 << 20, 6);
    let file = home.join("big.bin");
    std::fs::write(&file, &data).unwrap();
    let upload = Command::new("aws")
        .args([
            "--endpoint-url",
            &s3,
            "s3",
            "cp",
            &p(&file),
            "s3://acme/big.bin",
        ])
        .env("AWS_ACCESS_KEY_ID", &keys.access)
        .env("AWS_SECRET_ACCESS_KEY", &keys.secret)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_MAX_ATTEMPTS", "1")
        .env("AWS_CONFIG_FILE", home.join("aws-config"))
        .env("HOME", home)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run aws");
    crate::common::store::wait_until("a first part to be stored", || {
        multipart_names(&store, "acme")
            .iter()
            .any(|name| name.contains("/p/"))
    });
    drop(first);
    let output = upload.wait_with_output().unwrap();
    assert!(!output.status.success(), "the upload outlived its gateway");

    let second = gateway();
    let s3 = format!("http://{}", second.word_after("ready on http://"));
    let head = aws(
        &s3,
        &keys,
        home,
        &[
            "s3api",
            "head-object",
            "--bucket",
            "acme",
            "--key",
            "big.bin",
        ],
    );
    assert!(!head.status.success(), "a partial object is visible");
    let pending = aws_ok(
        &s3,
        &keys,
        home,
        &["s3api", "list-multipart-uploads", "--bucket", "acme"],
    );
    assert!(pending.contains("big.bin"), "{pending}");
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", &p(&file), "s3://acme/big.bin"],
    );
    let back = home.join("back.bin");
    aws_ok(
        &s3,
        &keys,
        home,
        &["s3", "cp", "s3://acme/big.bin", &p(&back)],
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the retried upload holds other bytes"
    );
    // The dead upload is still pending (7 days by default): aborted by
    // hand, it leaves only the object's eight parts.
    let pending: serde_json::Value = serde_json::from_str(&aws_ok(
        &s3,
        &keys,
        home,
        &["s3api", "list-multipart-uploads", "--bucket", "acme"],
    ))
    .unwrap();
    let dead = pending["Uploads"][0]["UploadId"]
        .as_str()
        .unwrap()
        .to_string();
    aws_ok(
        &s3,
        &keys,
        home,
        &[
            "s3api",
            "abort-multipart-upload",
            "--bucket",
            "acme",
            "--key",
            "big.bin",
            "--upload-id",
            &dead,
        ],
    );
    assert_eq!(multipart_names(&store, "acme").len(), 8);
}
