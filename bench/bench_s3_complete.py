#!/usr/bin/python3
"""A multipart upload's Complete on an s3 volume (assembled on the origin by UploadPartCopy of
the staged parts), against the origin's own Complete of the same parts, in the same run.

  proxy   SIZE bytes uploaded in PART-byte parts through Sluice's S3 API to a bucket of an s3
          volume, then CompleteMultipartUpload through Sluice, timed
  origin  the same parts uploaded to the origin directly, and its own Complete, timed: the
          floor, since Sluice's Complete ends with the origin's
  upload  the time the parts took to upload through Sluice: what a Complete that reads every
          part back and uploads it again (Sluice before 2026-12-06) costs at the least
  -> seconds and the ratios proxy/origin and proxy/upload

The origin is a Ceph RGW (tests/tools/ceph-cluster.sh), or with --origin sluice a second
sluiced's S3 API (quicker to start; not RGW).

  /usr/bin/python3 bench/bench_s3_complete.py [--size 512m] [--part 8m] [--origin rgw|sluice]
"""
import argparse
import concurrent.futures
import os
import shutil
import tempfile
import time
import uuid

from bench_s3 import Rgw, S3Sluiced, SluiceOrigin, remote_volume, s3_client
from benchlib import parse_size

BUCKET = "origin"


def upload_parts(client, bucket, key, body, part):
    """Parts uploaded 8 at once; (upload id, parts, seconds)."""
    up = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    spans = [(i + 1, at) for i, at in enumerate(range(0, len(body), part))]
    t0 = time.perf_counter()

    def one(span):
        n, at = span
        r = client.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n,
                               Body=body[at:at + part])
        return {"PartNumber": n, "ETag": r["ETag"]}

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        parts = list(ex.map(one, spans))
    return up, parts, time.perf_counter() - t0


def complete(client, bucket, key, up, parts):
    t0 = time.perf_counter()
    client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                     MultipartUpload={"Parts": parts})
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("512m"))
    ap.add_argument("--part", type=parse_size, default=parse_size("8m"))
    ap.add_argument("--origin", choices=("rgw", "sluice"), default="rgw")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="sluice-bench-complete-", dir="/var/tmp")
    origin = proxy = None
    try:
        origin = Rgw() if args.origin == "rgw" else SluiceOrigin(os.path.join(root, "origin"))
        origin.client.create_bucket(Bucket=BUCKET)
        remote = remote_volume(origin, BUCKET, part_size=args.part)
        proxy = S3Sluiced(os.path.join(root, "proxy"), volumes=remote)
        user = f"remote-{uuid.uuid4().hex[:8]}"
        proxy.s.post(proxy.mgr + "/s3/users", json={"id": user, "volume": "remote"}).raise_for_status()
        k = proxy.s.post(proxy.mgr + "/s3/keys", json={"user": user}).json()
        through = s3_client(proxy.s3_url, k["access_key"], k["secret_key"], 16)
        bucket = f"remote-{uuid.uuid4().hex[:8]}"
        through.create_bucket(Bucket=bucket)
        direct = f"direct-{uuid.uuid4().hex[:8]}"
        origin.client.create_bucket(Bucket=direct)
        # RGW's first multipart upload takes a second or two to create (once per cluster):
        # made and aborted here, so that neither side's timing pays for it.
        for b in (BUCKET, direct):
            up = origin.client.create_multipart_upload(Bucket=b, Key="warm-up")["UploadId"]
            origin.client.abort_multipart_upload(Bucket=b, Key="warm-up", UploadId=up)
        body = os.urandom(args.size)
        n = (args.size + args.part - 1) // args.part
        print(f"{args.size} bytes in {n} parts of {args.part}, origin {args.origin}", flush=True)

        up, parts, sent = upload_parts(through, bucket, "obj", body, args.part)
        t_proxy = complete(through, bucket, "obj", up, parts)
        up, parts, _ = upload_parts(origin.client, direct, "obj", body, args.part)
        t_origin = complete(origin.client, direct, "obj", up, parts)
        got = through.get_object(Bucket=bucket, Key="obj")["Body"].read()
        assert got == body, "the object read back differs"
        print(f"proxy Complete   {t_proxy:8.2f} s")
        print(f"origin Complete  {t_origin:8.2f} s")
        print(f"upload via proxy {sent:8.2f} s")
        print(f"ratio proxy/origin {t_proxy / t_origin:.2f}x, "
              f"proxy/upload {t_proxy / sent:.2f}x", flush=True)
    finally:
        for server in (proxy, origin):
            if server:
                server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
