"""Re-uploads of listed part numbers racing CompleteMultipartUpload and
AbortMultipartUpload, through boto3, many times.

Usage: s3_race.py ENDPOINT BUCKET ACCESS SECRET ROUNDS

BUCKET exists already. Each round starts an upload of `race/N`, uploads
parts 1 (5 MiB) and 2, then re-uploads both numbers with other bytes
from four threads while the main thread completes the upload with the
first ETags. The object must read back as exactly the parts Complete
named, with their ETag, every time; each racing UploadPart answers 200
or NoSuchUpload. Then an upload is aborted while its part 1 is
re-uploaded. Run by crates/cli/tests/integration/s3.rs, which then
checks with `strata obj ls` that only the completed objects' parts are
left in the store. Prints "race: N rounds passed".
"""

import concurrent.futures
import hashlib
import random
import sys
import time

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT, BUCKET, ACCESS, SECRET, ROUNDS = sys.argv[1:6]
ROUNDS = int(ROUNDS)
MIB = 1 << 20

s3 = boto3.client(
    "s3",
    endpoint_url=ENDPOINT,
    aws_access_key_id=ACCESS,
    aws_secret_access_key=SECRET,
    region_name="us-east-1",
    config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"},
                  max_pool_connections=8),
)


def multipart_etag(parts):
    digests = b"".join(hashlib.md5(part).digest() for part in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def reupload(key, upload, number, body):
    """One racing UploadPart: its answer, 200 or the S3 error code."""
    time.sleep(random.random() * 0.03)
    try:
        s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number, Body=body)
        return "200"
    except ClientError as e:
        return e.response["Error"]["Code"]


answers_seen = set()
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    for round_number in range(ROUNDS):
        key = f"race/{round_number}"
        first = bytes([round_number % 251]) * (5 * MIB)
        second = b"second part of round %d" % round_number
        upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        etags = [s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=n,
                                Body=body)["ETag"]
                 for n, body in [(1, first), (2, second)]]
        racing = [pool.submit(reupload, key, upload, number,
                              b"other bytes %d %d" % (number, i) * 5000)
                  for i, number in enumerate([1, 2, 1, 2])]
        # So that some re-uploads land before the Complete lists the parts,
        # some while it works, and some after.
        time.sleep(random.random() * 0.03)
        done = s3.complete_multipart_upload(
            Bucket=BUCKET, Key=key, UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                       for n, e in enumerate(etags, 1)]})
        answers = [future.result() for future in racing]
        answers_seen.update(answers)
        expected = multipart_etag([first, second])
        assert done["ETag"] == expected, f"round {round_number}: {done['ETag']} != {expected}"
        assert set(answers) <= {"200", "NoSuchUpload"}, f"round {round_number}: {answers}"
        got = s3.get_object(Bucket=BUCKET, Key=key)
        body = got["Body"].read()
        assert body == first + second and got["ETag"] == expected, (
            f"round {round_number}: the object is not the parts Complete named ({answers})")

    # An Abort racing re-uploads: nothing of the upload is left.
    for round_number in range(max(ROUNDS // 2, 1)):
        key = f"aborted/{round_number}"
        upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
        s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=b"one")
        racing = [pool.submit(reupload, key, upload, 1, b"again %d" % i * 1000)
                  for i in range(3)]
        s3.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload)
        answers = [future.result() for future in racing]
        assert set(answers) <= {"200", "NoSuchUpload"}, f"abort {round_number}: {answers}"
        try:
            s3.list_parts(Bucket=BUCKET, Key=key, UploadId=upload)
            raise AssertionError("an aborted upload still lists its parts")
        except ClientError as e:
            assert e.response["Error"]["Code"] == "NoSuchUpload", e

pending = s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
assert pending == [], f"uploads left pending: {pending}"
print(f"race: {ROUNDS} rounds passed (racing answers seen: {sorted(answers_seen)})")
