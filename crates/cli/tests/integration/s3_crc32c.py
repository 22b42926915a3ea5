"""CRC-32C checksums computed by boto3 itself, through the AWS CRT.

Usage: s3_crc32c.py ENDPOINT BUCKET ACCESS SECRET

botocore computes CRC-32C only with `awscrt`; Debian's python3-awscrt
serves the system Python, so crates/cli/tests/integration/s3_checksums.rs
runs this with /usr/bin/python3 (scripts/test.sh installs python3-boto3
and python3-awscrt for it). BUCKET exists. Prints "crc32c: N checks
passed" at the end; the first failure raises.
"""

import base64
import sys

import awscrt.checksums
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT, BUCKET, ACCESS, SECRET = sys.argv[1:5]
CHECKS = 0


def check(condition, what):
    global CHECKS
    if not condition:
        raise AssertionError(what)
    CHECKS += 1


def crc32c(data):
    """S3's form: the big-endian CRC-32C, in base64."""
    return base64.b64encode(awscrt.checksums.crc32c(data).to_bytes(4, "big")).decode()


s3 = boto3.client(
    "s3",
    endpoint_url=ENDPOINT,
    aws_access_key_id=ACCESS,
    aws_secret_access_key=SECRET,
    region_name="us-east-1",
    config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
)
body = bytes((i * 7 + 3) % 251 for i in range(300_000))

# boto3 computes the CRC-32C (a trailer of the aws-chunked body), the
# gateway checks it, keeps it and answers it.
put = s3.put_object(Bucket=BUCKET, Key="crc", Body=body, ChecksumAlgorithm="CRC32C")
check(put.get("ChecksumCRC32C") == crc32c(body), f"PutObject answered {put}")
got = s3.get_object(Bucket=BUCKET, Key="crc", ChecksumMode="ENABLED")
# botocore checks the body against the answered checksum as it reads.
check(got["Body"].read() == body, "GetObject's bytes")
check(got.get("ChecksumCRC32C") == crc32c(body), f"GetObject answered {got.get('ChecksumCRC32C')}")
head = s3.head_object(Bucket=BUCKET, Key="crc", ChecksumMode="ENABLED")
check(head.get("ChecksumCRC32C") == crc32c(body), f"HeadObject answered {head}")

# A value that does not match the body: BadDigest, and the key keeps
# its object.
try:
    s3.put_object(Bucket=BUCKET, Key="crc", Body=b"other bytes", ChecksumCRC32C=crc32c(b"not these"))
    check(False, "a wrong CRC32C was taken")
except ClientError as error:
    code = error.response["Error"]["Code"]
    check(code == "BadDigest", f"a wrong CRC32C: {code}")
kept = s3.get_object(Bucket=BUCKET, Key="crc")["Body"].read()
check(kept == body, "the object after a refused Put")

# Multipart: boto3 computes each part's CRC-32C; Complete lists them and
# the object answers S3's composite (the CRC-32C of the parts' CRCs, -N).
parts_data = [bytes([n]) * (5 << 20) for n in (1, 2)] + [b"tail" * 1000]
upload = s3.create_multipart_upload(Bucket=BUCKET, Key="multi", ChecksumAlgorithm="CRC32C")
parts = []
for number, data in enumerate(parts_data, start=1):
    answer = s3.upload_part(
        Bucket=BUCKET,
        Key="multi",
        UploadId=upload["UploadId"],
        PartNumber=number,
        Body=data,
        ChecksumAlgorithm="CRC32C",
    )
    check(answer.get("ChecksumCRC32C") == crc32c(data), f"part {number}: {answer}")
    parts.append({"PartNumber": number, "ETag": answer["ETag"], "ChecksumCRC32C": answer["ChecksumCRC32C"]})
s3.complete_multipart_upload(
    Bucket=BUCKET, Key="multi", UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
)
digests = b"".join(base64.b64decode(crc32c(data)) for data in parts_data)
composite = f"{crc32c(digests)}-{len(parts_data)}"
head = s3.head_object(Bucket=BUCKET, Key="multi", ChecksumMode="ENABLED")
check(head.get("ChecksumCRC32C") == composite, f"composite {composite}, answered {head.get('ChecksumCRC32C')}")
whole = s3.get_object(Bucket=BUCKET, Key="multi")["Body"].read()
check(whole == b"".join(parts_data), "the multipart object's bytes")
print(f"crc32c: {CHECKS} checks passed")
