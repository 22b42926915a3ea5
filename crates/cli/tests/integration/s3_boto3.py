"""Every S3 operation the gateway supports, and its errors, through boto3.

Usage: s3_boto3.py ENDPOINT BUCKET ACCESS SECRET OTHER_BUCKET OTHER_ACCESS OTHER_SECRET
                   ADMIN_ACCESS ADMIN_SECRET

BUCKET is the tenant's bucket (not made yet); OTHER_BUCKET belongs to
another tenant, whose keys are OTHER_ACCESS and OTHER_SECRET; the ADMIN
keys are the admin tenant's ('*'), which may use both buckets. Run by
crates/cli/tests/integration/s3.rs against `strata store up`'s gateway.
Every check asserts content, codes or headers; the first failure raises
and exits non-zero with a traceback. At the end it prints
"boto3: N checks passed".
"""

import base64
import concurrent.futures
import datetime
import hashlib
import subprocess
import sys
import time

import boto3
import botocore
from botocore.config import Config
from botocore.exceptions import ClientError, ParamValidationError

ENDPOINT, BUCKET, ACCESS, SECRET, OTHER_BUCKET, OTHER_ACCESS, OTHER_SECRET = sys.argv[1:8]
ADMIN_ACCESS, ADMIN_SECRET = sys.argv[8:10]
CHECKS = 0


def client(access=ACCESS, secret=SECRET, **config):
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}, **config),
    )


def check(condition, what):
    global CHECKS
    if not condition:
        raise AssertionError(what)
    CHECKS += 1


def fails(code, call, *args, status=None, **kwargs):
    """Runs call(*args, **kwargs), which must fail with the S3 error code."""
    try:
        call(*args, **kwargs)
    except ClientError as e:
        got = e.response["Error"]["Code"]
        if call.__name__.startswith("head_"):
            code = str(status)  # a HEAD answer has no body to carry the code
        check(got == code, f"{call.__name__}: expected {code}, got {got}: {e}")
        if status is not None:
            real = e.response["ResponseMetadata"]["HTTPStatusCode"]
            check(real == status, f"{call.__name__}: expected HTTP {status}, got {real}")
        return e
    raise AssertionError(f"{call.__name__} should have failed with {code}")


s3 = client()

# Buckets: made, shown, made again, looked up.
fails("NoSuchBucket", s3.head_bucket, Bucket=BUCKET, status=404)
fails("NoSuchBucket", s3.list_objects_v2, Bucket=BUCKET)
fails("NoSuchBucket", s3.put_object, Bucket=BUCKET, Key="k", Body=b"x")
s3.create_bucket(Bucket=BUCKET)
s3.head_bucket(Bucket=BUCKET)
fails("BucketAlreadyOwnedByYou", s3.create_bucket, Bucket=BUCKET, status=409)
names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
check(names == [BUCKET], f"list_buckets: {names}")

# A bucket's storage class, chosen at CreateBucket with x-strata-storage-class
# (the store here has 3 storage nodes) and shown by HeadBucket; its objects
# and parts are kept in it (s3.rs checks them with `strata obj stat`).
CLASS_HEADER = "x-strata-storage-class"
admin = client(ADMIN_ACCESS, ADMIN_SECRET)


def with_class(value):
    """The admin's client, sending a class header with its CreateBucket."""
    def add(request, **_):
        request.headers[CLASS_HEADER] = value
    made = client(ADMIN_ACCESS, ADMIN_SECRET)
    made.meta.events.register("before-sign.s3.CreateBucket", add)
    return made


for bad, why in [("ec(4)", "not understood"), ("fast", "not understood"),
                 ("ec(1,1)", "out of bounds"), ("replicated(0)", "out of bounds"),
                 ("replicated(4)", "the cluster has 3"), ("ec(3,1)", "the cluster has 3")]:
    e = fails("InvalidArgument", with_class(bad).create_bucket, Bucket="classy", status=400)
    message = e.response["Error"]["Message"]
    check(why in message and CLASS_HEADER in message, f"class {bad}: {message}")
    fails("NoSuchBucket", admin.head_bucket, Bucket="classy", status=404)
with_class("ec(2,1)").create_bucket(Bucket="classy")
shown = admin.head_bucket(Bucket="classy")["ResponseMetadata"]["HTTPHeaders"]
check(shown.get(CLASS_HEADER) == "ec(2,1)", f"head_bucket shows the class: {shown}")
shown = s3.head_bucket(Bucket=BUCKET)["ResponseMetadata"]["HTTPHeaders"]
check(CLASS_HEADER not in shown, f"a bucket made without a class shows none: {shown}")
coded = bytes(range(256)) * 400
admin.put_object(Bucket="classy", Key="plain", Body=coded)
check(admin.get_object(Bucket="classy", Key="plain")["Body"].read() == coded, "an ec object")
coded_upload = admin.create_multipart_upload(Bucket="classy", Key="parted")["UploadId"]
coded_part = admin.upload_part(Bucket="classy", Key="parted", UploadId=coded_upload,
                               PartNumber=1, Body=coded)
admin.complete_multipart_upload(Bucket="classy", Key="parted", UploadId=coded_upload,
                                MultipartUpload={"Parts": [
                                    {"PartNumber": 1, "ETag": coded_part["ETag"]}]})
check(admin.get_object(Bucket="classy", Key="parted")["Body"].read() == coded, "ec parts")
admin.copy_object(Bucket="classy", Key="copied", CopySource={"Bucket": "classy", "Key": "plain"})
admin.create_bucket(Bucket="classless")
admin.put_object(Bucket="classless", Key="plain", Body=coded)

# Concurrent PutObjects of one key all succeed, as in S3 (the last one
# wins): the gateway posts again while the store holds the name for
# another. The key ends holding one body whole, with that body's ETag.
# Inline (small) bodies and streamed (1 MiB) ones take different paths.
for size in [100, 1 << 20]:
    bodies = [bytes([65 + i]) * (size + i) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        puts = list(pool.map(lambda b: s3.put_object(Bucket=BUCKET, Key="raced", Body=b), bodies))
    statuses = [put["ResponseMetadata"]["HTTPStatusCode"] for put in puts]
    check(statuses == [200] * len(bodies), f"concurrent puts of {size} bytes: {statuses}")
    for put, sent in zip(puts, bodies):
        check(put["ETag"] == f'"{hashlib.md5(sent).hexdigest()}"', "each put's own ETag")
    final = s3.get_object(Bucket=BUCKET, Key="raced")
    held = final["Body"].read()
    check(held in bodies, f"the key holds one body whole ({len(held)} bytes)")
    check(final["ETag"] == f'"{hashlib.md5(held).hexdigest()}"', "and that body's ETag")
s3.delete_object(Bucket=BUCKET, Key="raced")

# Put and Get: content, ETag (MD5), metadata and content type kept.
body = bytes(range(256)) * 64 + b"tail"
md5 = hashlib.md5(body).hexdigest()
put = s3.put_object(
    Bucket=BUCKET,
    Key="dir/data.bin",
    Body=body,
    ContentType="application/x-test",
    Metadata={"colour": "blue", "owner": "test suite"},
    ContentMD5=base64.b64encode(hashlib.md5(body).digest()).decode(),
)
check(put["ETag"] == f'"{md5}"', f"put ETag {put['ETag']} is not the MD5 {md5}")
got = s3.get_object(Bucket=BUCKET, Key="dir/data.bin")
check(got["Body"].read() == body, "get_object returned other bytes")
check(got["ETag"] == f'"{md5}"', "get_object ETag")
check(got["ContentType"] == "application/x-test", f"content type {got['ContentType']}")
check(got["Metadata"] == {"colour": "blue", "owner": "test suite"}, f"metadata {got['Metadata']}")
check(got["ContentLength"] == len(body), "content length")
head = s3.head_object(Bucket=BUCKET, Key="dir/data.bin")
check(head["ContentLength"] == len(body), "head content length")
check(head["Metadata"]["colour"] == "blue", "head metadata")
check(head["ETag"] == f'"{md5}"', "head ETag")
modified = head["LastModified"]
now = datetime.datetime.now(datetime.timezone.utc)
check(abs((now - modified).total_seconds()) < 120, f"LastModified {modified} is not now")

# An empty object, and an overwrite: the new body, type and metadata only.
s3.put_object(Bucket=BUCKET, Key="empty", Body=b"")
empty = s3.get_object(Bucket=BUCKET, Key="empty")
check(empty["Body"].read() == b"", "empty object")
# Put without a type: S3's default, as S3 and RGW answer.
check(empty["ContentType"] == "binary/octet-stream", f"default type {empty['ContentType']}")
check(s3.head_object(Bucket=BUCKET, Key="empty")["ContentType"] == "binary/octet-stream",
      "default type on Head")
# No byte of an empty object can be served: a suffix range is refused.
fails("InvalidRange", s3.get_object, Bucket=BUCKET, Key="empty", Range="bytes=-10", status=416)
s3.put_object(Bucket=BUCKET, Key="over", Body=b"first", Metadata={"v": "1"})
s3.put_object(Bucket=BUCKET, Key="over", Body=b"second version", Metadata={"v": "2"})
over = s3.get_object(Bucket=BUCKET, Key="over")
check(over["Body"].read() == b"second version", "overwrite kept the old body")
check(over["Metadata"] == {"v": "2"}, f"overwrite metadata {over['Metadata']}")
# An object put in one piece has one part.
one = s3.get_object(Bucket=BUCKET, Key="over", PartNumber=1)
check(one["Body"].read() == b"second version" and one["PartsCount"] == 1, f"part 1 {one}")
fails("InvalidPartNumber", s3.get_object, Bucket=BUCKET, Key="over", PartNumber=2, status=416)
fails("InvalidArgument", s3.get_object, Bucket=BUCKET, Key="over", PartNumber=10001, status=400)
listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="over")["Contents"]
check([o["Key"] for o in listed] == ["over"], f"an overwritten key is listed once: {listed}")
check(listed[0]["Size"] == len(b"second version"), "listed size of the new body")

# Content-MD5: a wrong one stores nothing; a malformed one is refused.
wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
fails("BadDigest", s3.put_object, Bucket=BUCKET, Key="bad-md5", Body=b"data", ContentMD5=wrong)
fails("InvalidDigest", s3.put_object, Bucket=BUCKET, Key="bad-md5", Body=b"data", ContentMD5="abc")
try:
    s3.head_object(Bucket=BUCKET, Key="bad-md5")
    raise AssertionError("a Put with a wrong Content-MD5 stored the object")
except ClientError as e:
    check(e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, "bad-md5 must not exist")

# Ranges.
part = s3.get_object(Bucket=BUCKET, Key="dir/data.bin", Range="bytes=10-19")
check(part["Body"].read() == body[10:20], "range 10-19")
check(part["ContentRange"] == f"bytes 10-19/{len(body)}", f"content range {part['ContentRange']}")
check(part["ResponseMetadata"]["HTTPStatusCode"] == 206, "a range answers 206")
suffix = s3.get_object(Bucket=BUCKET, Key="dir/data.bin", Range="bytes=-4")
check(suffix["Body"].read() == b"tail", "suffix range")
open_end = s3.get_object(Bucket=BUCKET, Key="dir/data.bin", Range=f"bytes={len(body) - 2}-")
check(open_end["Body"].read() == b"il", "open-ended range")
fails("InvalidRange", s3.get_object, Bucket=BUCKET, Key="dir/data.bin",
      Range=f"bytes={len(body)}-", status=416)

# Conditional Gets.
got = s3.get_object(Bucket=BUCKET, Key="dir/data.bin", IfMatch=md5)
check(got["Body"].read() == body, "If-Match with the ETag")
fails("PreconditionFailed", s3.get_object, Bucket=BUCKET, Key="dir/data.bin",
      IfMatch="0" * 32, status=412)
for kwargs in [{"IfNoneMatch": md5}, {"IfModifiedSince": now + datetime.timedelta(minutes=5)}]:
    try:
        s3.get_object(Bucket=BUCKET, Key="dir/data.bin", **kwargs)
        raise AssertionError(f"{kwargs} should answer 304")
    except ClientError as e:
        status = e.response["ResponseMetadata"]["HTTPStatusCode"]
        check(status == 304, f"{kwargs}: HTTP {status}")
since = s3.get_object(Bucket=BUCKET, Key="dir/data.bin",
                      IfModifiedSince=now - datetime.timedelta(hours=1))
check(since["Body"].read() == body, "If-Modified-Since an hour ago")
fails("NoSuchKey", s3.get_object, Bucket=BUCKET, Key="missing", status=404)

# Listings: V2 with prefix, delimiter, max-keys and continuation; V1 too.
keys = ["a/1", "a/2", "a/b/3", "b/4", "c"]
for key in keys:
    s3.put_object(Bucket=BUCKET, Key=key, Body=key.encode())
everything = sorted(keys + ["dir/data.bin", "empty", "over"])
listed = s3.list_objects_v2(Bucket=BUCKET)
# The prefix is echoed even when none was asked (empty), an empty
# delimiter not at all: as S3 and RGW answer.
check(listed.get("Prefix") == "", f"echoed prefix {listed.get('Prefix')!r}")
no_delimiter = s3.list_objects(Bucket=BUCKET, Delimiter="")
check("Delimiter" not in no_delimiter and no_delimiter.get("Prefix") == "",
      f"empty delimiter echoed: {no_delimiter.get('Delimiter')!r}")
check([o["Key"] for o in listed["Contents"]] == everything, f"list all: {listed['Contents']}")
check(listed["KeyCount"] == len(everything) and not listed["IsTruncated"], "key count")
entry = next(o for o in listed["Contents"] if o["Key"] == "dir/data.bin")
check(entry["ETag"] == f'"{md5}"' and entry["Size"] == len(body), f"listed entry {entry}")
rolled = s3.list_objects_v2(Bucket=BUCKET, Delimiter="/")
check([p["Prefix"] for p in rolled["CommonPrefixes"]] == ["a/", "b/", "dir/"], f"prefixes {rolled}")
check([o["Key"] for o in rolled["Contents"]] == ["c", "empty", "over"], "top-level keys")
under = s3.list_objects_v2(Bucket=BUCKET, Prefix="a/", Delimiter="/")
check([o["Key"] for o in under["Contents"]] == ["a/1", "a/2"], f"under a/: {under}")
check([p["Prefix"] for p in under["CommonPrefixes"]] == ["a/b/"], "a/b/ rolled up")
seen, token, pages = [], None, 0
while True:
    kwargs = {"ContinuationToken": token} if token else {}
    page = s3.list_objects_v2(Bucket=BUCKET, MaxKeys=3, **kwargs)
    pages += 1
    seen += [o["Key"] for o in page.get("Contents", [])]
    check(page["KeyCount"] <= 3, "max-keys honoured")
    if not page["IsTruncated"]:
        break
    token = page["NextContinuationToken"]
check(seen == everything and pages == 3, f"pages of 3: {seen} in {pages}")
pages_with_prefixes = s3.list_objects_v2(Bucket=BUCKET, Delimiter="/", MaxKeys=2)
check(pages_with_prefixes["IsTruncated"], "a page of 2 of 6 is truncated")
rest = s3.list_objects_v2(Bucket=BUCKET, Delimiter="/",
                          ContinuationToken=pages_with_prefixes["NextContinuationToken"])
both = [p["Prefix"] for p in pages_with_prefixes.get("CommonPrefixes", [])] + \
    [o["Key"] for o in pages_with_prefixes.get("Contents", [])]
both += [p["Prefix"] for p in rest.get("CommonPrefixes", [])] + \
    [o["Key"] for o in rest.get("Contents", [])]
check(sorted(both) == ["a/", "b/", "c", "dir/", "empty", "over"], f"delimited pages: {both}")
after = s3.list_objects_v2(Bucket=BUCKET, StartAfter="b/4")
check([o["Key"] for o in after["Contents"]] == ["c", "dir/data.bin", "empty", "over"], "start-after")
v1 = s3.list_objects(Bucket=BUCKET, Prefix="a/", MaxKeys=2)
check([o["Key"] for o in v1["Contents"]] == ["a/1", "a/2"] and v1["IsTruncated"], f"v1 page {v1}")
v1_rest = s3.list_objects(Bucket=BUCKET, Prefix="a/", Marker="a/2")
check([o["Key"] for o in v1_rest["Contents"]] == ["a/b/3"], "v1 marker")
v1_rolled = s3.list_objects(Bucket=BUCKET, Delimiter="/")
check([p["Prefix"] for p in v1_rolled["CommonPrefixes"]] == ["a/", "b/", "dir/"], "v1 delimiter")

# Presigned URLs, used with curl: GET and PUT work, an expired or altered
# one is refused, and one past S3's 7 days is refused as S3 refuses it.
def curl(url, *args):
    """curl's (HTTP status, body) for url."""
    done = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *args, url],
                          capture_output=True, check=True)
    body, _, status = done.stdout.rpartition(b"\n")
    return int(status), body


signer = client(signature_version="s3v4")
short = signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "over"},
                                      ExpiresIn=1)
short_made = time.monotonic()
url = signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "dir/data.bin"},
                                    ExpiresIn=60)
check("X-Amz-Signature=" in url and "X-Amz-Expires=60" in url, f"not a SigV4 URL: {url}")
status, got = curl(url)
check(status == 200 and got == body, f"presigned GET: HTTP {status}, {len(got)} bytes")
status, got = curl(url, "-r", "10-19")
check(status == 206 and got == body[10:20], f"presigned ranged GET: HTTP {status} {got!r}")
put_url = signer.generate_presigned_url("put_object",
                                        Params={"Bucket": BUCKET, "Key": "presigned.txt"},
                                        ExpiresIn=60)
status, got = curl(put_url, "-X", "PUT", "--data-binary", "sent by curl")
check(status == 200, f"presigned PUT: HTTP {status} {got!r}")
check(s3.get_object(Bucket=BUCKET, Key="presigned.txt")["Body"].read() == b"sent by curl",
      "the presigned PUT stored other bytes")
# The last hex digit of the signature changed: refused, nothing stored.
last = put_url.index("X-Amz-Signature=") + len("X-Amz-Signature=") + 63
altered = put_url[:last] + ("0" if put_url[last] != "0" else "1") + put_url[last + 1:]
status, got = curl(altered, "-X", "PUT", "--data-binary", "forged")
check(status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in got, f"altered: {status} {got!r}")
check(s3.get_object(Bucket=BUCKET, Key="presigned.txt")["Body"].read() == b"sent by curl",
      "an altered presigned PUT changed the object")
# Signed for another key: the signature covers the path.
status, got = curl(url.replace("dir/data.bin", "over", 1))
check(status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in got, f"other key: {status}")
week = signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "over"},
                                     ExpiresIn=7 * 24 * 3600 + 1)
status, got = curl(week)
check(status == 400 and b"<Code>AuthorizationQueryParametersError</Code>" in got,
      f"an expiry past 7 days: {status} {got!r}")
week = signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "over"},
                                     ExpiresIn=7 * 24 * 3600)
check(curl(week) == (200, b"second version"), "an expiry of exactly 7 days")
time.sleep(max(0.0, 2.1 - (time.monotonic() - short_made)))
status, got = curl(short)
check(status == 403 and b"<Code>AccessDenied</Code>" in got and b"expired" in got,
      f"an expired presigned URL: {status} {got!r}")
s3.delete_object(Bucket=BUCKET, Key="presigned.txt")

# Deletes: one, several (a missing key is no error, as in S3), then the bucket.
fails("BucketNotEmpty", s3.delete_bucket, Bucket=BUCKET, status=409)
s3.delete_object(Bucket=BUCKET, Key="c")
fails("NoSuchKey", s3.get_object, Bucket=BUCKET, Key="c")
s3.delete_object(Bucket=BUCKET, Key="never-there")
gone = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in
                                                            ["a/1", "a/2", "a/b/3", "nope"]]})
check(sorted(d["Key"] for d in gone["Deleted"]) == ["a/1", "a/2", "a/b/3", "nope"], f"{gone}")
left = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]]
check(left == ["b/4", "dir/data.bin", "empty", "over"], f"left after deletes: {left}")

# Bad input, each a clear S3 error.
fails("KeyTooLongError", s3.put_object, Bucket=BUCKET, Key="k" * 1025, Body=b"x", status=400)
check(not any(o["Key"].startswith("kkk") for o in
              s3.list_objects_v2(Bucket=BUCKET)["Contents"]), "nothing stored for a long key")
s3.put_object(Bucket=BUCKET, Key="k" * 1024, Body=b"longest")
check(s3.get_object(Bucket=BUCKET, Key="k" * 1024)["Body"].read() == b"longest", "1,024-byte key")
try:
    s3.put_object(Bucket=BUCKET, Key="", Body=b"x")
    raise AssertionError("an empty key was taken")
except ParamValidationError:
    CHECKS += 1  # boto3 refuses it before sending: the raw request is below
unvalidated = client(parameter_validation=False)
e = fails("InvalidArgument", unvalidated.put_object, Bucket=BUCKET, Key="a\x00b", Body=b"x")
check("NUL" in e.response["Error"]["Message"], "the refused byte is named")
# Control bytes other than NUL are ordinary key bytes (the store name is the key).
unvalidated.put_object(Bucket=BUCKET, Key="ctl\x01key", Body=b"control")
check(s3.get_object(Bucket=BUCKET, Key="ctl\x01key")["Body"].read() == b"control", "key 0x01")
# Listings are percent-encoded when asked (boto3 asks for encoding-type=url
# and decodes), so keys with control bytes, '%', '+' and spaces list as
# they are, in v1 and v2, as keys and as common prefixes.
odd = ["ctl\x01key", "100% sure", "a+b c", "dir\x02/inner"]
for key in odd[1:]:
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"odd")
keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
check(set(odd) <= keys, f"odd keys listed as they are (v2): {sorted(keys & set(odd))}")
keys = {o["Key"] for o in s3.list_objects(Bucket=BUCKET)["Contents"]}
check(set(odd) <= keys, "odd keys listed as they are (v1)")
rolled = s3.list_objects_v2(Bucket=BUCKET, Prefix="dir\x02", Delimiter="/")
check([p["Prefix"] for p in rolled.get("CommonPrefixes", [])] == ["dir\x02/"], "an odd prefix")
for key in odd:
    s3.delete_object(Bucket=BUCKET, Key=key)
# x-amz-checksum-* headers are checked against the body and echoed; a
# wrong one is BadDigest, and nothing is stored.
import base64, hashlib
summed = b"checked bytes" * 1000
sha256 = base64.b64encode(hashlib.sha256(summed).digest()).decode()
put = s3.put_object(Bucket=BUCKET, Key="summed", Body=summed, ChecksumSHA256=sha256)
check(put.get("ChecksumSHA256") == sha256, "the SHA-256 checksum echoed")
put = s3.put_object(Bucket=BUCKET, Key="summed2", Body=summed, ChecksumAlgorithm="SHA1")
sha1 = base64.b64encode(hashlib.sha1(summed).digest()).decode()
check(put.get("ChecksumSHA1") == sha1, "a SHA-1 checksum boto3 computed is taken")
wrong_sha256 = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
e = fails("BadDigest", s3.put_object, Bucket=BUCKET, Key="badsum", Body=summed,
          ChecksumSHA256=wrong_sha256, status=400)
check("SHA256" in e.response["Error"]["Message"], "the refused checksum is named")
fails("NoSuchKey", s3.get_object, Bucket=BUCKET, Key="badsum", status=404)
# The checksum is kept with the object: HeadObject and GetObject answer
# it with ChecksumMode=ENABLED, and only then (and not for a range);
# botocore checks the body it gets against it.
import zlib


def b64(digest):
    return base64.b64encode(digest).decode()


for key, field, value in [("summed", "ChecksumSHA256", sha256),
                          ("summed2", "ChecksumSHA1", sha1)]:
    head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    check(head.get(field) == value and head.get("ChecksumType") == "FULL_OBJECT",
          f"head_object answers the {field} kept: {head}")
crc32 = b64(zlib.crc32(summed).to_bytes(4, "big"))
s3.put_object(Bucket=BUCKET, Key="crc", Body=summed, ChecksumCRC32=crc32)
got = s3.get_object(Bucket=BUCKET, Key="crc", ChecksumMode="ENABLED")
check(got.get("ChecksumCRC32") == crc32 and got["Body"].read() == summed,
      f"get_object answers the CRC32 kept: {got.get('ChecksumCRC32')} != {crc32}")
plain = s3.head_object(Bucket=BUCKET, Key="crc")
check("ChecksumCRC32" not in plain, f"no checksum without ChecksumMode: {plain}")
ranged = s3.get_object(Bucket=BUCKET, Key="crc", ChecksumMode="ENABLED", Range="bytes=0-9")
check("ChecksumCRC32" not in ranged and ranged["Body"].read() == summed[:10],
      "a range answers no whole-object checksum")
fails("BadDigest", s3.put_object, Bucket=BUCKET, Key="crc", Body=b"other", ChecksumCRC32=crc32,
      status=400)
head = s3.head_object(Bucket=BUCKET, Key="crc", ChecksumMode="ENABLED")
check(head["ContentLength"] == len(summed) and head.get("ChecksumCRC32") == crc32,
      "a refused Put keeps the key's body and checksum")
attrs = s3.get_object_attributes(Bucket=BUCKET, Key="crc", ObjectAttributes=["Checksum"])
check(attrs["Checksum"].get("ChecksumCRC32") == crc32 and
      attrs["Checksum"].get("ChecksumType") == "FULL_OBJECT", f"object attributes {attrs}")
fails("NoSuchKey", s3.get_object_attributes, Bucket=BUCKET, Key="nothing-here",
      ObjectAttributes=["ETag"], status=404)
# A checksum sent as a trailer of an aws-chunked body, as botocore does
# over HTTPS (made to here by telling it the endpoint is HTTPS).
import botocore.httpchecksum as httpchecksum
real_urlparse = httpchecksum.urlparse
httpchecksum.urlparse = lambda url: real_urlparse(url)._replace(scheme="https")
try:
    trailed = client()
    trailed.put_object(Bucket=BUCKET, Key="trailed", Body=summed, ChecksumAlgorithm="SHA256")
    head = s3.head_object(Bucket=BUCKET, Key="trailed", ChecksumMode="ENABLED")
    check(head.get("ChecksumSHA256") == sha256, f"a trailing SHA256 is kept: {head}")
    real_b64digest = httpchecksum.Sha256Checksum.b64digest
    httpchecksum.Sha256Checksum.b64digest = lambda self: wrong_sha256
    try:
        fails("BadDigest", trailed.put_object, Bucket=BUCKET, Key="trailed2", Body=summed,
              ChecksumAlgorithm="SHA256", status=400)
    finally:
        httpchecksum.Sha256Checksum.b64digest = real_b64digest
finally:
    httpchecksum.urlparse = real_urlparse
fails("NoSuchKey", s3.head_object, Bucket=BUCKET, Key="trailed2", status=404)
for key in ("summed", "summed2", "crc", "trailed"):
    s3.delete_object(Bucket=BUCKET, Key=key)
fails("MetadataTooLarge", s3.put_object, Bucket=BUCKET, Key="m", Body=b"x",
      Metadata={"big": "v" * 4000})
fails("SignatureDoesNotMatch", client(secret="0" * 40).list_objects_v2, Bucket=BUCKET, status=403)
fails("InvalidAccessKeyId", client(access="nobody", secret="0" * 40).list_buckets, status=403)
fails("AccessDenied", client(signature_version=botocore.UNSIGNED).list_objects_v2,
      Bucket=BUCKET, status=403)
other = client(OTHER_ACCESS, OTHER_SECRET)
other.create_bucket(Bucket=OTHER_BUCKET)
other.put_object(Bucket=OTHER_BUCKET, Key="secret", Body=b"theirs")
for call, kwargs in [
    (s3.get_object, {"Key": "secret"}),
    (s3.put_object, {"Key": "mine", "Body": b"x"}),
    (s3.list_objects_v2, {}),
    (s3.delete_object, {"Key": "secret"}),
    (s3.create_bucket, {}),
]:
    fails("AccessDenied", call, Bucket=OTHER_BUCKET, status=403, **kwargs)
fails("AccessDenied", other.get_object, Bucket=BUCKET, Key="over", status=403)
check(other.get_object(Bucket=OTHER_BUCKET, Key="secret")["Body"].read() == b"theirs",
      "the other tenant's object is untouched")

# CopyObject: content, ETag and metadata kept (or replaced); the copy
# conditions; a missing source; across tenants only for the admin.
source = {"Bucket": BUCKET, "Key": "dir/data.bin"}
copied = s3.copy_object(Bucket=BUCKET, Key="copy/data.bin", CopySource=source)
check(copied["CopyObjectResult"]["ETag"] == f'"{md5}"', f"copy ETag {copied}")
got = s3.get_object(Bucket=BUCKET, Key="copy/data.bin")
check(got["Body"].read() == body and got["ETag"] == f'"{md5}"', "the copy holds other bytes")
check(got["ContentType"] == "application/x-test", f"copied content type {got['ContentType']}")
check(got["Metadata"] == {"colour": "blue", "owner": "test suite"}, f"copied {got['Metadata']}")
s3.copy_object(Bucket=BUCKET, Key="copy/data.bin", CopySource=source, MetadataDirective="REPLACE",
               Metadata={"colour": "green"}, ContentType="text/plain")
head = s3.head_object(Bucket=BUCKET, Key="copy/data.bin")
check(head["Metadata"] == {"colour": "green"}, f"replaced metadata {head['Metadata']}")
check(head["ContentType"] == "text/plain" and head["ETag"] == f'"{md5}"', f"replaced {head}")
check(s3.head_object(Bucket=BUCKET, Key="dir/data.bin")["Metadata"]["colour"] == "blue",
      "the source's metadata changed")
fails("InvalidRequest", s3.copy_object, Bucket=BUCKET, Key="dir/data.bin", CopySource=source,
      status=400)
s3.copy_object(Bucket=BUCKET, Key="over", CopySource={"Bucket": BUCKET, "Key": "over"},
               MetadataDirective="REPLACE", Metadata={"v": "3"})
over = s3.get_object(Bucket=BUCKET, Key="over")
check(over["Body"].read() == b"second version" and over["Metadata"] == {"v": "3"},
      "a copy onto itself with new metadata")
s3.copy_object(Bucket=BUCKET, Key="copy/empty", CopySource={"Bucket": BUCKET, "Key": "empty"})
check(s3.get_object(Bucket=BUCKET, Key="copy/empty")["Body"].read() == b"", "an empty copy")
s3.copy_object(Bucket=BUCKET, Key="copy/data.bin", CopySource=source, CopySourceIfMatch=md5)
fails("PreconditionFailed", s3.copy_object, Bucket=BUCKET, Key="copy/x", CopySource=source,
      CopySourceIfMatch="0" * 32, status=412)
fails("PreconditionFailed", s3.copy_object, Bucket=BUCKET, Key="copy/x", CopySource=source,
      CopySourceIfNoneMatch=md5, status=412)
fails("PreconditionFailed", s3.copy_object, Bucket=BUCKET, Key="copy/x", CopySource=source,
      CopySourceIfModifiedSince=now + datetime.timedelta(minutes=5), status=412)
fails("NoSuchKey", s3.copy_object, Bucket=BUCKET, Key="copy/x",
      CopySource={"Bucket": BUCKET, "Key": "missing"}, status=404)
fails("NoSuchKey", s3.head_object, Bucket=BUCKET, Key="copy/x", status=404)
fails("AccessDenied", s3.copy_object, Bucket=BUCKET, Key="stolen",
      CopySource={"Bucket": OTHER_BUCKET, "Key": "secret"}, status=403)
fails("AccessDenied", s3.copy_object, Bucket=OTHER_BUCKET, Key="pushed", CopySource=source,
      status=403)
admin = client(ADMIN_ACCESS, ADMIN_SECRET)
admin.copy_object(Bucket=OTHER_BUCKET, Key="from-acme", CopySource=source)
got = other.get_object(Bucket=OTHER_BUCKET, Key="from-acme")
check(got["Body"].read() == body and got["ETag"] == f'"{md5}"', "the admin's cross-bucket copy")
check(got["Metadata"] == {"colour": "blue", "owner": "test suite"}, "cross-bucket metadata")
gone = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "copy/data.bin"},
                                                            {"Key": "copy/empty"}]})
check(len(gone["Deleted"]) == 2, f"{gone}")

# Multipart uploads: every operation, S3's ETag, ranges across parts,
# and each refusal.
MIB = 1 << 20
first = bytes(range(251)) * (5 * MIB // 251 + 1)
first = first[:5 * MIB]
second = b"the second and last part"
made = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/object", ContentType="video/x-test",
                                  Metadata={"parts": "two"})
upload = made["UploadId"]
check(made["Key"] == "mp/object" and len(upload) == 32, f"create: {made}")
p1 = s3.upload_part(Bucket=BUCKET, Key="mp/object", UploadId=upload, PartNumber=1, Body=first)
check(p1["ETag"] == f'"{hashlib.md5(first).hexdigest()}"', f"part 1 ETag {p1['ETag']}")
p2 = s3.upload_part(Bucket=BUCKET, Key="mp/object", UploadId=upload, PartNumber=2, Body=second,
                    ContentMD5=base64.b64encode(hashlib.md5(second).digest()).decode())
fails("BadDigest", s3.upload_part, Bucket=BUCKET, Key="mp/object", UploadId=upload, PartNumber=3,
      Body=b"x", ContentMD5=wrong)
for number in [0, 10001]:
    fails("InvalidArgument", s3.upload_part, Bucket=BUCKET, Key="mp/object", UploadId=upload,
          PartNumber=number, Body=b"x", status=400)
for call, kwargs in [(s3.upload_part, {"PartNumber": 1, "Body": b"x"}), (s3.list_parts, {}),
                     (s3.abort_multipart_upload, {}),
                     (s3.complete_multipart_upload,
                      {"MultipartUpload": {"Parts": [{"PartNumber": 1, "ETag": p1["ETag"]}]}})]:
    fails("NoSuchUpload", call, Bucket=BUCKET, Key="mp/object", UploadId="f" * 32, status=404,
          **kwargs)
fails("NoSuchUpload", s3.list_parts, Bucket=BUCKET, Key="mp/other-key", UploadId=upload)
parts = s3.list_parts(Bucket=BUCKET, Key="mp/object", UploadId=upload)
check([(q["PartNumber"], q["Size"], q["ETag"]) for q in parts["Parts"]] ==
      [(1, len(first), p1["ETag"]), (2, len(second), p2["ETag"])], f"list_parts {parts}")
page = s3.list_parts(Bucket=BUCKET, Key="mp/object", UploadId=upload, MaxParts=1)
check(page["IsTruncated"] and page["NextPartNumberMarker"] == 1 and len(page["Parts"]) == 1,
      f"list_parts page {page}")
rest = s3.list_parts(Bucket=BUCKET, Key="mp/object", UploadId=upload, PartNumberMarker=1)
check([q["PartNumber"] for q in rest["Parts"]] == [2] and not rest["IsTruncated"], f"{rest}")
# A second upload: one small part and one more, to be refused then left pending.
other = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/small")["UploadId"]
small1 = s3.upload_part(Bucket=BUCKET, Key="mp/small", UploadId=other, PartNumber=1, Body=b"tiny")
small2 = s3.upload_part(Bucket=BUCKET, Key="mp/small", UploadId=other, PartNumber=2, Body=b"end")
uploads = s3.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
check([(u["Key"], u["UploadId"]) for u in uploads] == [("mp/object", upload), ("mp/small", other)],
      f"list_multipart_uploads {uploads}")
check(abs((now - uploads[0]["Initiated"]).total_seconds()) < 120, f"initiated {uploads[0]}")
page = s3.list_multipart_uploads(Bucket=BUCKET, MaxUploads=1)
check(page["IsTruncated"] and page["NextKeyMarker"] == "mp/object", f"uploads page {page}")
rest = s3.list_multipart_uploads(Bucket=BUCKET, KeyMarker=page["NextKeyMarker"],
                                 UploadIdMarker=page["NextUploadIdMarker"])
check([u["Key"] for u in rest["Uploads"]] == ["mp/small"], f"uploads after the marker {rest}")
only = s3.list_multipart_uploads(Bucket=BUCKET, Prefix="mp/s")["Uploads"]
check([u["UploadId"] for u in only] == [other], f"uploads by prefix {only}")
# With a delimiter, keys holding it after the prefix roll up into common
# prefixes, counted with the uploads; a common prefix as key-marker
# resumes past every key under it (S3's behaviour).
nested = [s3.create_multipart_upload(Bucket=BUCKET, Key=k)["UploadId"]
          for k in ["mp/dir/a", "mp/dir/b", "mp/eir/c/d", "top"]]
rolled = s3.list_multipart_uploads(Bucket=BUCKET, Delimiter="/")
check([p["Prefix"] for p in rolled["CommonPrefixes"]] == ["mp/"] and
      [u["Key"] for u in rolled["Uploads"]] == ["top"] and rolled["Delimiter"] == "/",
      f"uploads by delimiter {rolled}")
rolled = s3.list_multipart_uploads(Bucket=BUCKET, Delimiter="/", Prefix="mp/")
check([p["Prefix"] for p in rolled["CommonPrefixes"]] == ["mp/dir/", "mp/eir/"] and
      [u["Key"] for u in rolled["Uploads"]] == ["mp/object", "mp/small"],
      f"uploads by prefix and delimiter {rolled}")
seen, markers, pages = [], {}, 0
while True:
    page = s3.list_multipart_uploads(Bucket=BUCKET, Delimiter="/", Prefix="mp/", MaxUploads=1,
                                     **markers)
    pages += 1
    items = ([p["Prefix"] for p in page.get("CommonPrefixes", [])] +
             [u["Key"] for u in page.get("Uploads", [])])
    check(len(items) == 1, f"one entry a page {page}")
    seen += items
    if not page["IsTruncated"]:
        break
    markers = {"KeyMarker": page["NextKeyMarker"]}
    if page.get("NextUploadIdMarker"):
        markers["UploadIdMarker"] = page["NextUploadIdMarker"]
check(seen == ["mp/dir/", "mp/eir/", "mp/object", "mp/small"] and pages == 4,
      f"pages by delimiter {seen}")
for k, u in zip(["mp/dir/a", "mp/dir/b", "mp/eir/c/d", "top"], nested):
    s3.abort_multipart_upload(Bucket=BUCKET, Key=k, UploadId=u)
check(not any("strata-multipart" in o["Key"] for o in
              s3.list_objects_v2(Bucket=BUCKET)["Contents"]), "listings hide the parts")
fails("NoSuchKey", s3.head_object, Bucket=BUCKET, Key="mp/object", status=404)
fails("EntityTooSmall", s3.complete_multipart_upload, Bucket=BUCKET, Key="mp/small",
      UploadId=other, status=400, MultipartUpload={"Parts": [
          {"PartNumber": 1, "ETag": small1["ETag"]}, {"PartNumber": 2, "ETag": small2["ETag"]}]})
both = [{"PartNumber": 1, "ETag": p1["ETag"]}, {"PartNumber": 2, "ETag": p2["ETag"]}]
fails("InvalidPartOrder", s3.complete_multipart_upload, Bucket=BUCKET, Key="mp/object",
      UploadId=upload, status=400, MultipartUpload={"Parts": both[::-1]})
fails("InvalidPart", s3.complete_multipart_upload, Bucket=BUCKET, Key="mp/object",
      UploadId=upload, status=400,
      MultipartUpload={"Parts": both + [{"PartNumber": 3, "ETag": p2["ETag"]}]})
fails("InvalidPart", s3.complete_multipart_upload, Bucket=BUCKET, Key="mp/object",
      UploadId=upload, status=400, MultipartUpload={"Parts": [
          {"PartNumber": 1, "ETag": p2["ETag"]}, {"PartNumber": 2, "ETag": p2["ETag"]}]})
fails("MalformedXML", s3.complete_multipart_upload, Bucket=BUCKET, Key="mp/object",
      UploadId=upload, status=400, MultipartUpload={"Parts": []})
done = s3.complete_multipart_upload(Bucket=BUCKET, Key="mp/object", UploadId=upload,
                                    MultipartUpload={"Parts": both})
digests = hashlib.md5(first).digest() + hashlib.md5(second).digest()
mp_etag = f'"{hashlib.md5(digests).hexdigest()}-2"'
check(done["ETag"] == mp_etag, f"complete ETag {done['ETag']}, S3's is {mp_etag}")
fails("NoSuchUpload", s3.upload_part, Bucket=BUCKET, Key="mp/object", UploadId=upload,
      PartNumber=3, Body=b"late")
# UploadParts racing a CompleteMultipartUpload: the object is exactly the
# parts listed; each racing part is taken (200, before the Complete forgot
# the upload: left out of the object, its name deleted with it) or refused
# (NoSuchUpload: the upload was gone when it was stored), never added.
raced = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/raced")["UploadId"]
listed = [s3.upload_part(Bucket=BUCKET, Key="mp/raced", UploadId=raced, PartNumber=n,
                         Body=b)["ETag"] for n, b in [(1, first), (2, second)]]


def late_part(number):
    try:
        s3.upload_part(Bucket=BUCKET, Key="mp/raced", UploadId=raced, PartNumber=number,
                       Body=b"late" * 2000)
        return "200"
    except ClientError as e:
        return e.response["Error"]["Code"]


with concurrent.futures.ThreadPoolExecutor(4) as pool:
    racing = [pool.submit(late_part, number) for number in range(3, 7)]
    s3.complete_multipart_upload(Bucket=BUCKET, Key="mp/raced", UploadId=raced,
                                 MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                                            for n, e in enumerate(listed, 1)]})
    answers = [future.result() for future in racing]
check(set(answers) <= {"200", "NoSuchUpload"}, f"parts racing the Complete: {answers}")
got = s3.get_object(Bucket=BUCKET, Key="mp/raced")
check(got["Body"].read() == first + second and got["ETag"] == mp_etag,
      f"the raced object is its listed parts ({answers})")
fails("NoSuchUpload", s3.upload_part, Bucket=BUCKET, Key="mp/raced", UploadId=raced,
      PartNumber=7, Body=b"after", status=404)
s3.delete_object(Bucket=BUCKET, Key="mp/raced")
whole = first + second
got = s3.get_object(Bucket=BUCKET, Key="mp/object")
check(got["Body"].read() == whole and got["ETag"] == mp_etag, "the multipart object's bytes")
check(got["ContentType"] == "video/x-test" and got["Metadata"] == {"parts": "two"},
      f"multipart metadata {got['ContentType']} {got['Metadata']}")
check(got["ContentLength"] == len(whole), "multipart length")
across = s3.get_object(Bucket=BUCKET, Key="mp/object", Range=f"bytes={5 * MIB - 3}-{5 * MIB + 2}")
check(across["Body"].read() == whole[5 * MIB - 3:5 * MIB + 3], "a range across the parts")
check(across["ContentRange"] == f"bytes {5 * MIB - 3}-{5 * MIB + 2}/{len(whole)}", "its range")
# partNumber: one part's bytes, its Content-Range, and the part count.
part2 = s3.get_object(Bucket=BUCKET, Key="mp/object", PartNumber=2)
check(part2["Body"].read() == second and part2["PartsCount"] == 2, f"part 2 {part2}")
check(part2["ResponseMetadata"]["HTTPStatusCode"] == 206, "a part is partial content")
check(part2["ContentRange"] == f"bytes {len(first)}-{len(whole) - 1}/{len(whole)}",
      f"part 2's range {part2['ContentRange']}")
check(part2["ETag"] == mp_etag, "a part answers the object's ETag")
head1 = s3.head_object(Bucket=BUCKET, Key="mp/object", PartNumber=1)
check(head1["ContentLength"] == len(first) and head1["PartsCount"] == 2, f"head part 1 {head1}")
fails("InvalidPartNumber", s3.get_object, Bucket=BUCKET, Key="mp/object", PartNumber=3,
      status=416)
fails("416", s3.head_object, Bucket=BUCKET, Key="mp/object", PartNumber=3, status=416)
fails("InvalidRequest", s3.get_object, Bucket=BUCKET, Key="mp/object", PartNumber=1,
      Range="bytes=0-1", status=400)
tail = s3.get_object(Bucket=BUCKET, Key="mp/object", Range="bytes=-5")
check(tail["Body"].read() == second[-5:], "a suffix range in the last part")
check(s3.get_object(Bucket=BUCKET, Key="mp/object", IfMatch=mp_etag)["Body"].read() == whole,
      "If-Match with the multipart ETag")
entry = s3.list_objects_v2(Bucket=BUCKET, Prefix="mp/")["Contents"][0]
check(entry["Key"] == "mp/object" and entry["Size"] == len(whole) and entry["ETag"] == mp_etag,
      f"the multipart object listed {entry}")
check([u["Key"] for u in s3.list_multipart_uploads(Bucket=BUCKET)["Uploads"]] == ["mp/small"],
      "a completed upload is no longer listed")
# UploadPartCopy: parts copied from a multipart object, one by range.
third = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/copied")["UploadId"]
source = {"Bucket": BUCKET, "Key": "mp/object"}
c1 = s3.upload_part_copy(Bucket=BUCKET, Key="mp/copied", UploadId=third, PartNumber=1,
                         CopySource=source)
c2 = s3.upload_part_copy(Bucket=BUCKET, Key="mp/copied", UploadId=third, PartNumber=2,
                         CopySource=source, CopySourceRange="bytes=10-19")
check(c1["CopyPartResult"]["ETag"] == f'"{hashlib.md5(whole).hexdigest()}"', f"part copy {c1}")
fails("InvalidRange", s3.upload_part_copy, Bucket=BUCKET, Key="mp/copied", UploadId=third,
      PartNumber=3, CopySource=source, CopySourceRange=f"bytes=0-{len(whole)}", status=416)
s3.complete_multipart_upload(Bucket=BUCKET, Key="mp/copied", UploadId=third, MultipartUpload={
    "Parts": [{"PartNumber": 1, "ETag": c1["CopyPartResult"]["ETag"]},
              {"PartNumber": 2, "ETag": c2["CopyPartResult"]["ETag"]}]})
check(s3.get_object(Bucket=BUCKET, Key="mp/copied")["Body"].read() == whole + whole[10:20],
      "an object of copied parts")
# CopyObject of a multipart object: one plain object, the same bytes and ETag.
s3.copy_object(Bucket=BUCKET, Key="mp/plain-copy", CopySource=source)
got = s3.get_object(Bucket=BUCKET, Key="mp/plain-copy")
check(got["Body"].read() == whole and got["ETag"] == mp_etag, "a copy of a multipart object")
# Abort: the upload goes; overwrite and delete: the object's parts go.
s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/small", UploadId=other)
fails("NoSuchUpload", s3.list_parts, Bucket=BUCKET, Key="mp/small", UploadId=other, status=404)
check(s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == [], "aborted: none pending")
s3.put_object(Bucket=BUCKET, Key="mp/copied", Body=b"overwritten")
check(s3.get_object(Bucket=BUCKET, Key="mp/copied")["Body"].read() == b"overwritten", "overwrite")
fails("InvalidArgument", s3.put_object, Bucket=BUCKET, Key=".strata-multipart/u/x", Body=b"x",
      status=400)
fails("InvalidArgument", s3.create_multipart_upload, Bucket=BUCKET, Key=".strata-multipart/p",
      status=400)
fails("AccessDenied", s3.create_multipart_upload, Bucket=OTHER_BUCKET,
      Key="k", status=403)
gone = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in
                                                            ["mp/object", "mp/copied",
                                                             "mp/plain-copy"]]})
check(len(gone["Deleted"]) == 3, f"{gone}")
# A multipart upload started with a checksum algorithm: every part is
# kept with it (computed by the gateway when the client sends another),
# ListParts shows them, a Complete listing another value is InvalidPart,
# and the object's checksum is S3's composite: the SHA-256 of the parts'
# SHA-256 digests, then "-2".
created = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/summed", ChecksumAlgorithm="SHA256")
check(created.get("ChecksumAlgorithm") == "SHA256", f"the upload's algorithm {created}")
summed_upload = created["UploadId"]
part_a, part_b = b"a" * (5 * MIB), b"the summed tail"
r1 = s3.upload_part(Bucket=BUCKET, Key="mp/summed", UploadId=summed_upload, PartNumber=1,
                    Body=part_a, ChecksumAlgorithm="SHA256")
check(r1.get("ChecksumSHA256") == b64(hashlib.sha256(part_a).digest()), f"part 1 {r1}")
fails("BadDigest", s3.upload_part, Bucket=BUCKET, Key="mp/summed", UploadId=summed_upload,
      PartNumber=2, Body=part_b, ChecksumSHA256=wrong_sha256, status=400)
r2 = s3.upload_part(Bucket=BUCKET, Key="mp/summed", UploadId=summed_upload, PartNumber=2,
                    Body=part_b, ChecksumAlgorithm="CRC32")
part_b_sha = b64(hashlib.sha256(part_b).digest())
check(r2.get("ChecksumSHA256") == part_b_sha, f"the upload's algorithm is kept: {r2}")
listed_parts = s3.list_parts(Bucket=BUCKET, Key="mp/summed", UploadId=summed_upload)["Parts"]
check([q.get("ChecksumSHA256") for q in listed_parts] == [r1["ChecksumSHA256"], part_b_sha],
      f"list_parts shows the checksums {listed_parts}")
summed_parts = [{"PartNumber": 1, "ETag": r1["ETag"], "ChecksumSHA256": r1["ChecksumSHA256"]},
                {"PartNumber": 2, "ETag": r2["ETag"], "ChecksumSHA256": part_b_sha}]
fails("InvalidPart", s3.complete_multipart_upload, Bucket=BUCKET, Key="mp/summed",
      UploadId=summed_upload, status=400, MultipartUpload={"Parts": [
          summed_parts[0], dict(summed_parts[1], ChecksumSHA256=wrong_sha256)]})
done = s3.complete_multipart_upload(Bucket=BUCKET, Key="mp/summed", UploadId=summed_upload,
                                    MultipartUpload={"Parts": summed_parts})
digests = hashlib.sha256(part_a).digest() + hashlib.sha256(part_b).digest()
composite = f"{b64(hashlib.sha256(digests).digest())}-2"
check(done.get("ChecksumSHA256") == composite, f"complete answers the composite {done}")
head = s3.head_object(Bucket=BUCKET, Key="mp/summed", ChecksumMode="ENABLED")
check(head.get("ChecksumSHA256") == composite and head.get("ChecksumType") == "COMPOSITE",
      f"head_object answers the composite {head}")
got = s3.get_object(Bucket=BUCKET, Key="mp/summed", ChecksumMode="ENABLED")
check(got["Body"].read() == part_a + part_b and got.get("ChecksumSHA256") == composite,
      "the composite object reads back")
# A partNumber read answers the part's own checksum (botocore checks the
# bytes against it); a Range answers none.
part_got = s3.get_object(Bucket=BUCKET, Key="mp/summed", PartNumber=2, ChecksumMode="ENABLED")
check(part_got["Body"].read() == part_b and part_got.get("ChecksumSHA256") == part_b_sha,
      f"a part read answers its part's checksum {part_got.get('ChecksumSHA256')}")
part_head = s3.head_object(Bucket=BUCKET, Key="mp/summed", PartNumber=1, ChecksumMode="ENABLED")
check(part_head.get("ChecksumSHA256") == r1["ChecksumSHA256"] and
      part_head["ContentLength"] == len(part_a), f"a part head answers its checksum {part_head}")
ranged = s3.get_object(Bucket=BUCKET, Key="mp/summed", Range="bytes=0-9", ChecksumMode="ENABLED")
check(ranged["Body"].read() == part_a[:10] and "ChecksumSHA256" not in ranged,
      f"a range answers no checksum {ranged}")
# GetObjectAttributes: the composite, the size and the parts with their
# checksums, a page at a time.
attrs = s3.get_object_attributes(Bucket=BUCKET, Key="mp/summed",
                                 ObjectAttributes=["ETag", "Checksum", "ObjectParts",
                                                   "ObjectSize"])
check(attrs["Checksum"].get("ChecksumSHA256") == composite and
      attrs["Checksum"].get("ChecksumType") == "COMPOSITE" and
      attrs["ObjectSize"] == len(part_a + part_b), f"object attributes {attrs}")
check(attrs["ETag"].strip('"') == done["ETag"].strip('"'), f"attributes' ETag {attrs}")
listed_attrs = attrs["ObjectParts"]
check(listed_attrs["TotalPartsCount"] == 2 and
      [(q["PartNumber"], q["Size"], q.get("ChecksumSHA256")) for q in listed_attrs["Parts"]] ==
      [(1, len(part_a), r1["ChecksumSHA256"]), (2, len(part_b), part_b_sha)],
      f"the parts' attributes {listed_attrs}")
page = s3.get_object_attributes(Bucket=BUCKET, Key="mp/summed", ObjectAttributes=["ObjectParts"],
                                MaxParts=1)["ObjectParts"]
check(page["IsTruncated"] and page["NextPartNumberMarker"] == 1 and len(page["Parts"]) == 1,
      f"a page of parts {page}")
check("Checksum" not in s3.get_object_attributes(Bucket=BUCKET, Key="mp/summed",
                                                 ObjectAttributes=["ObjectSize"]),
      "only the attributes asked")
# Every UploadPart stores an attempt of its own, kept until the Complete or
# Abort: 16 of one part number at most; ListParts shows the latest.
capped = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/capped")["UploadId"]
for attempt in range(16):
    s3.upload_part(Bucket=BUCKET, Key="mp/capped", UploadId=capped, PartNumber=1,
                   Body=b"attempt %d" % attempt)
e = fails("InvalidRequest", s3.upload_part, Bucket=BUCKET, Key="mp/capped", UploadId=capped,
          PartNumber=1, Body=b"one too many", status=400)
check("16 times" in e.response["Error"]["Message"], f"the cap is named: {e}")
s3.upload_part(Bucket=BUCKET, Key="mp/capped", UploadId=capped, PartNumber=10, Body=b"ten")
latest = s3.list_parts(Bucket=BUCKET, Key="mp/capped", UploadId=capped)["Parts"]
check([(q["PartNumber"], q["ETag"].strip('"')) for q in latest] ==
      [(1, hashlib.md5(b"attempt 15").hexdigest()), (10, hashlib.md5(b"ten").hexdigest())],
      f"list_parts shows the latest attempt of each number {latest}")
s3.abort_multipart_upload(Bucket=BUCKET, Key="mp/capped", UploadId=capped)
# Checksum type FULL_OBJECT: the object keeps the CRC of its whole bytes,
# combined from the parts' CRCs; a Complete may state that value, and a
# wrong one is BadDigest with nothing made. SHAs cannot be FULL_OBJECT.
whole_a, whole_b = bytes(range(256)) * (5 * MIB // 256), b"the whole tail" * 1000
whole_crc = b64(zlib.crc32(whole_a + whole_b).to_bytes(4, "big"))
full = s3.create_multipart_upload(Bucket=BUCKET, Key="mp/full", ChecksumAlgorithm="CRC32",
                                  ChecksumType="FULL_OBJECT")
check(full.get("ChecksumType") == "FULL_OBJECT", f"the upload's checksum type {full}")
full_parts = []
for number, body in [(1, whole_a), (2, whole_b)]:
    r = s3.upload_part(Bucket=BUCKET, Key="mp/full", UploadId=full["UploadId"],
                       PartNumber=number, Body=body, ChecksumAlgorithm="CRC32")
    check(r.get("ChecksumCRC32") == b64(zlib.crc32(body).to_bytes(4, "big")), f"part {r}")
    full_parts.append({"PartNumber": number, "ETag": r["ETag"],
                       "ChecksumCRC32": r["ChecksumCRC32"]})
wrong_crc = b64((zlib.crc32(whole_a + whole_b) ^ 1).to_bytes(4, "big"))
e = fails("BadDigest", s3.complete_multipart_upload, Bucket=BUCKET, Key="mp/full",
          UploadId=full["UploadId"], ChecksumCRC32=wrong_crc,
          MultipartUpload={"Parts": full_parts}, status=400)
check(whole_crc in e.response["Error"]["Message"], f"the parts' value is named: {e}")
fails("NoSuchKey", s3.head_object, Bucket=BUCKET, Key="mp/full", status=404)
done = s3.complete_multipart_upload(Bucket=BUCKET, Key="mp/full", UploadId=full["UploadId"],
                                    ChecksumCRC32=whole_crc,
                                    MultipartUpload={"Parts": full_parts})
check(done.get("ChecksumCRC32") == whole_crc and done.get("ChecksumType") == "FULL_OBJECT",
      f"complete answers the whole object's CRC {done}")
head = s3.head_object(Bucket=BUCKET, Key="mp/full", ChecksumMode="ENABLED")
check(head.get("ChecksumCRC32") == whole_crc and head.get("ChecksumType") == "FULL_OBJECT",
      f"head_object answers it {head}")
got = s3.get_object(Bucket=BUCKET, Key="mp/full", ChecksumMode="ENABLED")
check(got["Body"].read() == whole_a + whole_b, "the full-object upload reads back")
s3.delete_object(Bucket=BUCKET, Key="mp/full")
fails("InvalidRequest", s3.create_multipart_upload, Bucket=BUCKET, Key="mp/full",
      ChecksumAlgorithm="SHA256", ChecksumType="FULL_OBJECT", status=400)
fails("InvalidRequest", s3.create_multipart_upload, Bucket=BUCKET, Key="mp/full",
      ChecksumType="FULL_OBJECT", status=400)
s3.delete_object(Bucket=BUCKET, Key="mp/summed")
# Left pending on purpose: DeleteBucket takes it away with the bucket.
s3.create_multipart_upload(Bucket=BUCKET, Key="mp/pending")

# A request whose date header was dropped after signing.
def drop_date(request, **_):
    del request.headers["X-Amz-Date"]


undated = client()
undated.meta.events.register_last("before-send.s3.ListObjectsV2", drop_date)
try:
    undated.list_objects_v2(Bucket=BUCKET)
    raise AssertionError("a request without a date was served")
except ClientError as e:
    code = e.response["Error"]["Code"]
    status = e.response["ResponseMetadata"]["HTTPStatusCode"]
    check(status == 400 and code == "InvalidRequest", f"no date: {code} {status}")
    check("x-amz-date" in e.response["Error"]["Message"], "the missing header is named")

# The bucket goes once empty.
gone = s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in
                                                            ["b/4", "dir/data.bin", "empty",
                                                             "over", "k" * 1024]]})
check(len(gone["Deleted"]) == 5 and not gone.get("Errors"), f"{gone}")
s3.delete_bucket(Bucket=BUCKET)
fails("NoSuchBucket", s3.head_bucket, Bucket=BUCKET, status=404)
check(s3.list_buckets()["Buckets"] == [], "no bucket left")
print(f"boto3: {CHECKS} checks passed")
