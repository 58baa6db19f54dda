"""Smoke test of the CephFS test tooling (tests/tools/ceph-cluster.sh through the session
fixture in conftest.py): the mount is ceph-fuse, quota xattrs work, and a quota stops writes."""

import errno
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

MiB = 1 << 20

# Appends 1 MiB with fsync, at most one MiB per 1/RATE s, until EDQUOT, max_bytes bytes or the
# deadline; prints JSON. Run in a child process so that a write stuck in the file system cannot
# hang the test run.
WRITER = r"""
import errno, json, os, sys, time
path, max_bytes, secs, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
t0 = time.monotonic()
written, err = 0, None
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
buf = b"q" * (1 << 20)
try:
    while written < max_bytes and time.monotonic() - t0 < secs:
        n = os.write(fd, buf)
        os.fsync(fd)
        written += n
        time.sleep(max(0.0, t0 + (written >> 20) / rate - time.monotonic()))
except OSError as e:
    err = e.errno
finally:
    try:
        os.close(fd)
    except OSError as e:
        err = err or e.errno
print(json.dumps({"written": written, "errno": err}))
"""


def fresh(mount):
    d = mount / f"t-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    return d


def wait_xattr(path, name, want, timeout=20.0):
    """Polls an rstat xattr until it equals want; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = int(os.getxattr(path, name))
        if v == want or time.monotonic() > deadline:
            return v
        time.sleep(0.1)


def test_mount_is_ceph_fuse(cephfs_mount):
    with open("/proc/self/mounts") as f:
        types = {line.split()[1]: line.split()[2] for line in f}
    assert types.get(str(cephfs_mount)) == "fuse.ceph-fuse", types.get(str(cephfs_mount))
    st = os.statvfs(cephfs_mount)  # the tool waits for the mgr's usage figures
    assert st.f_blocks > 0 and st.f_bavail > 0, st


def test_quota_xattrs(cephfs_mount):
    d = fresh(cephfs_mount)
    os.setxattr(d, "ceph.quota.max_bytes", b"10000000")
    os.setxattr(d, "ceph.quota.max_files", b"1000")
    assert os.getxattr(d, "ceph.quota.max_bytes") == b"10000000"
    assert os.getxattr(d, "ceph.quota.max_files") == b"1000"
    # 0 removes a limit; with neither left the directory has no quota.
    os.setxattr(d, "ceph.quota.max_bytes", b"0")
    assert os.getxattr(d, "ceph.quota.max_bytes") == b"0"
    os.setxattr(d, "ceph.quota.max_files", b"0")
    with pytest.raises(OSError) as e:
        os.getxattr(d, "ceph.quota.max_bytes")
    assert e.value.errno == errno.ENODATA


def test_rstats_follow_writes(cephfs_mount):
    d = fresh(cephfs_mount)
    sub = d / "a" / "b"
    sub.mkdir(parents=True)
    for i in range(3):
        with open(sub / f"f{i}", "wb") as f:
            f.write(b"r" * MiB)
            os.fsync(f.fileno())
    # The tool's MDS settings bring this to ~2 s; allow plenty.
    assert wait_xattr(d, "ceph.dir.rbytes", 3 * MiB) == 3 * MiB
    # rentries counts the directory itself: d, a, b and three files.
    assert wait_xattr(d, "ceph.dir.rentries", 6) == 6


def test_writes_past_quota_get_edquot(cephfs_mount):
    d = fresh(cephfs_mount)
    limit = 8 * MiB
    os.setxattr(d, "ceph.quota.max_bytes", str(limit).encode())
    (d / "vf" / "sub").mkdir(parents=True)
    target = d / "vf" / "sub" / "big"
    # CephFS enforces quotas lazily: a client learns of EDQUOT about once a second, so writes
    # overshoot by up to ~1 s of their rate (bench/bench_ceph_overshoot.py). At 32 MiB/s the
    # overshoot stays far below the cap; unthrottled, 80 MiB can go through in 0.6 s.
    cap = limit + 256 * MiB
    try:
        r = subprocess.run([sys.executable, "-c", WRITER, str(target), str(cap), "30", "32"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["errno"] == errno.EDQUOT, out
        assert limit // 2 <= out["written"] <= limit + 128 * MiB, out
    finally:
        shutil.rmtree(d, ignore_errors=True)  # the session cluster's OSD keeps data in RAM
