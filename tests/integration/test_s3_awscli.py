"""The S3 API driven by the AWS CLI (`aws s3` and `aws s3api`) as users run it."""

import hashlib
import json
import os
import subprocess
import uuid

import pytest

from conftest import running_daemon


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    root = tmp_path_factory.mktemp("awscli")
    with running_daemon(root / "d", s3={}) as d:
        user = d.s3_user()["id"]
        ak, sk = d.s3_key(user)
        cfg = root / "aws-config"
        # Path-style addressing; the CLI's default multipart threshold (8 MB) and chunk size.
        cfg.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n")
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk,
                   AWS_CONFIG_FILE=str(cfg), AWS_SHARED_CREDENTIALS_FILE=str(root / "none"),
                   AWS_PAGER="", AWS_EC2_METADATA_DISABLED="true")

        def aws(*args, check=True):
            p = subprocess.run(["/usr/bin/aws", "--endpoint-url", d.s3_url(), *args], env=env,
                               capture_output=True, text=True, timeout=120)
            if check:
                assert p.returncode == 0, f"aws {' '.join(args)}: {p.stderr}"
            return p

        aws.daemon = d
        yield aws


def test_cp_ls_sync_rm(cli, tmp_path):
    bucket = f"cli-{uuid.uuid4().hex[:10]}"
    cli("s3", "mb", f"s3://{bucket}")
    src = tmp_path / "src"
    (src / "nested" / "deeper").mkdir(parents=True)
    files = {"a.bin": os.urandom(5_000_000), "big.bin": os.urandom(20_000_000),
             "nested/b.txt": b"hello\n" * 1000,
             "nested/deeper/c": b"", "space name.txt": b"spaces"}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    cli("s3", "cp", str(src / "a.bin"), f"s3://{bucket}/single/a.bin")
    out = cli("s3", "ls", f"s3://{bucket}/single/").stdout
    assert "a.bin" in out and "5000000" in out
    cli("s3", "sync", str(src), f"s3://{bucket}/tree")
    listing = cli("s3", "ls", "--recursive", f"s3://{bucket}/tree/").stdout
    for rel in files:
        assert f"tree/{rel}" in listing
    # A second sync has nothing to do.
    again = cli("s3", "sync", str(src), f"s3://{bucket}/tree").stdout
    assert again.strip() == ""
    dst = tmp_path / "dst"
    cli("s3", "sync", f"s3://{bucket}/tree", str(dst))
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data
    head = json.loads(cli("s3api", "head-object", "--bucket", bucket, "--key", "tree/a.bin").stdout)
    assert head["ETag"] == f'"{hashlib.md5(files["a.bin"]).hexdigest()}"'
    # Over the CLI's threshold: a multipart upload (8 MB parts).
    head = json.loads(cli("s3api", "head-object", "--bucket", bucket, "--key", "tree/big.bin").stdout)
    assert head["ETag"].endswith('-3"') and head["ContentLength"] == 20_000_000
    cli("s3", "rm", "--recursive", f"s3://{bucket}/tree")
    assert cli("s3", "ls", "--recursive", f"s3://{bucket}/tree/", check=False).stdout == ""
    cli("s3", "rb", "--force", f"s3://{bucket}")
    assert bucket not in cli("s3", "ls").stdout


def test_errors_reach_the_user(cli):
    p = cli("s3", "ls", "s3://no-such-bucket-here", check=False)
    assert p.returncode != 0 and "NoSuchBucket" in p.stderr
    p = cli("s3api", "get-object", "--bucket", "no-such-bucket-here", "--key", "k", "/dev/null",
            check=False)
    assert p.returncode != 0 and "NoSuchBucket" in p.stderr
