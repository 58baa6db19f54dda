"""`sluice s3 ls | cp | sync | rm | get-batch | bench` against a real sluiced: what the data
commands write is checked through boto3 and on the volume, what they read against the bytes
written."""

import hashlib
import http.server
import io
import json
import os
import pathlib
import shutil
import signal
import stat
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid

import pytest
import requests

from conftest import BIN_DIR, pause, running_daemon, through_fifo, toml_section

SLUICE = BIN_DIR / "sluice"
MiB = 1 << 20


@pytest.fixture(scope="module")
def s3d(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("s3cli"), s3={}) as d:
        d.user = d.s3_user()["id"]
        d.ak, d.sk = d.s3_key(d.user)
        d.boto = d.s3_client(d.ak, d.sk)
        yield d


@pytest.fixture
def bucket(s3d):
    name = f"cli-{uuid.uuid4().hex[:10]}"
    s3d.boto.create_bucket(Bucket=name)
    return name


def cli(d, *args, ak=None, sk=None, check=True, cache=None, timeout=120, stdin=None,
        preexec_fn=None):
    env = {"PATH": os.environ["PATH"], "HOME": str(cache or d.root),
           "AWS_ACCESS_KEY_ID": ak or d.ak, "AWS_SECRET_ACCESS_KEY": sk or d.sk}
    p = subprocess.run([str(SLUICE), "s3", *args, "--s3-endpoint", d.s3_url()], env=env,
                       capture_output=True, timeout=timeout, input=stdin, preexec_fn=preexec_fn)
    if check:
        assert p.returncode == 0, (f"sluice s3 {' '.join(map(str, args))} -> {p.returncode}\n"
                                   f"{p.stdout.decode(errors='replace')}\n"
                                   f"{p.stderr.decode(errors='replace')}")
    return p


def keys_of(d, bucket, prefix=""):
    out, token = [], None
    while True:
        kw = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kw["ContinuationToken"] = token
        page = d.boto.list_objects_v2(**kw)
        out += [o["Key"] for o in page.get("Contents", [])]
        if not page.get("IsTruncated"):
            return out
        token = page["NextContinuationToken"]


def body_of(d, bucket, key):
    return d.boto.get_object(Bucket=bucket, Key=key)["Body"].read()


def write_tree(root, files):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def read_tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_help_and_usage_errors(s3d, tmp_path):
    p = subprocess.run([str(SLUICE), "s3", "cp", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--part-size" in p.stdout and "AWS_ACCESS_KEY_ID" in p.stdout
    # No credentials: a clear message and the usage exit status, before any request.
    p = subprocess.run([str(SLUICE), "s3", "ls", "--s3-endpoint", s3d.s3_url()],
                       capture_output=True, text=True, env={"PATH": os.environ["PATH"],
                                                            "HOME": str(tmp_path)})
    assert p.returncode == 2 and "AWS_ACCESS_KEY_ID" in p.stderr
    p = cli(s3d, "cp", str(tmp_path), "s3://b/k", check=False)
    assert p.returncode == 2 and b"--recursive" in p.stderr
    p = cli(s3d, "cp", "s3://a/b", "s3://c/d", check=False)
    assert p.returncode == 2 and b"local path" in p.stderr
    p = cli(s3d, "cp", "s3:///k", str(tmp_path / "x"), check=False)
    assert p.returncode == 2 and b"no bucket" in p.stderr
    # A wrong secret is an authentication failure (exit 5), a missing key a not-found (3).
    p = cli(s3d, "ls", sk="wrong-secret", check=False)
    assert p.returncode == 5 and b"SignatureDoesNotMatch" in p.stderr
    p = cli(s3d, "cp", f"s3://{uuid.uuid4().hex[:8]}/nope", str(tmp_path / "x"), check=False)
    assert p.returncode == 3
    assert not (tmp_path / "x").exists()


def test_ls(s3d, bucket):
    for k in ["a.txt", "dir/b.txt", "dir/sub/c.txt", "z.txt"]:
        s3d.boto.put_object(Bucket=bucket, Key=k, Body=k.encode())
    out = cli(s3d, "ls").stdout.decode()
    assert bucket in out
    top = cli(s3d, "ls", f"s3://{bucket}").stdout.decode().splitlines()
    assert [line.split()[-1] for line in top] == ["dir/", "a.txt", "z.txt"]
    assert top[0].split()[0] == "PRE"
    rec = cli(s3d, "ls", "--recursive", f"s3://{bucket}").stdout.decode().splitlines()
    assert [line.split()[-1] for line in rec] == ["a.txt", "dir/b.txt", "dir/sub/c.txt", "z.txt"]
    assert rec[1].split()[2] == str(len("dir/b.txt"))
    js = json.loads(cli(s3d, "--json", "ls", "-r", f"s3://{bucket}/dir/").stdout)
    assert [o["key"] for o in js] == ["dir/b.txt", "dir/sub/c.txt"]
    assert js[0]["etag"] == hashlib.md5(b"dir/b.txt").hexdigest()


def test_parallel_listing_matches_sequential(s3d, bucket):
    names = [f"shard{i % 7}/item{i:05d}.bin" for i in range(1500)]
    s3d.boto.put_object(Bucket=bucket, Key="shard3/", Body=b"")
    root = None
    for k in names:
        # Straight onto the volume: objects are files, and 1500 PUTs would only slow the test.
        if root is None:
            b = next(b for b in s3d.mgr("GET", "/s3/buckets").json()["buckets"]
                     if b["name"] == bucket)
            root = s3d.vfolder_path(b["vfid"], b["volume"])
        p = root / k
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    expected = keys_of(s3d, bucket)
    assert len(expected) >= 1500
    for jobs in ("1", "8"):
        out = cli(s3d, "ls", "-r", "-j", jobs, f"s3://{bucket}").stdout.decode().splitlines()
        assert [line.split()[-1] for line in out] == expected


def test_cp_file_roundtrip(s3d, bucket, tmp_path):
    src = tmp_path / "one.bin"
    data = os.urandom(300_001)
    src.write_bytes(data)
    cli(s3d, "cp", str(src), f"s3://{bucket}/x/")  # a trailing slash: the file's name is kept
    assert body_of(s3d, bucket, "x/one.bin") == data
    cli(s3d, "cp", str(src), f"s3://{bucket}/renamed.bin")
    head = s3d.boto.head_object(Bucket=bucket, Key="renamed.bin")
    assert head["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    back = tmp_path / "back.bin"
    cli(s3d, "cp", f"s3://{bucket}/renamed.bin", str(back))
    assert back.read_bytes() == data
    # The object's modification time comes along, so a sync afterwards has nothing to do.
    assert abs(back.stat().st_mtime - head["LastModified"].timestamp()) < 1
    (tmp_path / "into").mkdir()
    cli(s3d, "cp", f"s3://{bucket}/x/one.bin", str(tmp_path / "into"))
    assert (tmp_path / "into" / "one.bin").read_bytes() == data
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    cli(s3d, "cp", str(empty), f"s3://{bucket}/empty")
    assert body_of(s3d, bucket, "empty") == b""
    # No temporary file is left next to a download.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.bin", "empty", "into", "one.bin"]


def test_cp_recursive_both_ways(s3d, bucket, tmp_path):
    files = {"a.txt": b"a", "d/b.bin": os.urandom(70_000), "d/e/c": b"", "d/e/f/g.txt": b"g" * 9}
    src = tmp_path / "src"
    write_tree(src, files)
    os.symlink("/etc/passwd", src / "link")  # not followed, not uploaded
    p = cli(s3d, "cp", "-r", "-j", "4", str(src), f"s3://{bucket}/tree")
    assert b"a symlink (not followed)" in p.stderr
    assert sorted(keys_of(s3d, bucket)) == sorted(f"tree/{k}" for k in files)
    for k, v in files.items():
        assert body_of(s3d, bucket, f"tree/{k}") == v
    s3d.boto.put_object(Bucket=bucket, Key="tree/emptydir/", Body=b"")
    dst = tmp_path / "dst"
    cli(s3d, "cp", "-r", f"s3://{bucket}/tree", str(dst))
    assert read_tree(dst) == files
    assert (dst / "emptydir").is_dir()


def test_multipart_upload_and_parallel_download(s3d, bucket, tmp_path):
    data = os.urandom(23 * MiB + 17)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    cli(s3d, "cp", "--part-size", "5MiB", "--multipart-threshold", "8MiB", "-j", "4", str(src),
        f"s3://{bucket}/big.bin")
    head = s3d.boto.head_object(Bucket=bucket, Key="big.bin")
    md5s = b"".join(hashlib.md5(data[i:i + 5 * MiB]).digest() for i in range(0, len(data), 5 * MiB))
    assert head["ETag"] == f'"{hashlib.md5(md5s).hexdigest()}-5"'
    assert body_of(s3d, bucket, "big.bin") == data
    # Nothing is kept once the upload completed.
    assert not list((s3d.root / ".cache" / "sluice" / "uploads").glob("*.json"))
    back = tmp_path / "back.bin"
    p = cli(s3d, "cp", "--multipart-threshold", "8MiB", "--part-size", "5MiB", "-j", "4",
            "--progress", f"s3://{bucket}/big.bin", str(back))
    assert back.read_bytes() == data
    # The progress line ends on its last frame: every byte and the one file.
    last = p.stderr.decode().split("\n")[-3].split("\r")[-1]
    assert "100%" in last and "23 MiB / 23 MiB" in last and "1/1 files" in last, p.stderr


def limited_bucket(s3d, limit_bytes):
    """A new bucket of a new user whose quota scope holds `limit_bytes`: (bucket, boto3 client,
    access key, secret key, a function that sets another limit)."""
    scope = f"user:{uuid.uuid4()}"
    u = s3d.s3_user(quota_scope=scope)["id"]
    ak, sk = s3d.s3_key(u)
    s3 = s3d.s3_client(ak, sk)
    name = f"cli-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)

    def limit(n):
        r = s3d.mgr("PATCH", "/quota-scope", json={"volume": "local", "qsid": scope,
                                                    "options": {"limit_bytes": n}})
        assert r.status_code in (200, 204), r.text

    limit(limit_bytes)
    return name, s3, ak, sk, limit


def test_interrupted_upload_resumes(s3d, tmp_path):
    # A quota scope that holds two 5 MiB parts, not three: the first run stops at part 3.
    name, s3, ak, sk, limit = limited_bucket(s3d, 12 * MiB)
    data = os.urandom(20 * MiB)
    src = tmp_path / "model.bin"
    src.write_bytes(data)
    cache = tmp_path / "home"
    args = ["cp", "-j", "1", "--part-size", "5MiB", "--multipart-threshold", "5MiB", str(src),
            f"s3://{name}/model.bin"]
    p = cli(s3d, *args, ak=ak, sk=sk, cache=cache, check=False)
    assert p.returncode == 1, p.stderr
    assert b"QuotaExceeded" in p.stderr and b"run the same command again" in p.stderr
    assert list((cache / ".cache" / "sluice" / "uploads").glob("*.json"))
    uploads = s3.list_multipart_uploads(Bucket=name)["Uploads"]
    assert len(uploads) == 1
    parts = s3.list_parts(Bucket=name, Key="model.bin", UploadId=uploads[0]["UploadId"])["Parts"]
    assert [x["PartNumber"] for x in parts] == [1, 2]
    with pytest.raises(Exception):
        s3.head_object(Bucket=name, Key="model.bin")  # nothing partial is visible

    limit(100 * MiB)
    p = cli(s3d, *args, ak=ak, sk=sk, cache=cache)
    assert b"2 parts reused" in p.stderr, p.stderr
    assert b"resume:" in p.stdout
    assert s3.get_object(Bucket=name, Key="model.bin")["Body"].read() == data
    assert s3.list_multipart_uploads(Bucket=name).get("Uploads", []) == []
    assert not list((cache / ".cache" / "sluice" / "uploads").glob("*.json"))

    # The source changes behind a kept upload, with the same size and mtime (so the same state
    # file): the parts' CRC32C no longer match, and nothing stale is reused.
    limit(32 * MiB)  # 20 MiB held by model.bin: two more parts fit, not three
    src.write_bytes(os.urandom(20 * MiB))
    p = cli(s3d, *args, ak=ak, sk=sk, cache=cache, check=False)
    assert p.returncode == 1 and b"QuotaExceeded" in p.stderr
    st = src.stat()
    data3 = os.urandom(20 * MiB)
    src.write_bytes(data3)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    limit(200 * MiB)
    p = cli(s3d, *args, ak=ak, sk=sk, cache=cache)
    assert b"resume:" in p.stdout and b"parts reused" not in p.stderr
    assert s3.get_object(Bucket=name, Key="model.bin")["Body"].read() == data3


def test_sync_both_ways(s3d, bucket, tmp_path):
    src = tmp_path / "src"
    files = {"a": b"1", "b/c": b"22", "b/d/e": b"333"}
    write_tree(src, files)
    p = cli(s3d, "sync", str(src), f"s3://{bucket}/s")
    assert b"3 files" in p.stderr
    assert sorted(keys_of(s3d, bucket)) == ["s/a", "s/b/c", "s/b/d/e"]
    # Nothing changed: nothing sent.
    p = cli(s3d, "sync", str(src), f"s3://{bucket}/s")
    assert b"0 files" in p.stderr and b"3 up to date" in p.stderr
    # A changed file (other size) and a new one go; a deleted one goes only with --delete.
    (src / "a").write_bytes(b"changed")
    (src / "new").write_bytes(b"n")
    (src / "b" / "c").unlink()
    cli(s3d, "sync", str(src), f"s3://{bucket}/s")
    assert body_of(s3d, bucket, "s/a") == b"changed"
    assert "s/b/c" in keys_of(s3d, bucket)
    dry = cli(s3d, "sync", "--delete", "--dry-run", str(src), f"s3://{bucket}/s")
    assert b"(dry run) delete: s3://" in dry.stdout and "s/b/c" in keys_of(s3d, bucket)
    cli(s3d, "sync", "--delete", str(src), f"s3://{bucket}/s")
    assert sorted(keys_of(s3d, bucket)) == ["s/a", "s/b/d/e", "s/new"]

    dst = tmp_path / "dst"
    cli(s3d, "sync", f"s3://{bucket}/s", str(dst))
    assert read_tree(dst) == read_tree(src)
    p = cli(s3d, "sync", f"s3://{bucket}/s", str(dst))
    assert b"0 files" in p.stderr
    (dst / "stray").write_bytes(b"x")
    cli(s3d, "sync", "--delete", f"s3://{bucket}/s", str(dst))
    assert read_tree(dst) == read_tree(src)
    # A local file --delete cannot remove (immutable: even root cannot) fails the run.
    (dst / "stuck").write_bytes(b"x")
    subprocess.run(["chattr", "+i", str(dst / "stuck")], check=True)
    try:
        p = cli(s3d, "sync", "--delete", f"s3://{bucket}/s", str(dst), check=False)
        assert p.returncode == 1 and b"delete failed" in p.stderr, p.stderr
        assert b"1 FAILED" in p.stderr
    finally:
        subprocess.run(["chattr", "-i", str(dst / "stuck")], check=True)


def test_ls_into_a_reader_that_goes_away(s3d, bucket):
    # `sluice s3 ls | head -1`: the listing ends by SIGPIPE, as coreutils' ls does, instead of
    # fetching every page into a closed pipe and exiting 0. 6000 keys make more output than
    # a pipe holds.
    b = next(b for b in s3d.mgr("GET", "/s3/buckets").json()["buckets"] if b["name"] == bucket)
    root = s3d.vfolder_path(b["vfid"], b["volume"])
    for d in range(6):
        (root / f"d{d}").mkdir()
        for i in range(1000):
            (root / f"d{d}" / f"key-with-a-longer-name-{i:04d}").write_bytes(b"z")
    env = {"PATH": os.environ["PATH"], "HOME": str(s3d.root), "AWS_ACCESS_KEY_ID": s3d.ak,
           "AWS_SECRET_ACCESS_KEY": s3d.sk}
    for jobs in ("1", "4"):
        p = subprocess.Popen([str(SLUICE), "s3", "ls", "-r", "-j", jobs, f"s3://{bucket}/",
                              "--s3-endpoint", s3d.s3_url()], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        assert p.stdout.readline().endswith(b" d0/key-with-a-longer-name-0000\n")
        p.stdout.close()
        p.wait(timeout=60)
        assert p.returncode == -signal.SIGPIPE, p.stderr.read()
    # --json streams its array too (before, it held every key in memory and printed the
    # array once all 6 pages had come): the reader's leaving ends it within the first pages.
    pages = s3_gets(s3d)
    p = subprocess.Popen([str(SLUICE), "s3", "--json", "ls", "-r", "-j", "1", f"s3://{bucket}/",
                          "--s3-endpoint", s3d.s3_url()], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    assert p.stdout.readline() == b"[\n"
    assert json.loads(p.stdout.readline().rstrip(b",\n"))["key"] == "d0/key-with-a-longer-name-0000"
    p.stdout.close()
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGPIPE, p.stderr.read()
    assert s3_gets(s3d) - pages < 6
    # and what it prints whole is one JSON array
    out = json.loads(cli(s3d, "--json", "ls", "-r", f"s3://{bucket}/d5/").stdout)
    assert len(out) == 1000 and out[-1]["key"] == "d5/key-with-a-longer-name-0999"
    assert json.loads(cli(s3d, "--json", "ls", "-r", f"s3://{bucket}/none/").stdout) == []


def s3_gets(d):
    """GET requests the S3 listener has answered so far (from /metrics)."""
    text = requests.get(d.internal_url("/metrics"), timeout=10).text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("sluice_http_requests_total{") and 'method="GET"' in line
               and 'listener="s3"' in line)


def test_cp_to_a_reader_that_goes_away(s3d, bucket):
    # `sluice s3 cp s3://b/k - | head -c 100`: ended by SIGPIPE, as cat is, not by an error
    # message and exit status 1 (which fails a `set -o pipefail` script).
    s3d.boto.put_object(Bucket=bucket, Key="big", Body=os.urandom(16 * MiB))
    env = {"PATH": os.environ["PATH"], "HOME": str(s3d.root), "AWS_ACCESS_KEY_ID": s3d.ak,
           "AWS_SECRET_ACCESS_KEY": s3d.sk}
    p = subprocess.Popen([str(SLUICE), "s3", "cp", f"s3://{bucket}/big", "-", "--s3-endpoint",
                          s3d.s3_url()], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert len(p.stdout.read(100)) == 100
    p.stdout.close()
    p.wait(timeout=60)
    err = p.stderr.read()
    assert p.returncode == -signal.SIGPIPE and b"failed" not in err, (p.returncode, err)


def test_local_symlinks_are_skipped_loudly_and_keep_their_objects(s3d, bucket, tmp_path):
    # Symlinks are not followed: each is named on stderr and counted as skipped, and with
    # sync --delete the object of a symlink's name stays (skipped is not absent).
    src = tmp_path / "tree"
    src.mkdir()
    (src / "real").write_bytes(b"r")
    target = tmp_path / "elsewhere"
    target.write_bytes(b"e")
    s3d.boto.put_object(Bucket=bucket, Key="s/link", Body=b"uploaded before")
    (src / "link").symlink_to(target)
    p = cli(s3d, "sync", "--delete", str(src), f"s3://{bucket}/s")
    assert b"sluice: skip: " in p.stderr and b"a symlink (not followed)" in p.stderr
    assert b"skip:" not in p.stdout and b"1 up to date or skipped" in p.stderr, p.stderr
    assert keys_of(s3d, bucket, "s/") == ["s/link", "s/real"]
    p = cli(s3d, "cp", "-r", str(src), f"s3://{bucket}/c")
    assert b"a symlink (not followed)" in p.stderr and keys_of(s3d, bucket, "c/") == ["c/real"]
    # A symlink to a directory (moved to another disk, say): the objects below its name stay
    # too (before, sync --delete deleted every one of them).
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    s3d.boto.put_object(Bucket=bucket, Key="s/shards/0001", Body=b"shard")
    (src / "shards").symlink_to(elsewhere, target_is_directory=True)
    p = cli(s3d, "sync", "--delete", str(src), f"s3://{bucket}/s")
    assert keys_of(s3d, bucket, "s/shards/") == ["s/shards/0001"], p.stdout
    # The other way, nothing is written through it (before: into other-disk/).
    p = cli(s3d, "sync", f"s3://{bucket}/s", str(src))
    assert list(elsewhere.iterdir()) == [], p.stderr
    assert b"s/shards/0001: a local name on its path is not a directory" in p.stderr, p.stderr


def test_local_files_it_may_not_read_exit_1(s3d, bucket, tmp_path):
    # The CLI run as nobody, on files below root's 0700 test directory: a local EACCES is a
    # plain failure (1), not refused credentials (5) nor a missing tree (3), which it was.
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f").write_bytes(b"f")
    os.chmod(tmp_path, 0o700)
    nobody = as_nobody
    cache = pathlib.Path(tempfile.mkdtemp(prefix="sluice-nobody-"))  # a HOME nobody may write
    os.chmod(cache, 0o777)
    for args in (("cp", str(tmp_path / "tree" / "f"), f"s3://{bucket}/f"),
                 ("cp", "-r", str(tmp_path / "tree"), f"s3://{bucket}/t")):
        p = cli(s3d, *args, check=False, cache=cache, preexec_fn=nobody)
        assert p.returncode == 1, (args, p.returncode, p.stderr)
        assert b"ermission denied" in p.stderr, p.stderr
    shutil.rmtree(cache)


def as_nobody():
    os.setgid(65534)
    os.setuid(65534)


def test_sync_delete_of_a_tree_it_cannot_fully_see_deletes_nothing(s3d, bucket, tmp_path):
    """A directory the CLI (run as nobody) may list but not search, mode 0644: it sees the
    names and cannot stat the files. The walk fails, exit 1, and `sync --delete` deletes
    nothing: before, each such file was passed over as one gone meanwhile, and sync --delete
    deleted its objects and exited 0."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="sluice-walk-"))
    cache = pathlib.Path(tempfile.mkdtemp(prefix="sluice-nobody-"))  # a HOME nobody may write
    try:
        os.chmod(root, 0o755)
        os.chmod(cache, 0o777)
        write_tree(root, {"top": b"t", "logs/a": b"a", "logs/b": b"b"})
        cli(s3d, "sync", str(root), f"s3://{bucket}/p")
        want = ["p/logs/a", "p/logs/b", "p/top"]
        assert sorted(keys_of(s3d, bucket, "p/")) == want
        os.chmod(root / "logs", 0o644)
        for args in (("sync", "--delete", str(root), f"s3://{bucket}/p"),
                     ("cp", "-r", str(root), f"s3://{bucket}/q")):
            p = cli(s3d, *args, check=False, cache=cache, preexec_fn=as_nobody)
            assert p.returncode == 1 and b"ermission denied" in p.stderr, (args, p.stderr)
        assert sorted(keys_of(s3d, bucket, "p/")) == want
        assert keys_of(s3d, bucket, "q/") == []  # nothing of a tree it could not see whole
    finally:
        os.chmod(root / "logs", 0o755)
        shutil.rmtree(root)
        shutil.rmtree(cache)


def test_a_file_written_during_its_multipart_upload_is_not_completed(s3d, bucket, tmp_path):
    """The source of a multipart upload changes while its parts go up (the CLI paused after its
    first part, the file rewritten in place at its size): the upload is not completed and is
    aborted, exit 1, and the key keeps what it held. Before, each part matched its own bytes,
    and the object completed as a splice of the file's two states."""
    src = tmp_path / "image.bin"
    src.write_bytes(os.urandom(64 * MiB))
    s3d.boto.put_object(Bucket=bucket, Key="image.bin", Body=b"before")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": s3d.ak,
           "AWS_SECRET_ACCESS_KEY": s3d.sk}
    proc = subprocess.Popen(
        [str(SLUICE), "s3", "cp", "-j", "1", "--part-size", "5MiB", "--multipart-threshold",
         "5MiB", str(src), f"s3://{bucket}/image.bin", "--s3-endpoint", s3d.s3_url()],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until a part is in
            ups = s3d.boto.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
            if ups and s3d.boto.list_parts(Bucket=bucket, Key="image.bin",
                                           UploadId=ups[0]["UploadId"]).get("Parts"):
                break
            assert proc.poll() is None, "the upload ended before a part was seen"
            time.sleep(0.005)
        pause(proc.pid)
        with open(src, "r+b") as f:  # its last MiB rewritten in place: the size stays
            f.seek(63 * MiB)
            f.write(os.urandom(MiB))
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and b"changed while it was uploaded" in err, err
    assert body_of(s3d, bucket, "image.bin") == b"before"
    assert s3d.boto.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_downloads_leftover_temporary_file_is_not_uploaded(s3d, bucket, tmp_path):
    """A `kill -9` in a download leaves `.sluice-NAME.<16 hex>` (preallocated, mostly zeros):
    an upload of the tree skips it, saying so, and uploads the rest; a name that only looks
    alike is a file like any other."""
    write_tree(tmp_path / "t", {"f": b"f", ".sluice-f.0123456789abcdef": bytes(4096),
                                ".sluice-notes.txt": b"mine"})
    p = cli(s3d, "cp", "-r", str(tmp_path / "t"), f"s3://{bucket}/t")
    assert b"leftover temporary file" in p.stdout + p.stderr, (p.stdout, p.stderr)
    assert sorted(keys_of(s3d, bucket, "t/")) == ["t/.sluice-notes.txt", "t/f"]


def test_downloads_of_names_near_name_max(s3d, bucket, tmp_path):
    # A name of 240 bytes is a file a directory can hold: downloaded whole by cp, cp -r and
    # sync. Before, its temporary (".sluice-NAME.<16 hex>", 25 bytes longer) passed NAME_MAX
    # and every download of it failed with ENAMETOOLONG.
    name = "n" * 240
    s3d.boto.put_object(Bucket=bucket, Key=f"long/{name}", Body=b"long")
    cli(s3d, "cp", f"s3://{bucket}/long/{name}", str(tmp_path / "one") + "/")
    assert (tmp_path / "one" / name).read_bytes() == b"long"
    cli(s3d, "cp", "-r", f"s3://{bucket}/long", str(tmp_path / "tree"))
    assert (tmp_path / "tree" / name).read_bytes() == b"long"
    cli(s3d, "sync", f"s3://{bucket}/long", str(tmp_path / "synced"))
    assert (tmp_path / "synced" / name).read_bytes() == b"long"
    assert not [q for q in tmp_path.rglob(".sluice-*")]


def test_cp_recursive_never_writes_through_a_local_symlink(s3d, bucket, tmp_path):
    # A symlink in the destination tree (dst/link -> outside/) is not followed, as sync does
    # not: the keys below its name are skipped, said on stderr, and nothing lands in outside/
    # (before, p/link/x was written to outside/x and the marker made outside/sub). A symlink
    # of a key's own name stays a symlink. The destination's own path may be one: the user's.
    for k, v in (("p/link/x", b"x"), ("p/link/sub/", b""), ("p/leaf", b"l"), ("p/ok", b"ok"),
                 ("p/d/y", b"y")):
        s3d.boto.put_object(Bucket=bucket, Key=k, Body=v)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_bytes(b"precious")
    real = tmp_path / "real"
    real.mkdir()
    (real / "link").symlink_to(outside, target_is_directory=True)
    (real / "leaf").symlink_to(outside / "file")
    (tmp_path / "dst").symlink_to(real, target_is_directory=True)
    p = cli(s3d, "cp", "-r", f"s3://{bucket}/p", str(tmp_path / "dst"))
    err = p.stderr.decode()
    assert sorted(q.name for q in outside.iterdir()) == ["file"], err
    assert (outside / "file").read_bytes() == b"precious"
    assert (real / "ok").read_bytes() == b"ok" and (real / "d" / "y").read_bytes() == b"y"
    assert (real / "leaf").is_symlink() and (real / "link").is_symlink()
    for k in ("p/link/x", "p/link/sub/", "p/leaf"):
        assert f"sluice: skip: s3://{bucket}/{k}: " in err, err
    assert "a symlink (not followed)" in err and "3 up to date or skipped" in err, err
    assert [q.name for q in real.rglob(".sluice-*")] == []


def test_rm(s3d, bucket):
    # More than one DeleteObjects batch (1000 keys), and a directory marker.
    keys = [f"r/{i:04d}" for i in range(1200)] + ["keep/x", "r/sub/"]
    b = next(b for b in s3d.mgr("GET", "/s3/buckets").json()["buckets"] if b["name"] == bucket)
    root = s3d.vfolder_path(b["vfid"], b["volume"])
    for k in keys:
        p = root / k
        if k.endswith("/"):
            p.mkdir(parents=True, exist_ok=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"z")
    cli(s3d, "rm", f"s3://{bucket}/keep/x")
    assert "keep/x" not in keys_of(s3d, bucket)
    p = cli(s3d, "rm", "-r", "-j", "4", f"s3://{bucket}/r")
    assert keys_of(s3d, bucket, "r/") == []
    assert not (root / "r" / "0001").exists()
    p = cli(s3d, "rm", f"s3://{bucket}", check=False)
    assert p.returncode == 2 and b"--recursive" in p.stderr
    # `rm -r` of a plain object deletes it, as `rm -r FILE` does (before: nothing, silently);
    # of nothing at all, it says so.
    s3d.boto.put_object(Bucket=bucket, Key="keep/plain", Body=b"p")
    p = cli(s3d, "rm", "-r", f"s3://{bucket}/keep/plain")
    assert b"delete: s3://%s/keep/plain" % bucket.encode() in p.stdout, p.stdout
    assert "keep/plain" not in keys_of(s3d, bucket)
    p = cli(s3d, "rm", "-r", f"s3://{bucket}/keep/none")
    assert b"nothing to delete under" in p.stdout + p.stderr, (p.stdout, p.stderr)
    # A delete refused whole says so and exits by why (5: credentials refused), as a copy does;
    # before, it printed "0 files" and exited 1 (with -q, nothing at all).
    p = cli(s3d, "rm", f"s3://{bucket}/keep/y", sk="wrong", check=False)
    assert p.returncode == 5 and b"failed: delete of 1 key" in p.stderr, (p.returncode, p.stderr)
    assert b"SignatureDoesNotMatch" in p.stderr and b"1 FAILED" in p.stderr, p.stderr
    p = cli(s3d, "cp", __file__, "s3://no-such-bucket-here/x", check=False)
    assert p.returncode == 3, (p.returncode, p.stderr)


def test_rm_of_keys_refused_one_by_one_exits_by_why(s3d, bucket):
    """Keys the server refuses inside a DeleteObjects answer (here: files made immutable, which
    even root cannot remove: AccessDenied) are each said, and the exit status says why (5) as
    for a delete refused whole; before, every such failure exited 1."""
    b = next(b for b in s3d.mgr("GET", "/s3/buckets").json()["buckets"] if b["name"] == bucket)
    root = s3d.vfolder_path(b["vfid"], b["volume"])
    (root / "imm").mkdir()
    files = [root / "imm" / n for n in ("a", "b")]
    for f in files:
        f.write_bytes(b"kept")
    subprocess.run(["chattr", "+i", *map(str, files)], check=True)
    try:
        p = cli(s3d, "rm", "-r", f"s3://{bucket}/imm/", check=False)
        assert p.returncode == 5, (p.returncode, p.stderr)
        for n in ("a", "b"):
            assert b"delete failed: imm/%s: AccessDenied" % n.encode() in p.stderr, p.stderr
        assert b"2 FAILED" in p.stderr, p.stderr
        assert all(f.read_bytes() == b"kept" for f in files)
    finally:
        subprocess.run(["chattr", "-i", *map(str, files)], check=True)


def test_get_batch(s3d, bucket, tmp_path):
    objs = {f"train/{i:03d}.jpg": os.urandom(1000 + i) for i in range(50)}
    for k, v in objs.items():
        s3d.boto.put_object(Bucket=bucket, Key=k, Body=v)
    keys = list(objs)
    # To a TAR file, in request order.
    out = tmp_path / "batch.tar"
    p = cli(s3d, "get-batch", "--progress", f"s3://{bucket}", *keys[:10], "-o", str(out))
    # Progress by items (a batch's bytes are not known ahead): before, "100% ... / 0 B" from
    # the start, and "0/10 files" until the end.
    assert b" 10/10 files" in p.stderr and b" / 0 B" not in p.stderr, p.stderr
    with tarfile.open(out) as t:
        names = [m.name for m in t.getmembers()]
        assert names == [f"{bucket}/{k}" for k in keys[:10]] + ["__manifest__.json"]
        assert t.extractfile(f"{bucket}/{keys[3]}").read() == objs[keys[3]]
    # Keys from a file (stdin), extracted as the stream arrives.
    listing = "\n".join(reversed(keys)) + "\n"
    x = tmp_path / "x"
    p = cli(s3d, "get-batch", f"s3://{bucket}", "--keys-from", "-", "-x", str(x),
            stdin=listing.encode())
    assert read_tree(x / bucket) == {k: v for k, v in objs.items()}
    assert b"50 ok, 0 failed" in p.stderr
    manifest = json.loads((x / "__manifest__.json").read_text())
    assert [it["key"] for it in manifest["items"]] == list(reversed(keys))
    # To stdout.
    p = cli(s3d, "get-batch", f"s3://{bucket}", keys[0], "-o", "-")
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as t:
        assert t.extractfile(f"{bucket}/{keys[0]}").read() == objs[keys[0]]
    # A missing key: with --continue-on-error the rest still comes and the exit status says so.
    y = tmp_path / "y"
    p = cli(s3d, "get-batch", f"s3://{bucket}", keys[0], "train/missing", keys[1], "-x", str(y),
            "--continue-on-error", check=False)
    assert p.returncode == 1 and b"2 ok, 1 failed" in p.stderr
    assert (y / bucket / keys[1]).read_bytes() == objs[keys[1]]
    # The same to a TAR file: the stream is walked as it is written, so the exit status and
    # the summary say so there too (and the file holds the placeholder and the manifest).
    w = tmp_path / "w.tar"
    p = cli(s3d, "get-batch", f"s3://{bucket}", keys[0], "train/missing", keys[1], "-o", str(w),
            "--continue-on-error", check=False)
    assert p.returncode == 1 and b"2 received, 2 ok, 1 failed" in p.stderr, p.stderr
    with tarfile.open(w) as t:
        assert [m.name for m in t.getmembers()] == [
            f"{bucket}/{keys[0]}", f"__404__/{bucket}/train/missing", f"{bucket}/{keys[1]}",
            "__manifest__.json"]
    # --json: the summary as JSON, on stderr when the stream takes stdout.
    p = cli(s3d, "--json", "get-batch", f"s3://{bucket}", *keys[:5], "-o", "-")
    summary = json.loads(p.stderr.decode().strip().splitlines()[-1])
    assert summary["items"] == 5 and summary["entries"] == 5 and summary["ok"] == 5
    assert summary["errors"] == 0 and summary["bytes"] == len(p.stdout)
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as t:
        assert len(t.getmembers()) == 6
    p = cli(s3d, "--json", "get-batch", f"s3://{bucket}", *keys[:3], "-o", str(tmp_path / "j.tar"))
    assert json.loads(p.stdout)["entries"] == 3
    # A key that is not UTF-8 (S3 keys are) is refused before anything is sent.
    p = cli(s3d, "get-batch", f"s3://{bucket}", keys[0], b"train/\xff", "-o", "-", check=False)
    assert p.returncode == 2 and b"not UTF-8" in p.stderr and p.stdout == b"", p.stderr
    # Into a FIFO (or /dev/null): written in place, the FIFO left a FIFO.
    p, got = through_fifo(tmp_path / "fifo", lambda: cli(
        s3d, "get-batch", f"s3://{bucket}", *keys[:4], "-o", str(tmp_path / "fifo")))
    assert b"4 received, 4 ok, 0 failed" in p.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    with tarfile.open(fileobj=io.BytesIO(got)) as t:
        assert t.extractfile(f"{bucket}/{keys[2]}").read() == objs[keys[2]]


def test_cp_streams_stdin_and_stdout(s3d, bucket, tmp_path):
    # '-' as the source uploads stdin: one PUT when it ends within a part, else a multipart
    # upload of --part-size parts (its ETag says how many); '-' as the destination writes the
    # object, and only the object, to stdout.
    small, big = os.urandom(3000), os.urandom(11 * MiB + 7)
    cli(s3d, "cp", "-", f"s3://{bucket}/in/small", stdin=small)
    # (Sizes as every sluice command takes them: 5m is 5 MiB.)
    p = cli(s3d, "cp", "--part-size", "5m", "-", f"s3://{bucket}/in/big", stdin=big)
    assert b"upload: - -> s3://" in p.stdout
    head = s3d.boto.head_object(Bucket=bucket, Key="in/big")
    assert head["ContentLength"] == len(big) and head["ETag"].endswith('-3"')
    assert s3d.boto.get_object(Bucket=bucket, Key="in/big")["Body"].read() == big
    assert s3d.boto.get_object(Bucket=bucket, Key="in/small")["Body"].read() == small
    for key, body in (("in/small", small), ("in/big", big)):
        p = cli(s3d, "cp", "--multipart-threshold", "5MiB", f"s3://{bucket}/{key}", "-")
        assert p.stdout == body and b"download: s3://" in p.stderr
    assert not (tmp_path / "-").exists() and not (s3d.root / "-").exists()
    # An empty stdin is an empty object; a prefix cannot go to stdout.
    cli(s3d, "cp", "-", f"s3://{bucket}/in/empty", stdin=b"")
    assert s3d.boto.head_object(Bucket=bucket, Key="in/empty")["ContentLength"] == 0
    p = cli(s3d, "cp", "-r", f"s3://{bucket}/in/", "-", check=False)
    assert p.returncode == 2 and b"stdout" in p.stderr
    p = cli(s3d, "cp", "-", f"s3://{bucket}/in/", stdin=b"x", check=False)
    assert p.returncode == 2 and b"s3://BUCKET/KEY" in p.stderr
    p = cli(s3d, "cp", "--part-size", "5MiB", "-", "s3://no-such-bucket-here/x", stdin=big,
            check=False)
    assert p.returncode == 3 and b"NoSuchBucket" in p.stderr


def test_a_failed_upload_without_resume_leaves_no_upload(s3d, tmp_path):
    # --no-resume: nothing will pick the parts up again, so a failed multipart upload is
    # aborted (on AWS its parts would be billed until a lifecycle rule removed them).
    name, s3, ak, sk, _ = limited_bucket(s3d, 12 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(20 * MiB))
    p = cli(s3d, "cp", "--no-resume", "-j", "1", "--part-size", "5MiB", "--multipart-threshold",
            "5MiB", str(src), f"s3://{name}/big.bin", ak=ak, sk=sk, check=False)
    assert p.returncode == 1 and b"QuotaExceeded" in p.stderr, p.stderr
    assert s3.list_multipart_uploads(Bucket=name).get("Uploads", []) == []


def test_a_path_that_is_not_utf8_uploads_in_parts(s3d, bucket, tmp_path):
    # The resume state of a multipart upload names its source: a path that is not UTF-8 is
    # kept with replacement characters (it used to abort the CLI from a worker thread).
    data = os.urandom(6 * MiB)
    src = os.path.join(bytes(tmp_path), b"caf\xe9.bin")
    with open(src, "wb") as f:
        f.write(data)
    cli(s3d, "cp", "--part-size", "5MiB", "--multipart-threshold", "5MiB", src,
        f"s3://{bucket}/cafe.bin")
    assert s3d.boto.get_object(Bucket=bucket, Key="cafe.bin")["Body"].read() == data


def test_a_stream_upload_that_fails_leaves_no_upload(s3d):
    # A quota scope that holds two 5 MiB parts, not three: stdin cannot be re-read, so the
    # upload is aborted, parts and all, and nothing is visible.
    name, s3, ak, sk, _ = limited_bucket(s3d, 12 * MiB)
    p = cli(s3d, "cp", "--part-size", "5MiB", "-", f"s3://{name}/stream.bin", ak=ak, sk=sk,
            stdin=os.urandom(20 * MiB), check=False)
    assert p.returncode == 1 and b"QuotaExceeded" in p.stderr, p.stderr
    assert s3.list_multipart_uploads(Bucket=name).get("Uploads", []) == []
    with pytest.raises(Exception):
        s3.head_object(Bucket=name, Key="stream.bin")


def test_an_interrupted_download_leaves_no_temporary_file(s3d, bucket, tmp_path):
    # Ctrl-C (SIGINT) while a download runs: its `.sluice-NAME.RANDOM` (preallocated to the
    # object's size) goes, and the command dies of the signal as it would without cleaning.
    # The daemon is paused once the temporary file exists, so that the download cannot end
    # before the signal comes.
    s3d.boto.put_object(Bucket=bucket, Key="big", Body=os.urandom(64 * MiB))
    env = {"PATH": os.environ["PATH"], "HOME": str(s3d.root), "AWS_ACCESS_KEY_ID": s3d.ak,
           "AWS_SECRET_ACCESS_KEY": s3d.sk}
    dst = tmp_path / "dl"
    dst.mkdir()
    p = subprocess.Popen([str(SLUICE), "s3", "cp", "--multipart-threshold", "5MiB",
                          "--part-size", "5MiB", "-j", "2", f"s3://{bucket}/big", str(dst / "big"),
                          "--s3-endpoint", s3d.s3_url()], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    paused = False
    try:
        deadline = time.monotonic() + 30
        while not any(n.startswith(".sluice-big.") for n in os.listdir(dst)):
            assert p.poll() is None and time.monotonic() < deadline, "no temporary file seen"
            time.sleep(0.0005)
        pause(s3d.proc.pid)
        paused = True
        assert p.poll() is None, "the download ended before it could be interrupted"
        p.send_signal(signal.SIGINT)
        p.wait(timeout=30)
    finally:
        if paused:
            os.kill(s3d.proc.pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == -signal.SIGINT
    assert os.listdir(dst) == []


def test_s3_commands_do_not_read_the_managers_settings(s3d, bucket, tmp_path):
    # A manager endpoint that does not parse, or a manager token file that cannot be read, is
    # nothing to the S3 commands, which never use them.
    s3d.boto.put_object(Bucket=bucket, Key="k", Body=b"v")
    env = {"PATH": os.environ["PATH"], "HOME": str(s3d.root), "AWS_ACCESS_KEY_ID": s3d.ak,
           "AWS_SECRET_ACCESS_KEY": s3d.sk, "SLUICE_ENDPOINT": "not a url"}
    for pre in ([], ["--token-file", str(tmp_path / "missing.secret")]):
        p = subprocess.run([str(SLUICE), *pre, "s3", "ls", f"s3://{bucket}/", "--s3-endpoint",
                            s3d.s3_url()], env=env, capture_output=True, timeout=60)
        assert p.returncode == 0 and b" k\n" in p.stdout, p.stderr
    p = subprocess.run([str(SLUICE), "--timeout", "0", "s3", "ls", f"s3://{bucket}/"], env=env,
                       capture_output=True, timeout=60)
    assert p.returncode == 2 and b"--timeout" in p.stderr


def test_stdout_by_another_name_is_stdout(s3d, bucket, tmp_path):
    # /dev/stdout is stdout: the object alone goes there (the messages to stderr), whether
    # stdout is a pipe or a regular file; nothing is renamed over the name. (A link of our own
    # to /proc/self/fd/1, as /dev/stdout is, so that a regression replaces nothing of the
    # machine's.)
    body = os.urandom(5000)
    s3d.boto.put_object(Bucket=bucket, Key="o", Body=body)
    stdout = tmp_path / "stdout"
    stdout.symlink_to("/proc/self/fd/1")
    p = cli(s3d, "cp", f"s3://{bucket}/o", str(stdout))
    assert p.stdout == body and b"download:" in p.stderr
    out = tmp_path / "redirected"
    env = {"PATH": os.environ["PATH"], "HOME": str(s3d.root), "AWS_ACCESS_KEY_ID": s3d.ak,
           "AWS_SECRET_ACCESS_KEY": s3d.sk}
    with open(out, "wb") as f:
        p = subprocess.run([str(SLUICE), "s3", "cp", f"s3://{bucket}/o", str(stdout),
                            "--s3-endpoint", s3d.s3_url()], env=env, stdout=f,
                           stderr=subprocess.PIPE, timeout=60)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes() == body and stdout.is_symlink()
    p = cli(s3d, "get-batch", f"s3://{bucket}", "o", "-o", str(stdout))
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as t:
        assert t.extractfile(f"{bucket}/o").read() == body


def test_get_batch_dry_run_and_a_symlinked_directory(s3d, bucket, tmp_path):
    s3d.boto.put_object(Bucket=bucket, Key="a/b", Body=b"bee")
    p = cli(s3d, "get-batch", f"s3://{bucket}", "a/b", "-o", str(tmp_path / "t.tar"),
            "--dry-run")
    assert b"(dry run) get: s3://" in p.stderr and not (tmp_path / "t.tar").exists()
    # The extraction directory's own path may go through a symlink (a scratch disk mounted
    # elsewhere); entries still may not.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    cli(s3d, "get-batch", f"s3://{bucket}", "a/b", "-x", str(tmp_path / "link" / "x"))
    assert (real / "x" / bucket / "a" / "b").read_bytes() == b"bee"


def test_cp_into_a_fifo_writes_in_place(s3d, bucket, tmp_path):
    # A download into an existing file that is not a regular one (/dev/null, a FIFO) writes
    # there, whole and in order, even when the object is big enough for ranged parts; it is
    # never replaced by a renamed temporary (as root that would replace /dev/null itself).
    small, big = os.urandom(1000), os.urandom(12 * MiB + 5)
    s3d.boto.put_object(Bucket=bucket, Key="small", Body=small)
    s3d.boto.put_object(Bucket=bucket, Key="big", Body=big)
    for key, body in (("small", small), ("big", big)):
        fifo = tmp_path / f"fifo-{key}"
        _, got = through_fifo(fifo, lambda: cli(s3d, "cp", "--multipart-threshold", "5MiB",
                                                f"s3://{bucket}/{key}", str(fifo)))
        assert got == body and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo-big", "fifo-small"]  # no temporary left
    # Only a destination named on the command line is written in place: a FIFO met in a tree
    # that a recursive copy fills is replaced like any other file (opening it would wait for a
    # reader that never comes).
    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "small")
    cli(s3d, "cp", "-r", f"s3://{bucket}/", str(tree), timeout=60)
    assert (tree / "small").read_bytes() == small and (tree / "big").read_bytes() == big
    # Without it the request fails naming the item, and nothing is written.
    z = tmp_path / "z.tar"
    p = cli(s3d, "get-batch", f"s3://{bucket}", "train/missing", "-o", str(z), check=False)
    assert p.returncode == 3 and b"NoSuchKey" in p.stderr
    assert not z.exists()


def test_bench_reads_every_object_once_an_epoch(s3d, bucket):
    sizes = {f"train/part{i % 3}/s{i:03d}": (i * 977) % 20000 for i in range(45)}
    for k, n in sizes.items():
        s3d.boto.put_object(Bucket=bucket, Key=k, Body=os.urandom(n))
    s3d.boto.put_object(Bucket=bucket, Key="train/part1/", Body=b"")  # a marker: not read
    s3d.boto.put_object(Bucket=bucket, Key="other", Body=b"not under the prefix")
    js = json.loads(cli(s3d, "--json", "bench", "-j", "4", "--epochs", "3", "--shuffle",
                        f"s3://{bucket}/train/").stdout)
    assert [e["epoch"] for e in js] == [1, 2, 3]
    for e in js:
        assert e["objects"] == len(sizes) and e["bytes"] == sum(sizes.values())
        assert e["objects_per_second"] > 0 and e["seconds"] > 0
        assert 0 < e["latency_ms"]["p50"] <= e["latency_ms"]["p99"] <= e["latency_ms"]["max"]
    text = cli(s3d, "bench", "-j", "2", f"s3://{bucket}/train/part2/").stdout.decode()
    want = sum(1 for k in sizes if k.startswith("train/part2/"))
    assert text.startswith(f"epoch 1: {want} objects, ") and "objects/s" in text, text
    # Nothing there, or no such bucket: the not-found exit status and a message.
    p = cli(s3d, "bench", f"s3://{bucket}/nothing/", check=False)
    assert p.returncode == 3 and b"no objects under" in p.stderr
    p = cli(s3d, "bench", "s3://no-such-bucket-here/", check=False)
    assert p.returncode == 3 and b"NoSuchBucket" in p.stderr


def test_bench_fails_on_an_object_it_cannot_read(tmp_path):
    vol = tmp_path / "vol-faulty"
    vol.mkdir()
    faulty = toml_section("volume.faulty", {
        "backend": "vfs", "path": str(vol),
        "faults": [{"op": "read", "path": "*bad*", "error": "EIO", "after": "1k"}]})
    with running_daemon(tmp_path / "d", volumes={"faulty": vol}, s3={},
                        extra_toml=faulty) as d:
        d.user = d.s3_user(volume="faulty")["id"]
        d.ak, d.sk = d.s3_key(d.user)
        d.boto = d.s3_client(d.ak, d.sk)
        d.boto.create_bucket(Bucket="faulty-data")
        for k in ("a-good", "b-bad", "c-good"):
            d.boto.put_object(Bucket="faulty-data", Key=k, Body=os.urandom(64 << 10))
        p = cli(d, "bench", "-j", "1", "s3://faulty-data/", check=False, timeout=300)
        assert p.returncode != 0 and b"b-bad" in p.stderr, p.stderr
        assert b"epoch 1:" not in p.stdout  # no figures for an epoch that failed


class FakeOrigin(http.server.BaseHTTPRequestHandler):
    """An S3 origin that misbehaves as told by the server's `mode`: "ignore-range" answers every
    GET with the whole object (200, as a server or proxy ignoring Range may); "cut-then-change"
    cuts its first GET halfway and then serves another version; "cut-same" cuts its first GET
    and then serves the rest of the same version."""
    protocol_version = "HTTP/1.1"

    def version(self):
        return self.server.versions[min(self.server.gets, len(self.server.versions) - 1)]

    def do_HEAD(self):
        etag, body = self.version()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Last-Modified", "Wed, 02 Dec 2026 00:00:00 GMT")
        self.end_headers()

    def do_GET(self):
        etag, body = self.version()
        first_get = self.server.gets == 0
        self.server.gets += 1
        rng = self.headers.get("Range")
        match = self.headers.get("If-Match")
        if match and match.strip('"') != etag:
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start = 0
        if rng and self.server.mode != "ignore-range":
            a, _, b = rng[len("bytes="):].partition("-")
            start, end = int(a), int(b) if b else len(body) - 1
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(body)}")
            part = body[start:end + 1]
        else:
            self.send_response(200)
            part = body
        self.send_header("Content-Length", str(len(part)))
        self.send_header("ETag", f'"{etag}"')
        self.end_headers()
        if first_get and self.server.mode.startswith("cut"):
            self.wfile.write(part[:len(part) // 2])  # and the connection goes
            self.close_connection = True
            return
        self.wfile.write(part)

    def log_message(self, *args):
        pass


def test_what_an_origin_answers_is_checked(tmp_path):
    # A ranged GET answered with the whole object, or a transfer resumed after the object
    # changed, fails the download (nothing written) instead of stitching wrong bytes.
    one, two = os.urandom(12 * MiB + 3), os.urandom(12 * MiB + 3)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "AK",
           "AWS_SECRET_ACCESS_KEY": "SK"}
    for mode, versions, ok in (("ignore-range", [("v1", one)], False),
                               ("cut-then-change", [("v1", one), ("v2", two)], False),
                               ("cut-same", [("v1", one)], True)):
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeOrigin)
        srv.mode, srv.versions, srv.gets = mode, versions, 0
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        dst = tmp_path / f"{mode}.bin"
        try:
            args = (["--multipart-threshold", "5MiB", "--part-size", "5MiB"]
                    if mode == "ignore-range" else ["--multipart-threshold", "1GiB"])
            p = subprocess.run([str(SLUICE), "s3", "cp", *args, "s3://bkt/obj", str(dst),
                                "--s3-endpoint", f"http://127.0.0.1:{srv.server_address[1]}"],
                               env=env, capture_output=True, timeout=120)
        finally:
            srv.shutdown()
        if ok:
            assert p.returncode == 0 and dst.read_bytes() == one, p.stderr
        else:
            assert p.returncode != 0 and not dst.exists(), (mode, p.stderr)
            assert (b"not the range asked for" if mode == "ignore-range"
                    else b"changed while it was read") in p.stderr, p.stderr


def foreign_batch(tmp_path, stream, *args, trickle_after=None, sent=None):
    """`sluice s3 get-batch s3://b ARGS...` against a server that is not Sluice's (hostile, or a
    proxy), which answers every batch get with `stream` as its TAR: at once, or its first
    `trickle_after` bytes at once and the rest 4 KiB every 10 ms. `sent`, a list, gets the
    number of bytes written before the client went away."""

    class Batch(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Length", str(len(stream)))
            self.end_headers()
            at = 0
            try:
                if trickle_after is None:
                    self.wfile.write(stream)
                    at = len(stream)
                else:
                    self.wfile.write(stream[:trickle_after])
                    at = trickle_after
                    while at < len(stream):
                        time.sleep(0.01)
                        self.wfile.write(stream[at:at + 4096])
                        self.wfile.flush()
                        at += 4096
            except OSError:
                pass  # the client stopped reading
            if sent is not None:
                sent.append(at)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Batch)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "AK",
           "AWS_SECRET_ACCESS_KEY": "SK"}
    try:
        return subprocess.run([str(SLUICE), "s3", "get-batch", "s3://b", *args, "--s3-endpoint",
                               f"http://127.0.0.1:{srv.server_address[1]}"],
                              env=env, capture_output=True, timeout=60)
    finally:
        srv.shutdown()


def test_get_batch_extracts_only_files(tmp_path):
    """A batch stream from a server that is not Sluice's (hostile, or a proxy) may hold a hard
    link naming any file: `get-batch -x` refuses it instead of linking that file in and
    writing the entry's data into it, and stops receiving the stream."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        ok = tarfile.TarInfo("b/first")
        ok.size = 2
        t.addfile(ok, io.BytesIO(b"ok"))
        link = tarfile.TarInfo("b/x")
        link.type = tarfile.LNKTYPE
        link.linkname = str(victim)
        t.addfile(link)
        # Far more behind it than the client holds in flight: the walk that stops at the link
        # must stop the receiving side too, which otherwise waits for the walk forever.
        rest = tarfile.TarInfo("b/rest")
        rest.size = 32 << 20
        t.addfile(rest, io.BytesIO(bytes(rest.size)))
    stream = buf.getvalue()
    p = foreign_batch(tmp_path, stream, "first", "x", "-x", str(tmp_path / "out"))
    assert p.returncode != 0 and b"is a hard link, not an object" in p.stderr, p.stderr
    assert victim.read_bytes() == b"precious" and victim.stat().st_nlink == 1
    assert (tmp_path / "out" / "b" / "first").read_bytes() == b"ok"


def test_get_batch_stops_receiving_once_its_walk_failed(tmp_path):
    """The walk of a batch stream refuses an entry (a hard link) while the server trickles the
    rest: the command stops receiving at the next piece that comes, rather than filling one
    more 256 KiB block first (at 400 KiB/s here, or until the stall timeout from a server
    slower than libcurl's 64 KiB/s floor)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        link = tarfile.TarInfo("b/x")
        link.type = tarfile.LNKTYPE
        link.linkname = "/etc/passwd"
        t.addfile(link)
        rest = tarfile.TarInfo("b/rest")
        rest.size = 4 << 20
        t.addfile(rest, io.BytesIO(bytes(rest.size)))
    sent = []
    # The first block (256 KiB) reaches the walk whole; what follows comes slowly.
    p = foreign_batch(tmp_path, buf.getvalue(), "x", "-x", str(tmp_path / "out"),
                      trickle_after=300 << 10, sent=sent)
    assert p.returncode != 0 and b"is a hard link, not an object" in p.stderr, p.stderr
    deadline = time.time() + 30
    while not sent and time.time() < deadline:
        time.sleep(0.05)
    # Before the fix the client took a second block (to 512 KiB) before it closed.
    assert sent and sent[0] < (300 << 10) + (64 << 10), sent


def test_get_batch_requires_the_manifest_that_ends_a_whole_stream(tmp_path):
    """A stream that ends at an entry's boundary (TAR needs no end blocks: a proxy that closes
    without framing) or with end blocks but no manifest, or whose manifest counts fewer items
    than were asked for, fails `get-batch` and leaves no `-o` file: it read as a whole batch
    and exited 0 before. The same stream with a manifest that counts every item passes."""
    def stream(manifest, end_blocks=True):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
            for name in ("b/one", "b/two"):
                e = tarfile.TarInfo(name)
                e.size = 3
                t.addfile(e, io.BytesIO(b"abc"))
            if manifest is not None:
                m = tarfile.TarInfo("__manifest__.json")
                m.size = len(manifest)
                t.addfile(m, io.BytesIO(manifest))
        data = buf.getvalue()
        return data if end_blocks else data[:2 * 1024]  # the two entries, nothing after
    whole = b'{"items":[],"ok":2,"errors":0}\n'
    out = tmp_path / "batch.tar"
    p = foreign_batch(tmp_path, stream(whole), "one", "two", "-o", str(out))
    assert p.returncode == 0 and out.exists(), p.stderr
    out.unlink()
    for data, why in ((stream(None, end_blocks=False), b"without its manifest, after 2 of 2"),
                      (stream(None), b"without its manifest"),
                      (stream(b'{"items":[],"ok":1,"errors":0}\n'), b"counts 1 items, not the 2"),
                      (stream(b'[1,2]'), b"manifest is not a JSON object")):
        p = foreign_batch(tmp_path, data, "one", "two", "-o", str(out))
        assert p.returncode != 0 and why in p.stderr, (why, p.stderr)
        assert not out.exists() and not list(tmp_path.glob(".sluice-*")), why
    p = foreign_batch(tmp_path, stream(None), "one", "two", "-x", str(tmp_path / "x"))
    assert p.returncode != 0 and b"without its manifest" in p.stderr, p.stderr


def test_get_batch_to_stdout_of_a_broken_stream_writes_only_what_came(tmp_path):
    """`get-batch -o -` of a stream that turns to garbage after its first entry, with megabytes
    behind: the walk fails and the command exits non-zero, and what reached stdout is the
    stream as served up to where it stopped, each byte once (a block handed to the output
    just as the walk stopped was written twice by the first in-memory handoff)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        ok = tarfile.TarInfo("b/first")
        ok.size = 1000
        t.addfile(ok, io.BytesIO(os.urandom(ok.size)))
    stream = buf.getvalue()[:1536] + os.urandom(8 << 20)  # no end blocks: garbage follows
    for _ in range(3):  # the stop lands at a different block each time
        p = foreign_batch(tmp_path, stream, "first", "-o", "-")
        assert p.returncode != 0, p.stderr
        assert len(p.stdout) >= 1536 and stream.startswith(p.stdout), (len(p.stdout), p.stderr)


def test_get_batch_cut_mid_entry_leaves_no_partial_file(tmp_path):
    """A batch stream cut in an entry's data (a header promising 1 MiB, 100 KiB sent, then the
    connection gone) fails `get-batch -x` and leaves nothing under the entry's name: before,
    freeing libarchive's writer finished the entry, padding it with zeros to its size and
    giving it the header's time, a file a later sync took for the object. A file already there
    keeps what it held, and no temporary file is left."""
    head = tarfile.TarInfo("b/big")
    head.size, head.mtime = MiB, 1_700_000_000
    cut = head.tobuf(format=tarfile.USTAR_FORMAT) + os.urandom(100 << 10)

    class Cut(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            assert "batch-get" in self.path
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            if self.server.mode == "short":  # promised whole, then cut
                self.send_header("Content-Length", str(512 + MiB + 1024))
            self.end_headers()
            self.wfile.write(cut)  # and the connection goes
            self.close_connection = True

        def log_message(self, *args):
            pass

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "AK",
           "AWS_SECRET_ACCESS_KEY": "SK"}
    for mode, before in (("short", None), ("eof", None), ("short", b"old"), ("eof", b"old")):
        out = tmp_path / f"out-{mode}-{before is not None}"
        if before is not None:
            (out / "b").mkdir(parents=True)
            (out / "b" / "big").write_bytes(before)
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cut)
        srv.mode = mode
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            p = subprocess.run([str(SLUICE), "s3", "get-batch", "s3://b", "big", "-x", str(out),
                                "--s3-endpoint", f"http://127.0.0.1:{srv.server_address[1]}"],
                               env=env, capture_output=True, timeout=120)
        finally:
            srv.shutdown()
        assert p.returncode != 0, (mode, p.stderr)
        if before is None:
            assert not (out / "b" / "big").exists(), (mode, p.stderr)
        else:
            assert (out / "b" / "big").read_bytes() == before, (mode, p.stderr)
        assert [q.name for q in out.rglob(".sluice-*")] == [], mode


def test_virtual_hosted_addressing(tmp_path):
    """--addressing virtual puts the bucket in the host name (bucket.host/key): seen on the wire
    by a server that records what it is sent, and signed so that a Sluice with [api.s3] domain
    takes it (libcurl resolves *.localhost to the loopback address)."""
    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.headers["Host"], self.path))
            body = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name>'
                    b"<IsTruncated>false</IsTruncated><Contents><Key>pre/one</Key>"
                    b"<LastModified>2026-12-02T00:00:00.000Z</LastModified><ETag>\"x\"</ETag>"
                    b"<Size>3</Size></Contents></ListBucketResult>")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "AK",
           "AWS_SECRET_ACCESS_KEY": "SK"}
    try:
        for style, host, path in (("virtual", f"bkt.localhost:{port}", "/?"),
                                  ("path", f"localhost:{port}", "/bkt?")):
            seen.clear()
            p = subprocess.run([str(SLUICE), "s3", "ls", "-r", "-j", "1", "--addressing", style,
                                "s3://bkt/pre/", "--s3-endpoint", f"http://localhost:{port}"],
                               env=env, capture_output=True, text=True, timeout=60)
            assert p.returncode == 0 and "pre/one" in p.stdout, p.stderr
            assert seen and all(h == host and q.startswith(path) for h, q in seen), seen
    finally:
        srv.shutdown()
    # A real Sluice with a domain: signatures over the virtual-hosted request hold.
    with running_daemon(tmp_path / "vh", s3={"domain": "localhost"}) as d:
        d.ak, d.sk = d.s3_key(d.s3_user()["id"])
        d.root = tmp_path
        d.s3_client(d.ak, d.sk).create_bucket(Bucket="vhosted")
        src = tmp_path / "up.bin"
        src.write_bytes(os.urandom(70000))
        url = f"http://localhost:{d.s3_port}"
        env.update(AWS_ACCESS_KEY_ID=d.ak, AWS_SECRET_ACCESS_KEY=d.sk)
        for args in (["cp", str(src), "s3://vhosted/k/up.bin"],
                     ["cp", "s3://vhosted/k/up.bin", str(tmp_path / "down.bin")]):
            p = subprocess.run([str(SLUICE), "s3", *args, "--addressing", "virtual",
                                "--s3-endpoint", url], env=env, capture_output=True, text=True,
                               timeout=60)
            assert p.returncode == 0, p.stderr
        assert (tmp_path / "down.bin").read_bytes() == src.read_bytes()


def test_https(tmp_path):
    from test_s3_sdks import self_signed

    cert, key = self_signed(tmp_path)
    opts = {"ssl-enabled": True, "ssl-cert": str(cert), "ssl-privkey": str(key)}
    with running_daemon(tmp_path / "d", s3=opts) as d:
        d.ak, d.sk = d.s3_key(d.s3_user()["id"])
        name = f"tls-{uuid.uuid4().hex[:8]}"
        src = tmp_path / "f.bin"
        data = os.urandom(100_000)
        src.write_bytes(data)
        # An unknown certificate is refused (unreachable: exit 6) and nothing is sent.
        p = cli(d, "ls", check=False)
        assert p.returncode == 6 and b"certificate" in p.stderr.lower()
        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=d.s3_url(), aws_access_key_id=d.ak,
                          aws_secret_access_key=d.sk, region_name="us-east-1", verify=str(cert),
                          config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=name)
        cli(d, "cp", "--ca-file", str(cert), str(src), f"s3://{name}/f.bin")
        assert s3.get_object(Bucket=name, Key="f.bin")["Body"].read() == data
        p = subprocess.run([str(SLUICE), "--insecure", "s3", "ls", f"s3://{name}",
                            "--s3-endpoint", d.s3_url()], capture_output=True,
                           env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                                "AWS_ACCESS_KEY_ID": d.ak, "AWS_SECRET_ACCESS_KEY": d.sk})
        assert p.returncode == 0 and b"f.bin" in p.stdout
