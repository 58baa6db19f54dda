"""The xfs backend through a real sluiced: a `[volume.xf] backend = "xfs"` volume on a
loop-mounted XFS image with reflinks (made and removed by tests/tools/xfs-loop.sh). This
project's kernel has no XFS quota support, so the volume runs degraded: project ids and reflink
clones work, limits are refused with 501 and usage comes from walks."""

import fcntl
import os
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import content_manifest, loop_mount, new_qsid, new_vfid, running_daemon, toml_section

MiB = 1 << 20
FS_IOC_FSGETXATTR = 0x801C581F  # _IOR('X', 31, struct fsxattr), 28 bytes
FS_XFLAG_PROJINHERIT = 0x200


@pytest.fixture(scope="module")
def xfs_mount():
    with loop_mount("xfs") as m:
        yield m.mnt


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, xfs_mount):
    with running_daemon(
        tmp_path_factory.mktemp("sluiced-xfs"),
        volumes={"xf": xfs_mount},
        extra_toml=toml_section("volume.xf", {"backend": "xfs", "path": str(xfs_mount)}),
    ) as d:
        yield d


def scope(daemon, method, qsid, **extra):
    return daemon.mgr(method, "/quota-scope", json={"volume": "xf", "qsid": qsid, **extra})


def project(path):
    """(project id, PROJINHERIT set) of a path, through FS_IOC_FSGETXATTR."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        buf = fcntl.ioctl(fd, FS_IOC_FSGETXATTR, bytes(28))
    finally:
        os.close(fd)
    xflags, _, _, projid, _ = struct.unpack("<5I", buf[:20])
    return projid, bool(xflags & FS_XFLAG_PROJINHERIT)


def test_volume_is_degraded_with_reason(daemon):
    vols = {v["name"]: v for v in daemon.mgr("GET", "/volumes").json()["volumes"]}
    assert vols["xf"]["backend"] == "xfs"
    caps = set(vols["xf"]["capabilities"])
    assert {"vfolder", "metric", "fast-clone"} <= caps
    assert "quota" not in caps  # not enforced on this kernel
    r = daemon.mgr("GET", "/volume/hwinfo", json={"volume": "xf"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["status"] == "degraded", j
    assert "kernel has no XFS quota support" in j["status_info"], j
    assert "Function not implemented" in j["status_info"], j


def test_scope_vfolder_clone_usage_delete(daemon):
    # A limit is refused with the reason, and nothing is made.
    qsid = new_qsid()
    r = scope(daemon, "POST", qsid, options={"limit_bytes": 8 * MiB})
    assert r.status_code == 501, r.text
    assert "kernel has no XFS quota support" in r.text, r.text
    assert not daemon.scope_path(qsid, "xf").exists()
    # Without a limit the scope is made, with its own project id.
    r = scope(daemon, "POST", qsid)
    assert r.status_code == 204, r.text
    sp = daemon.scope_path(qsid, "xf")
    pid = int((sp / ".sluice-project-id").read_text())
    assert project(sp) == (pid, True)
    r = scope(daemon, "PATCH", qsid, options={"limit_bytes": 8 * MiB})
    assert r.status_code == 501, r.text

    src = daemon.create_vfolder(new_vfid(qsid), volume="xf")
    path = daemon.vfolder_path(src, "xf")
    (path / "sub").mkdir()
    (path / "data.bin").write_bytes(os.urandom(3 * MiB))
    (path / "sub" / "small.txt").write_bytes(b"x" * 3000)
    assert project(path / "sub" / "small.txt")[0] == pid
    u = daemon.mgr("GET", "/folder/usage", json={"volume": "xf", "vfid": src}).json()
    assert u == {**u, "file_count": 3, "used_bytes": 3 * MiB + 3000}, u
    j = scope(daemon, "GET", qsid).json()
    assert j["used_bytes"] == 3 * MiB + 3000, j
    assert j.get("limit_bytes") in (None, 0), j

    # Clone into another scope: reflinked copies that take the destination's project id.
    other = new_qsid()
    assert scope(daemon, "POST", other).status_code == 204
    other_pid = int((daemon.scope_path(other, "xf") / ".sluice-project-id").read_text())
    assert other_pid != pid
    dst = new_vfid(other)
    body = {"src_volume": "xf", "src_vfid": src, "dst_volume": "xf", "dst_vfid": dst}
    r = daemon.mgr("POST", "/folder/clone", json=body)
    assert r.status_code == 200, r.text
    task = daemon.wait_task(r.json()["bgtask_id"])
    assert task["status"] == "completed", task
    dpath = daemon.vfolder_path(dst, "xf")
    assert content_manifest(dpath) == content_manifest(path)
    assert project(dpath / "data.bin")[0] == other_pid
    assert project(dpath / "sub")[0] == other_pid
    assert scope(daemon, "GET", other).json()["used_bytes"] == 3 * MiB + 3000

    for vfid in (src, dst):
        assert daemon.delete_vfolder(vfid, "xf")["status"] == "completed"
        assert not daemon.vfolder_path(vfid, "xf").exists()
    for q in (qsid, other):
        r = scope(daemon, "DELETE", q)
        assert r.status_code == 204, r.text
        assert not daemon.scope_path(q, "xf").exists()
