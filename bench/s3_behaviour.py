#!/usr/bin/env python3
"""The S3 behaviour of two gateways side by side (used by s3_bench.py;
also runnable alone against any two endpoints).

Usage:
    python3 bench/s3_behaviour.py --a NAME,ENDPOINT,ACCESS,SECRET \\
        --b NAME,ENDPOINT,ACCESS,SECRET --bucket BUCKET

Both get the same requests through boto3 (path-style, one attempt, no
retries) in the same order: PutObject of several sizes with content
types and metadata; GetObject whole, with ranges (first byte, a span, a
suffix, an open end, past the end) and with If-Match, If-None-Match,
If-Modified-Since and If-Unmodified-Since; HeadObject; CopyObject
(metadata kept and replaced); ListObjects v1 and v2 with prefix,
delimiter, max-keys and continuation; DeleteObject and DeleteObjects;
multipart create, upload part, list parts, list uploads, complete and
abort; and the errors NoSuchKey, NoSuchBucket, InvalidRange,
SignatureDoesNotMatch, EntityTooSmall, InvalidPart and NoSuchUpload. For
each request it records the status, the S3 error code, the headers ETag,
Content-Length, Content-Range, Content-Type and x-amz-meta-*, the body's
MD5 for GETs and the listed names for lists, and prints every field that
differs. The bucket is made at the start (it must not exist) and emptied
and removed at the end.
"""
import argparse
import hashlib
import sys

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

COMPARED_HEADERS = ("etag", "content-length", "content-range", "content-type")
PART_BYTES = 5 << 20
REGION = "us-east-1"


def client(endpoint, access, secret):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                        aws_secret_access_key=secret, region_name=REGION,
                        config=Config(retries={"max_attempts": 1, "mode": "standard"},
                                      s3={"addressing_style": "path"},
                                      # No flexible checksums: both servers see
                                      # the same plain requests.
                                      request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


def data(size, seed):
    block = hashlib.sha256(f"{seed}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def summary(response):
    """What is compared of a successful answer."""
    meta = response.get("ResponseMetadata", {})
    headers = meta.get("HTTPHeaders", {})
    out = {"status": meta.get("HTTPStatusCode")}
    for name in COMPARED_HEADERS:
        if name in headers:
            out[name] = headers[name]
    if "ContentLength" not in response:
        # An XML answer's length depends on its request ids and on
        # chunked or whole transfer: only objects' lengths are compared.
        out.pop("content-length", None)
    for name, value in headers.items():
        if name.startswith("x-amz-meta-"):
            out[name] = value
    if "Body" in response:
        body = response["Body"].read()
        out["body-md5"] = hashlib.md5(body).hexdigest()
    for field in ("IsTruncated", "KeyCount", "MaxKeys", "Delimiter", "Prefix"):
        if field in response:
            out[field] = response[field]
    if "Contents" in response:
        out["keys"] = [(o["Key"], o["Size"], o["ETag"]) for o in response["Contents"]]
    if "CommonPrefixes" in response:
        out["prefixes"] = [p["Prefix"] for p in response["CommonPrefixes"]]
    if "Parts" in response:
        out["parts"] = [(p["PartNumber"], p["Size"], p["ETag"]) for p in response["Parts"]]
    if "Uploads" in response:
        out["uploads"] = sorted(u["Key"] for u in response["Uploads"])
    if "Deleted" in response:
        out["deleted"] = sorted(d["Key"] for d in response["Deleted"])
    if "Errors" in response:
        out["delete-errors"] = sorted((e["Key"], e["Code"]) for e in response["Errors"])
    if "CopyObjectResult" in response:
        out["copy-etag"] = response["CopyObjectResult"]["ETag"]
    return out


def error_summary(error):
    meta = error.response.get("ResponseMetadata", {})
    headers = meta.get("HTTPHeaders", {})
    out = {"status": meta.get("HTTPStatusCode"),
           "code": error.response.get("Error", {}).get("Code")}
    for name in ("content-range",):
        if name in headers:
            out[name] = headers[name]
    return out


class Side:
    """One gateway: its client, a client with a wrong secret, and the
    state its own answers give (upload ids, continuation tokens)."""

    def __init__(self, name, endpoint, access, secret):
        self.name = name
        self.client = client(endpoint, access, secret)
        self.wrong = client(endpoint, access, secret[:-1] + ("0" if secret[-1] != "0" else "1"))
        self.state = {}
        self.requests = 0


def steps(bucket):
    """(label, function of a Side) in order; each function makes one request."""
    sizes = [0, 1, 100, 255, 4096, 65536, 1000000, 1 << 20]
    out = []
    add = out.append
    add(("create bucket", lambda s: s.client.create_bucket(Bucket=bucket)))
    for i, size in enumerate(sizes):
        key = f"obj/{i}"
        body = data(size, i)
        add((f"put {key} ({size} B, type, metadata)",
             lambda s, key=key, body=body, i=i: s.client.put_object(
                 Bucket=bucket, Key=key, Body=body, ContentType=f"application/x-test-{i}",
                 Metadata={"colour": "red", "index": str(i)})))
        add((f"put plain/{i} (no type)",
             lambda s, i=i, body=body: s.client.put_object(Bucket=bucket, Key=f"plain/{i}",
                                                           Body=body)))
    for i, size in enumerate(sizes):
        key = f"obj/{i}"
        add((f"get {key}", lambda s, key=key: s.client.get_object(Bucket=bucket, Key=key)))
        add((f"head {key}", lambda s, key=key: s.client.head_object(Bucket=bucket, Key=key)))
        add((f"get plain/{i}",
             lambda s, i=i: s.client.get_object(Bucket=bucket, Key=f"plain/{i}")))
        for rng in ("bytes=0-0", "bytes=0-99", "bytes=-10", "bytes=10-", "bytes=5-2",
                    f"bytes={size}-", f"bytes={size + 10}-{size + 20}", "bytes=0-"
                    f"{size * 2}"):
            add((f"get {key} Range {rng}",
                 lambda s, key=key, rng=rng: s.client.get_object(Bucket=bucket, Key=key,
                                                                 Range=rng)))
        add((f"get {key} If-Match right",
             lambda s, key=key: s.client.get_object(
                 Bucket=bucket, Key=key, IfMatch=s.client.head_object(
                     Bucket=bucket, Key=key)["ETag"])))
        add((f"get {key} If-Match wrong",
             lambda s, key=key: s.client.get_object(Bucket=bucket, Key=key,
                                                    IfMatch='"0123456789abcdef"')))
        add((f"get {key} If-None-Match right",
             lambda s, key=key: s.client.get_object(
                 Bucket=bucket, Key=key, IfNoneMatch=s.client.head_object(
                     Bucket=bucket, Key=key)["ETag"])))
        add((f"get {key} If-None-Match wrong",
             lambda s, key=key: s.client.get_object(Bucket=bucket, Key=key,
                                                    IfNoneMatch='"0123456789abcdef"')))
        add((f"head {key} If-None-Match *",
             lambda s, key=key: s.client.head_object(Bucket=bucket, Key=key, IfNoneMatch="*")))
        add((f"get {key} If-Modified-Since 2099",
             lambda s, key=key: s.client.get_object(Bucket=bucket, Key=key,
                                                    IfModifiedSince="2099-01-01T00:00:00Z")))
        add((f"get {key} If-Modified-Since 2000",
             lambda s, key=key: s.client.get_object(Bucket=bucket, Key=key,
                                                    IfModifiedSince="2000-01-01T00:00:00Z")))
        add((f"get {key} If-Unmodified-Since 2000",
             lambda s, key=key: s.client.get_object(Bucket=bucket, Key=key,
                                                    IfUnmodifiedSince="2000-01-01T00:00:00Z")))
        add((f"copy {key} to copy/{i}",
             lambda s, key=key, i=i: s.client.copy_object(
                 Bucket=bucket, Key=f"copy/{i}", CopySource={"Bucket": bucket, "Key": key})))
        add((f"head copy/{i}",
             lambda s, i=i: s.client.head_object(Bucket=bucket, Key=f"copy/{i}")))
        add((f"copy {key} to copy2/{i} REPLACE",
             lambda s, key=key, i=i: s.client.copy_object(
                 Bucket=bucket, Key=f"copy2/{i}", CopySource={"Bucket": bucket, "Key": key},
                 MetadataDirective="REPLACE", ContentType="text/replaced",
                 Metadata={"shape": "round"})))
        add((f"head copy2/{i}",
             lambda s, i=i: s.client.head_object(Bucket=bucket, Key=f"copy2/{i}")))
    # Listings.
    for prefix, delimiter, max_keys in (("", "", 1000), ("obj/", "", 1000), ("", "/", 1000),
                                        ("obj/", "/", 2), ("", "", 3), ("nothing/", "", 10),
                                        ("c", "/", 1000), ("", "/", 1)):
        label = f"prefix={prefix!r} delimiter={delimiter!r} max-keys={max_keys}"
        add((f"list v2 {label}",
             lambda s, p=prefix, d=delimiter, m=max_keys: s.client.list_objects_v2(
                 Bucket=bucket, Prefix=p, Delimiter=d, MaxKeys=m)))
        add((f"list v1 {label}",
             lambda s, p=prefix, d=delimiter, m=max_keys: s.client.list_objects(
                 Bucket=bucket, Prefix=p, Delimiter=d, MaxKeys=m)))

    def continued(s):
        first = s.client.list_objects_v2(Bucket=bucket, MaxKeys=4)
        return s.client.list_objects_v2(Bucket=bucket, MaxKeys=4,
                                        ContinuationToken=first["NextContinuationToken"])
    add(("list v2 second page of 4", continued))
    add(("list v2 StartAfter obj/3",
         lambda s: s.client.list_objects_v2(Bucket=bucket, StartAfter="obj/3")))
    add(("list v1 Marker obj/3", lambda s: s.client.list_objects(Bucket=bucket, Marker="obj/3")))
    # Errors.
    add(("get missing key", lambda s: s.client.get_object(Bucket=bucket, Key="missing")))
    add(("head missing key", lambda s: s.client.head_object(Bucket=bucket, Key="missing")))
    add(("get in missing bucket",
         lambda s: s.client.get_object(Bucket="no-such-bucket-here", Key="x")))
    add(("list missing bucket", lambda s: s.client.list_objects_v2(Bucket="no-such-bucket-here")))
    add(("put with a wrong secret",
         lambda s: s.wrong.put_object(Bucket=bucket, Key="wrong", Body=b"x")))
    add(("get with a wrong secret", lambda s: s.wrong.get_object(Bucket=bucket, Key="obj/1")))
    add(("copy of a missing key", lambda s: s.client.copy_object(
        Bucket=bucket, Key="copy/missing", CopySource={"Bucket": bucket, "Key": "missing"})))
    add(("delete bucket not empty", lambda s: s.client.delete_bucket(Bucket=bucket)))
    # Multipart.
    part = data(PART_BYTES, "part")
    tail = data(1000, "tail")

    def create(name):
        def run(s):
            response = s.client.create_multipart_upload(Bucket=bucket, Key=name,
                                                        ContentType="application/x-parts",
                                                        Metadata={"parts": "yes"})
            s.state[name] = response["UploadId"]
            return response
        return run

    def upload(name, number, body):
        return lambda s: s.client.upload_part(Bucket=bucket, Key=name, PartNumber=number,
                                              UploadId=s.state[name], Body=body)

    def complete(name, parts):
        def run(s):
            listed = s.client.list_parts(Bucket=bucket, Key=name, UploadId=s.state[name])
            etags = {p["PartNumber"]: p["ETag"] for p in listed.get("Parts", [])}
            return s.client.complete_multipart_upload(
                Bucket=bucket, Key=name, UploadId=s.state[name],
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags.get(n, '"0"')}
                                           for n in parts]})
        return run

    add(("create upload mp/good", create("mp/good")))
    add(("upload part 1 (5 MiB)", upload("mp/good", 1, part)))
    add(("upload part 2 (1000 B)", upload("mp/good", 2, tail)))
    add(("list parts", lambda s: s.client.list_parts(Bucket=bucket, Key="mp/good",
                                                     UploadId=s.state["mp/good"])))
    add(("list uploads", lambda s: s.client.list_multipart_uploads(Bucket=bucket)))
    add(("complete mp/good", complete("mp/good", [1, 2])))
    add(("head mp/good", lambda s: s.client.head_object(Bucket=bucket, Key="mp/good")))
    add(("get mp/good", lambda s: s.client.get_object(Bucket=bucket, Key="mp/good")))
    add(("get mp/good part 2",
         lambda s: s.client.get_object(Bucket=bucket, Key="mp/good", PartNumber=2)))
    add(("get mp/good Range across parts",
         lambda s: s.client.get_object(Bucket=bucket, Key="mp/good",
                                       Range=f"bytes={PART_BYTES - 10}-{PART_BYTES + 9}")))
    add(("create upload mp/small", create("mp/small")))
    add(("upload small part 1 (1000 B)", upload("mp/small", 1, tail)))
    add(("upload small part 2 (1000 B)", upload("mp/small", 2, tail)))
    add(("complete with a small part (EntityTooSmall)", complete("mp/small", [1, 2])))
    add(("create upload mp/order", create("mp/order")))
    add(("upload order part 1 (5 MiB)", upload("mp/order", 1, part)))
    add(("upload order part 2 (5 MiB)", upload("mp/order", 2, part)))
    add(("complete with a missing part (InvalidPart)", complete("mp/order", [1, 3])))
    add(("complete parts out of order (InvalidPartOrder)", complete("mp/order", [2, 1])))
    add(("abort mp/order", lambda s: s.client.abort_multipart_upload(
        Bucket=bucket, Key="mp/order", UploadId=s.state["mp/order"])))
    add(("abort mp/small", lambda s: s.client.abort_multipart_upload(
        Bucket=bucket, Key="mp/small", UploadId=s.state["mp/small"])))
    add(("list parts of an aborted upload", lambda s: s.client.list_parts(
        Bucket=bucket, Key="mp/small", UploadId=s.state["mp/small"])))
    add(("abort an unknown upload", lambda s: s.client.abort_multipart_upload(
        Bucket=bucket, Key="mp/none", UploadId="2~nonexistent")))
    add(("list uploads after", lambda s: s.client.list_multipart_uploads(Bucket=bucket)))
    # Deletes.
    for i in range(len(sizes)):
        add((f"delete obj/{i}", lambda s, i=i: s.client.delete_object(Bucket=bucket,
                                                                      Key=f"obj/{i}")))
        add((f"get deleted obj/{i}", lambda s, i=i: s.client.get_object(Bucket=bucket,
                                                                        Key=f"obj/{i}")))
    add(("delete a missing key", lambda s: s.client.delete_object(Bucket=bucket, Key="missing")))
    add(("delete objects (with a missing one)", lambda s: s.client.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": f"plain/{i}"} for i in range(len(sizes))]
                               + [{"Key": "missing"}]})))
    add(("delete objects quiet", lambda s: s.client.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": f"copy/{i}"} for i in range(len(sizes))],
                               "Quiet": True})))
    return out


def empty_bucket(side, bucket):
    """Removes what the steps left, then the bucket (best effort)."""
    c = side.client
    try:
        for upload in c.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            c.abort_multipart_upload(Bucket=bucket, Key=upload["Key"],
                                     UploadId=upload["UploadId"])
        while True:
            listed = c.list_objects_v2(Bucket=bucket)
            keys = [{"Key": o["Key"]} for o in listed.get("Contents", [])]
            if not keys:
                break
            c.delete_objects(Bucket=bucket, Delete={"Objects": keys})
        c.delete_bucket(Bucket=bucket)
    except ClientError:
        pass


def compare(a, b, bucket):
    """Runs every step on both sides ((name, endpoint, (access, secret))
    each); returns (differences as text lines, requests per side)."""
    sides = [Side(name, endpoint, keys[0], keys[1]) for name, endpoint, keys in (a, b)]
    differences = []
    count = 0
    try:
        for label, step in steps(bucket):
            results = []
            for side in sides:
                try:
                    results.append(summary(step(side)))
                except ClientError as error:
                    results.append(error_summary(error))
                except Exception as error:  # a client-side failure is a result too
                    results.append({"client-error": f"{type(error).__name__}: {error}"[:200]})
            count += 1
            first, second = results
            for field in sorted(set(first) | set(second)):
                if first.get(field) != second.get(field):
                    differences.append(
                        f"{label}: {field}: {sides[0].name} {first.get(field, '(none)')!r}, "
                        f"{sides[1].name} {second.get(field, '(none)')!r}")
    finally:
        for side in sides:
            empty_bucket(side, bucket)
    return differences, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="NAME,ENDPOINT,ACCESS,SECRET")
    ap.add_argument("--b", required=True, help="NAME,ENDPOINT,ACCESS,SECRET")
    ap.add_argument("--bucket", required=True)
    args = ap.parse_args()
    sides = []
    for text in (args.a, args.b):
        parts = text.split(",")
        if len(parts) != 4:
            sys.exit(f"s3_behaviour: {text!r}: give NAME,ENDPOINT,ACCESS,SECRET")
        sides.append((parts[0], parts[1], (parts[2], parts[3])))
    differences, count = compare(sides[0], sides[1], args.bucket)
    print(f"{count} requests to each, {len(differences)} differences")
    for line in differences:
        print(f"- {line}")


if __name__ == "__main__":
    main()
