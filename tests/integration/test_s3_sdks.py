"""The S3 API driven by the current AWS SDK for JavaScript v3 (tests/s3-js-client, installed by
scripts/install-deps.sh), with its defaults: request checksums on every upload, aws-chunked
bodies with checksum trailers, response checksum validation, multipart through lib-storage;
over http and over https (certificate verified by the SDK)."""

import base64
import hashlib
import json
import os
import subprocess
import uuid
import zlib
from pathlib import Path

import pytest

from conftest import running_daemon

JS = Path(__file__).resolve().parents[1] / "s3-js-client"


def self_signed(dirpath):
    """A certificate for 127.0.0.1 (and its key), which the test trusts as its own CA."""
    cert, key = dirpath / "cert.pem", dirpath / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module", params=["http", "https"])
def s3d(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"sdk-{request.param}")
    opts = {}
    if request.param == "https":
        cert, key = self_signed(root)
        opts = {"ssl-enabled": True, "ssl-cert": str(cert), "ssl-privkey": str(key)}
    with running_daemon(root / "d", s3=opts) as d:
        d.ca = opts.get("ssl-cert")
        yield d


def run_js(d, ak, sk, bucket):
    env = dict(os.environ)
    if d.ca:
        env["NODE_EXTRA_CA_CERTS"] = d.ca  # the SDK verifies the server's certificate
    p = subprocess.run(["node", str(JS / "s3.mjs"), d.s3_url(), ak, sk, bucket],
                       capture_output=True, text=True, timeout=120, cwd=JS, env=env)
    assert p.returncode == 0, f"node s3.mjs failed:\n{p.stdout}\n{p.stderr}\n" \
                              f"--- sluiced ---\n{d.log()[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_js_sdk_defaults(s3d):
    assert (JS / "node_modules" / "@aws-sdk" / "client-s3").is_dir(), \
        "run scripts/install-deps.sh (npm ci in tests/s3-js-client)"
    user = s3d.s3_user()["id"]
    ak, sk = s3d.s3_key(user)
    bucket = f"js-{uuid.uuid4().hex[:10]}"
    out = run_js(s3d, ak, sk, bucket)
    small = b"hello from the JavaScript SDK\n"
    assert out["put_small"]["etag"] == f'"{hashlib.md5(small).hexdigest()}"'
    assert out["put_small"]["crc32"] == base64.b64encode(
        zlib.crc32(small).to_bytes(4, "big")).decode()
    assert out["put_stream"]["etag"] == f'"{out["put_stream"]["md5"]}"'
    assert out["put_stream"]["crc32c"]
    assert out["get_stream"] == {"same": True, "crc32c": out["put_stream"]["crc32c"]}
    assert out["head_small"] == {"crc32": out["put_small"]["crc32"], "length": len(small)}
    assert out["multipart"]["etag"].endswith('-3"')
    assert out["get_big"] == {"same": True}
    # Full-object checksums of multipart uploads: the parts' CRCs combined by the server (the SDK
    # itself validated the object's CRC on GET).
    f64 = out["full_crc64nvme"]
    assert f64["created"] == ["CRC64NVME", "FULL_OBJECT"] and f64["same"]
    assert f64["type"] == "FULL_OBJECT" and f64["get_type"] == "FULL_OBJECT"
    assert f64["complete"] and f64["complete"] == f64["get"] and "-" not in f64["complete"]
    f32 = out["full_crc32"]
    assert f32["created"] == ["CRC32", "FULL_OBJECT"] and f32["same"]
    assert f32["complete"] == f32["crc32"] == f32["get"]
    assert out["list"] == ["big.bin", "dir/streamed.bin", "small.txt"]
    assert out["deleted"] == ["dir/streamed.bin", "small.txt"]
