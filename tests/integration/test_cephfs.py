"""The cephfs backend against a real single-node Ceph (mon, osd on memstore, mds), mounted with
ceph-fuse by tests/tools/ceph-cluster.sh (the session's `cephfs_cluster` fixture in conftest)."""

import errno
import os
import re
import subprocess
import time
import uuid

import pytest

from conftest import BIN_DIR, new_qsid, new_vfid, problem, running_daemon, toml_section
from test_upload import new_session, patch

MiB = 1 << 20
RSTAT_WAIT = 30.0  # ceph.dir.rbytes reaches the MDS seconds after a write


@pytest.fixture(scope="module")
def volume_dir(cephfs_mount):
    d = cephfs_mount / f"sluice-it-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, volume_dir):
    with running_daemon(
        tmp_path_factory.mktemp("sluiced-ceph"),
        volumes={"ceph": volume_dir},
        extra_toml=toml_section("volume.ceph", {"backend": "cephfs", "path": str(volume_dir)}),
    ) as d:
        yield d


def xattr(path, name):
    try:
        return int(os.getxattr(path, name))
    except OSError as e:
        if e.errno == errno.ENODATA:
            return None
        raise


def scope(daemon, method, qsid, **extra):
    return daemon.mgr(method, "/quota-scope", json={"volume": "ceph", "qsid": qsid, **extra})


def usage(daemon, vfid):
    r = daemon.mgr("GET", "/folder/usage", json={"volume": "ceph", "vfid": vfid})
    assert r.status_code == 200, r.text
    return r.json()


def eventually(fn, timeout=RSTAT_WAIT):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"not reached within {timeout}s (last: {last!r})")


def test_conformance_suite_on_cephfs(cephfs_mount):
    """The interface and POSIX layout suites (tests/unit/volume), their cephfs instances."""
    scratch = cephfs_mount / f"conformance-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    r = subprocess.run(
        [str(BIN_DIR / "sluice_unit_tests"), "--gtest_filter=Backends/VolumeInterface.*/cephfs:Backends/PosixLayout.*/cephfs"],
        env={**os.environ, "SLUICE_TEST_CEPHFS": str(scratch)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = re.search(r"\[  PASSED  \] (\d+) tests?", r.stdout)
    assert passed and int(passed.group(1)) >= 13, r.stdout[-2000:]


def test_volume_is_listed_as_cephfs(daemon):
    vols = {v["name"]: v for v in daemon.mgr("GET", "/volumes").json()["volumes"]}
    assert vols["ceph"]["backend"] == "cephfs"
    assert {"vfolder", "quota", "metric", "fast-size"} <= set(vols["ceph"]["capabilities"])
    r = daemon.mgr("GET", "/volume/hwinfo", json={"volume": "ceph"})
    assert r.status_code == 200 and r.json()["status"] == "healthy", r.text


def test_scope_limit_is_the_quota_xattr(daemon, volume_dir):
    qsid = new_qsid()
    r = scope(daemon, "POST", qsid, options={"limit_bytes": 64 * MiB})
    assert r.status_code == 204, r.text
    sdir = daemon.scope_path(qsid, volume="ceph")
    assert xattr(sdir, "ceph.quota.max_bytes") == 64 * MiB
    r = scope(daemon, "PATCH", qsid, options={"limit_bytes": 32 * MiB})
    assert r.status_code == 204, r.text
    assert xattr(sdir, "ceph.quota.max_bytes") == 32 * MiB
    got = scope(daemon, "GET", qsid).json()
    assert got["limit_bytes"] == 32 * MiB
    r = daemon.mgr("DELETE", "/quota-scope/quota", json={"volume": "ceph", "qsid": qsid})
    assert r.status_code == 204, r.text
    assert not xattr(sdir, "ceph.quota.max_bytes")  # 0 or absent: no limit
    assert scope(daemon, "GET", qsid).json().get("limit_bytes") in (None, 0)


def test_usage_comes_from_recursive_stats(daemon):
    qsid = new_qsid()
    vfid = daemon.create_vfolder(new_vfid(qsid), volume="ceph")
    vf = daemon.vfolder_path(vfid, volume="ceph")
    (vf / "d" / "e").mkdir(parents=True)
    (vf / "a.bin").write_bytes(b"a" * 1000)
    (vf / "d" / "b.bin").write_bytes(b"b" * 2000)
    (vf / "d" / "e" / "c.bin").write_bytes(b"c" * 3000)
    # 3 files and 2 directories, once the MDS has the recursive statistics.
    eventually(lambda: (usage(daemon, vfid)["used_bytes"], usage(daemon, vfid)["file_count"])
               == (6000, 5))
    assert xattr(vf, "ceph.dir.rbytes") == 6000
    # The scope's figure propagates up separately.
    eventually(lambda: scope(daemon, "GET", qsid).json()["used_bytes"] >= 6000)


def test_uploads_are_checked_by_sluice_ahead_of_lazy_enforcement(daemon):
    """rbytes lags writes, so right after an upload the MDS may not know of its bytes: Sluice
    counts what it wrote itself, and the next session that would not fit is refused."""
    qsid = new_qsid()
    assert scope(daemon, "POST", qsid, options={"limit_bytes": 8 * MiB}).status_code == 204
    vfid = daemon.create_vfolder(new_vfid(qsid), volume="ceph")
    data = os.urandom(6 * MiB)
    token = new_session(daemon, vfid, "first.bin", len(data), volume="ceph")
    assert patch(daemon, token, 0, data).status_code == 204
    r = daemon.mgr(
        "POST",
        "/folder/file/upload",
        json={"volume": "ceph", "vfid": vfid, "relpath": "second.bin", "size": 4 * MiB},
    )
    assert r.status_code == 413, r.text
    assert "quota" in problem(r)["msg"]
    # What fits is still accepted, and the file is whole.
    token = new_session(daemon, vfid, "small.bin", MiB, volume="ceph")
    assert patch(daemon, token, 0, b"s" * MiB).status_code == 204
    vf = daemon.vfolder_path(vfid, volume="ceph")
    assert (vf / "first.bin").read_bytes() == data
    assert (vf / "small.bin").stat().st_size == MiB


def test_clone_copies_and_is_checked_against_the_destination_limit(daemon):
    src = daemon.create_vfolder(new_vfid(), volume="ceph")
    (daemon.vfolder_path(src, volume="ceph") / "f.bin").write_bytes(b"x" * (3 * MiB))
    eventually(lambda: usage(daemon, src)["used_bytes"] == 3 * MiB)
    small = new_qsid()
    assert scope(daemon, "POST", small, options={"limit_bytes": 2 * MiB}).status_code == 204
    body = {"src_volume": "ceph", "src_vfid": src, "dst_volume": "ceph"}
    r = daemon.mgr("POST", "/folder/clone", json={**body, "dst_vfid": new_vfid(small)})
    assert r.status_code == 200, r.text
    t = daemon.wait_task(r.json()["bgtask_id"])
    assert t["status"] != "completed" and "quota" in str(t).lower(), t
    dst = new_vfid()
    r = daemon.mgr("POST", "/folder/clone", json={**body, "dst_vfid": dst})
    t = daemon.wait_task(r.json()["bgtask_id"])
    assert t["status"] == "completed", t
    assert (daemon.vfolder_path(dst, volume="ceph") / "f.bin").read_bytes() == b"x" * (3 * MiB)


def test_a_path_that_is_not_cephfs_is_refused_at_start(tmp_path):
    from conftest import Daemon

    plain = tmp_path / "plain"
    plain.mkdir()
    d = Daemon(
        tmp_path / "d",
        extra_toml=toml_section("volume.ceph", {"backend": "cephfs", "path": str(plain)}),
    )
    r = subprocess.run(
        [str(BIN_DIR / "sluiced"), "--config", str(d.config_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "is not a CephFS mount" in r.stdout + r.stderr


def test_download_and_range_from_cephfs(daemon):
    """Downloads work on FUSE mounts, where dentry-cache-only lookups are never possible."""
    import requests

    vfid = daemon.create_vfolder(new_vfid(), volume="ceph")
    data = os.urandom(2 * MiB + 123)
    (daemon.vfolder_path(vfid, volume="ceph") / "blob.bin").write_bytes(data)
    r = daemon.mgr(
        "POST",
        "/folder/file/download",
        json={"volume": "ceph", "vfid": vfid, "relpath": "blob.bin"},
    )
    assert r.status_code == 200, r.text
    url = f"http://127.0.0.1:{daemon.client_port}/download"
    token = r.json()["token"]
    for _ in range(3):  # the second and later requests take the warm path
        got = requests.get(url, params={"token": token}, timeout=30)
        assert got.status_code == 200 and got.content == data
    got = requests.get(url, params={"token": token}, headers={"Range": "bytes=100-199"}, timeout=30)
    assert got.status_code == 206 and got.content == data[100:200]
