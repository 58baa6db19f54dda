"""Two sluiced serving one CephFS volume (the scale-out shape: stateless nodes over shared
storage, no other service): S3 users, keys, buckets and multipart uploads live on the volume,
so what one node does holds on the other within the refresh interval."""

import os
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from conftest import running_daemon, toml_section

MiB = 1 << 20
REFRESH = 1  # seconds: [api.s3] refresh-interval of both nodes


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, cephfs_mount):
    shared = cephfs_mount / f"sluice-2n-{uuid.uuid4().hex[:8]}"
    (shared / "vol").mkdir(parents=True)
    s3 = {"state-path": str(shared / "s3-state"), "refresh-interval": REFRESH}
    extra = toml_section("volume.ceph", {"backend": "cephfs", "path": str(shared / "vol")})
    root = tmp_path_factory.mktemp("two-nodes")
    with running_daemon(root / "a", volumes={"ceph": shared / "vol"}, s3=s3,
                        extra_toml=extra) as a, \
            running_daemon(root / "b", volumes={"ceph": shared / "vol"}, s3=s3,
                           extra_toml=extra) as b:
        yield a, b


def eventually(fn, timeout=10 * REFRESH):
    """fn() until it returns without raising (the other node's reload), at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (ClientError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_bucket_made_on_one_is_served_by_the_other(nodes):
    a, b = nodes
    user = a.s3_user(volume="ceph")["id"]
    ak, sk = a.s3_key(user)  # made on node a only
    on_a, on_b = a.s3_client(ak, sk), b.s3_client(ak, sk)
    bucket = f"shared-{uuid.uuid4().hex[:8]}"
    on_a.create_bucket(Bucket=bucket)
    on_a.put_object(Bucket=bucket, Key="from/a.txt", Body=b"written through node a")
    # Node b knows the key and the bucket without being told: both are records on the volume.
    got = eventually(lambda: on_b.get_object(Bucket=bucket, Key="from/a.txt"))
    assert got["Body"].read() == b"written through node a"
    on_b.put_object(Bucket=bucket, Key="from/b.txt", Body=b"written through node b")
    keys = [o["Key"] for o in on_a.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["from/a.txt", "from/b.txt"]
    assert bucket in [x["Name"] for x in on_b.list_buckets()["Buckets"]]
    # Deleted on b: gone on a.
    on_b.delete_object(Bucket=bucket, Key="from/a.txt")
    on_b.delete_object(Bucket=bucket, Key="from/b.txt")
    on_b.delete_bucket(Bucket=bucket)

    def gone():
        try:
            on_a.head_bucket(Bucket=bucket)
        except ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 404, e.response
            return
        raise AssertionError("node a still serves the deleted bucket")

    eventually(gone)


def test_multipart_begun_on_one_completed_on_the_other(nodes):
    a, b = nodes
    user = a.s3_user(volume="ceph")["id"]
    ak, sk = a.s3_key(user)
    on_a, on_b = a.s3_client(ak, sk), b.s3_client(ak, sk)
    bucket = f"mp-{uuid.uuid4().hex[:8]}"
    on_a.create_bucket(Bucket=bucket)
    eventually(lambda: on_b.head_bucket(Bucket=bucket))
    up = on_a.create_multipart_upload(Bucket=bucket, Key="model.bin")["UploadId"]
    p1, p2 = os.urandom(5 * MiB), os.urandom(1 * MiB)
    e1 = on_a.upload_part(Bucket=bucket, Key="model.bin", UploadId=up, PartNumber=1,
                          Body=p1)["ETag"]
    # The second part through node b, and the listing and completion there too.
    e2 = on_b.upload_part(Bucket=bucket, Key="model.bin", UploadId=up, PartNumber=2,
                          Body=p2)["ETag"]
    parts = on_b.list_parts(Bucket=bucket, Key="model.bin", UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["ETag"]) for p in parts] == [(1, e1), (2, e2)]
    done = on_b.complete_multipart_upload(Bucket=bucket, Key="model.bin", UploadId=up,
                                          MultipartUpload={"Parts": [
                                              {"PartNumber": 1, "ETag": e1},
                                              {"PartNumber": 2, "ETag": e2}]})
    assert done["ETag"].endswith('-2"')
    assert on_a.get_object(Bucket=bucket, Key="model.bin")["Body"].read() == p1 + p2
    assert on_a.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_key_revoked_on_one_is_refused_by_the_other(nodes):
    a, b = nodes
    user = a.s3_user(volume="ceph")["id"]
    ak, sk = a.s3_key(user)
    on_b = b.s3_client(ak, sk)
    eventually(lambda: on_b.list_buckets())
    r = a.mgr("DELETE", f"/s3/keys/{ak}")
    assert r.status_code in (200, 204), r.text

    def refused():
        try:
            on_b.list_buckets()
        except ClientError as e:
            assert e.response["Error"]["Code"] == "InvalidAccessKeyId", e.response
            return
        raise AssertionError("node b still takes the revoked key")

    t0 = time.monotonic()
    eventually(refused)
    assert time.monotonic() - t0 < 5 * REFRESH + 5  # "within seconds"
