"""The S3 API driven by the clients people run against S3 stores, as they run them: s3cmd,
rclone (copy, sync, check) and an s3fs FUSE mount (reading and writing). All from Debian,
installed by scripts/install-deps.sh."""

import hashlib
import os
import subprocess
import time
import uuid

import pytest

from conftest import running_daemon


@pytest.fixture(scope="module")
def s3d(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("clients"), s3={}) as d:
        d.ak, d.sk = d.s3_key(d.s3_user()["id"])
        d.boto = d.s3_client(d.ak, d.sk)
        yield d


def run(cmd, env=None, check=True, timeout=180):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, f"{' '.join(map(str, cmd))} ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


def bucket_dir(d, name):
    b = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"] if b["name"] == name)
    return d.vfolder_path(b["vfid"], b["volume"])


def tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------------------------- s3cmd


def test_s3cmd(s3d, tmp_path):
    cfg = tmp_path / "s3cfg"
    host = f"127.0.0.1:{s3d.s3_port}"
    cfg.write_text(f"""[default]
access_key = {s3d.ak}
secret_key = {s3d.sk}
host_base = {host}
host_bucket = {host}
use_https = False
signature_v2 = False
bucket_location = us-east-1
""")
    s3cmd = ["s3cmd", "-c", str(cfg), "--no-progress"]
    bucket = f"s3cmd-{uuid.uuid4().hex[:8]}"
    run([*s3cmd, "mb", f"s3://{bucket}"])
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"one.txt": b"one\n", "sub/two.bin": os.urandom(300_000),
             "big.bin": os.urandom(12 * 1024 * 1024 + 5)}  # multipart: 5 MiB chunks
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    run([*s3cmd, "put", "--multipart-chunk-size-mb=5", str(src / "big.bin"),
         f"s3://{bucket}/big.bin"])
    run([*s3cmd, "sync", f"{src}/", f"s3://{bucket}/tree/"])
    listing = run([*s3cmd, "ls", "--recursive", f"s3://{bucket}"]).stdout
    for rel in files:
        assert f"s3://{bucket}/tree/{rel}" in listing
    assert (bucket_dir(s3d, bucket) / "big.bin").read_bytes() == files["big.bin"]
    # Objects are files: what s3cmd wrote is on the volume as it was.
    assert tree(bucket_dir(s3d, bucket) / "tree") == files
    out = tmp_path / "back.bin"
    run([*s3cmd, "get", f"s3://{bucket}/tree/sub/two.bin", str(out)])
    assert out.read_bytes() == files["sub/two.bin"]
    info = run([*s3cmd, "info", f"s3://{bucket}/tree/one.txt"]).stdout
    assert hashlib.md5(b"one\n").hexdigest() in info
    run([*s3cmd, "del", "--recursive", "--force", f"s3://{bucket}/"])
    assert run([*s3cmd, "ls", "--recursive", f"s3://{bucket}"]).stdout.strip() == ""
    run([*s3cmd, "rb", f"s3://{bucket}"])
    p = run([*s3cmd, "ls", f"s3://{bucket}"], check=False)
    assert p.returncode != 0 and "NoSuchBucket" in (p.stdout + p.stderr)


# --------------------------------------------------------------------------------------- rclone


@pytest.fixture
def rclone(s3d, tmp_path):
    # A remote "sluice:" from the environment (no config file); rclone 1.60 trips on the
    # AWS_CA_BUNDLE some environments set.
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    env.update(RCLONE_CONFIG=str(tmp_path / "none.conf"), RCLONE_CONFIG_SLUICE_TYPE="s3",
               RCLONE_CONFIG_SLUICE_PROVIDER="Other", RCLONE_CONFIG_SLUICE_ENV_AUTH="false",
               RCLONE_CONFIG_SLUICE_ACCESS_KEY_ID=s3d.ak,
               RCLONE_CONFIG_SLUICE_SECRET_ACCESS_KEY=s3d.sk,
               RCLONE_CONFIG_SLUICE_ENDPOINT=s3d.s3_url(),
               RCLONE_CONFIG_SLUICE_FORCE_PATH_STYLE="true",
               RCLONE_CONFIG_SLUICE_REGION="us-east-1")

    def rc(*args, check=True):
        return run(["rclone", "--retries", "1", "--low-level-retries", "1", *args], env=env,
                   check=check)

    return rc


def test_rclone_copy_sync_check(s3d, rclone, tmp_path):
    bucket = f"rclone-{uuid.uuid4().hex[:8]}"
    s3d.boto.create_bucket(Bucket=bucket)
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    files = {"top.txt": b"top\n", "a/mid.bin": os.urandom(100_000),
             "a/b/deep.bin": os.urandom(1_000_000), "chunked.bin": os.urandom(6 * 1024 * 1024)}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    # --s3-upload-cutoff 5M: the 6 MiB file goes up as a multipart upload.
    rclone("copy", "--s3-upload-cutoff", "5M", "--s3-chunk-size", "5M", str(src),
           f"sluice:{bucket}/data")
    root = bucket_dir(s3d, bucket) / "data"
    assert tree(root) == files
    rclone("check", str(src), f"sluice:{bucket}/data")
    # sync removes what the source no longer has, and adds what it gained.
    (src / "top.txt").unlink()
    (src / "new.txt").write_bytes(b"new\n")
    rclone("sync", str(src), f"sluice:{bucket}/data")
    assert not (root / "top.txt").exists() and (root / "new.txt").read_bytes() == b"new\n"
    rclone("check", str(src), f"sluice:{bucket}/data")
    # A difference is found: check fails.
    (root / "a" / "mid.bin").write_bytes(b"changed behind rclone's back")
    p = rclone("check", str(src), f"sluice:{bucket}/data", check=False)
    assert p.returncode != 0 and "a/mid.bin" in p.stderr
    # Files written on the volume (no stored MD5) get an ETag that is not an MD5, so check
    # compares sizes and never reports a hash it cannot know as a difference.
    (root / "a" / "mid.bin").write_bytes(files["a/mid.bin"])
    (root / "plain.bin").write_bytes(b"written on the volume")
    (src / "plain.bin").write_bytes(b"written on the volume")
    p = rclone("check", str(src), f"sluice:{bucket}/data", check=False)
    assert p.returncode == 0, p.stderr
    back = tmp_path / "back"
    rclone("copy", f"sluice:{bucket}/data", str(back))
    assert tree(back) == tree(src)


# ----------------------------------------------------------------------------------------- s3fs


def test_s3fs_mount_reads_and_writes(s3d, tmp_path):
    bucket = f"s3fs-{uuid.uuid4().hex[:8]}"
    s3d.boto.create_bucket(Bucket=bucket)
    s3d.boto.put_object(Bucket=bucket, Key="from-s3/hello.txt", Body=b"hello from boto3\n")
    passwd = tmp_path / "passwd"
    passwd.write_text(f"{s3d.ak}:{s3d.sk}\n")
    passwd.chmod(0o600)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run(["s3fs", bucket, str(mnt), "-o", f"url={s3d.s3_url()}", "-o", "use_path_request_style",
         "-o", f"passwd_file={passwd}", "-o", "endpoint=us-east-1", "-o", "sigv4"])
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.ismount(mnt)
        assert (mnt / "from-s3" / "hello.txt").read_bytes() == b"hello from boto3\n"
        data = os.urandom(3 * 1024 * 1024)
        (mnt / "written").mkdir()
        (mnt / "written" / "through-fuse.bin").write_bytes(data)
        assert sorted(os.listdir(mnt)) == ["from-s3", "written"]
        # Through S3 and on the volume, the same bytes.
        got = s3d.boto.get_object(Bucket=bucket, Key="written/through-fuse.bin")["Body"].read()
        assert got == data
        assert (bucket_dir(s3d, bucket) / "written" / "through-fuse.bin").read_bytes() == data
        (mnt / "from-s3" / "hello.txt").unlink()
        keys = [o["Key"] for o in s3d.boto.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert "from-s3/hello.txt" not in keys
    finally:
        subprocess.run(["fusermount", "-u", str(mnt)], check=False)
