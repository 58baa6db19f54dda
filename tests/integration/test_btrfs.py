"""The btrfs backend through a real sluiced: a `[volume.bt] backend = "btrfs"` volume on a
loop-mounted btrfs image with qgroups (made and removed by tests/tools/btrfs-loop.sh)."""

import errno
import hashlib
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import content_manifest, loop_mount, new_qsid, new_vfid, running_daemon, toml_section

MiB = 1 << 20
ROOT_INO = 256  # every btrfs subvolume's root directory


@pytest.fixture(scope="module")
def btrfs_mount():
    with loop_mount("btrfs") as m:
        yield m.mnt


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, btrfs_mount):
    with running_daemon(
        tmp_path_factory.mktemp("sluiced-btrfs"),
        volumes={"bt": btrfs_mount},
        s3={},
        extra_toml=toml_section("volume.bt", {"backend": "btrfs", "path": str(btrfs_mount)}),
    ) as d:
        yield d


# --------------------------------------------------------------------------- helpers


def scope(daemon, method, qsid, **extra):
    return daemon.mgr(method, "/quota-scope", json={"volume": "bt", "qsid": qsid, **extra})


def make_scope(daemon, limit=None):
    qsid = new_qsid()
    body = {"options": {"limit_bytes": limit}} if limit is not None else {}
    r = scope(daemon, "POST", qsid, **body)
    assert r.status_code == 204, r.text
    return qsid


def usage(daemon, vfid):
    r = daemon.mgr("GET", "/folder/usage", json={"volume": "bt", "vfid": vfid})
    assert r.status_code == 200, r.text
    return r.json()


def clone(daemon, src, dst):
    body = {"src_volume": "bt", "src_vfid": src, "dst_volume": "bt", "dst_vfid": dst}
    r = daemon.mgr("POST", "/folder/clone", json=body)
    assert r.status_code == 200, r.text
    return daemon.wait_task(r.json()["bgtask_id"])


def write(path, size):
    """Writes `size` bytes in 1 MiB writes; returns (errno or 0, bytes written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    done = 0
    chunk = os.urandom(MiB)
    try:
        while done < size:
            done += os.write(fd, chunk[: min(MiB, size - done)])
    except OSError as e:
        return e.errno, done
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return 0, done


def assert_healthy(daemon):
    r = daemon.mgr("GET", "/volume/hwinfo", json={"volume": "bt"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "healthy", r.json()


def subvolume_show(path):
    """{field: value} of `btrfs subvolume show` (test-side inspection only)."""
    out = subprocess.run(
        ["btrfs", "subvolume", "show", str(path)], capture_output=True, text=True, check=True
    ).stdout
    fields = {}
    for line in out.splitlines()[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            fields[k.strip()] = v.strip()
    return fields


# --------------------------------------------------------------------------- tests


def test_volume_is_listed_as_btrfs(daemon):
    vols = {v["name"]: v for v in daemon.mgr("GET", "/volumes").json()["volumes"]}
    assert vols["bt"]["backend"] == "btrfs"
    assert {"vfolder", "quota", "metric", "fast-size", "fast-clone"} <= set(
        vols["bt"]["capabilities"]
    )
    assert_healthy(daemon)


def test_scope_vfolder_usage_clone_delete(daemon):
    qsid = make_scope(daemon, 48 * MiB)
    j = scope(daemon, "GET", qsid).json()
    assert j["limit_bytes"] == 48 * MiB
    assert j["used_bytes"] < 64 * 1024

    src = daemon.create_vfolder(new_vfid(qsid), volume="bt")
    path = daemon.vfolder_path(src, "bt")
    assert os.stat(path).st_ino == ROOT_INO  # a subvolume of its own
    assert write(path / "data.bin", 8 * MiB) == (0, 8 * MiB)
    (path / "sub").mkdir()
    (path / "sub" / "small.txt").write_bytes(b"x" * 3000)

    # Fresh, not the lagging committed counters: right after the writes.
    u = usage(daemon, src)
    assert u["file_count"] == 3
    assert 8 * MiB <= u["used_bytes"] <= 8 * MiB + 64 * 1024, u
    r = daemon.mgr("GET", "/folder/used-bytes", json={"volume": "bt", "vfid": src})
    assert r.status_code == 200, r.text
    assert 8 * MiB <= r.json()["used_bytes"] <= 8 * MiB + 64 * 1024
    j = scope(daemon, "GET", qsid).json()
    assert 8 * MiB <= j["used_bytes"] <= 8 * MiB + 96 * 1024, j

    # Clone within the scope: a snapshot of the source, identical content.
    same = new_vfid(qsid)
    task = clone(daemon, src, same)
    assert task["status"] == "completed", task
    same_path = daemon.vfolder_path(same, "bt")
    assert content_manifest(same_path) == content_manifest(path)
    assert subvolume_show(same_path)["Parent UUID"] == subvolume_show(path)["UUID"]
    assert usage(daemon, same)["used_bytes"] >= 8 * MiB
    # The shared data counts once in the scope.
    assert scope(daemon, "GET", qsid).json()["used_bytes"] < 9 * MiB

    # Into a scope whose limit is too small: refused before copying, destination removed.
    small = make_scope(daemon, 4 * MiB)
    refused = new_vfid(small)
    task = clone(daemon, src, refused)
    assert task["status"] == "failed", task
    assert "quota" in task["error"]["msg"].lower(), task
    assert not daemon.vfolder_path(refused, "bt").exists()
    assert scope(daemon, "GET", small).json()["used_bytes"] < MiB

    # Into another scope: a reflink copy that counts against the destination.
    other = make_scope(daemon, 64 * MiB)
    far = new_vfid(other)
    task = clone(daemon, src, far)
    assert task["status"] == "completed", task
    far_path = daemon.vfolder_path(far, "bt")
    assert content_manifest(far_path) == content_manifest(path)
    j = scope(daemon, "GET", other).json()
    assert 8 * MiB <= j["used_bytes"] <= 9 * MiB, j
    assert j["limit_bytes"] == 64 * MiB

    # Writes past the scope's limit fail with EDQUOT, in any of its vfolders.
    err, done = write(same_path / "big.bin", 64 * MiB)
    assert err == errno.EDQUOT == 122
    assert done < 48 * MiB

    # Delete everything.
    for vfid in (src, same, far):
        assert daemon.delete_vfolder(vfid, "bt")["status"] == "completed"
        assert not daemon.vfolder_path(vfid, "bt").exists()
    for q in (qsid, small, other):
        r = scope(daemon, "DELETE", q)
        assert r.status_code == 204, r.text
        assert not daemon.scope_path(q, "bt").exists()
        assert scope(daemon, "GET", q).status_code == 404
    # Qgroup accounting stayed exact throughout (the volume would report "degraded" otherwise).
    assert_healthy(daemon)


def test_scope_delete_and_recreate_while_qgroup_cleanup_is_pending(daemon):
    qsid = make_scope(daemon, 16 * MiB)
    vfid = daemon.create_vfolder(new_vfid(qsid), volume="bt")
    assert write(daemon.vfolder_path(vfid, "bt") / "data.bin", 4 * MiB)[0] == 0
    assert daemon.delete_vfolder(vfid, "bt")["status"] == "completed"
    # The kernel drops the subvolumes and their qgroups later; the scope goes now.
    r = scope(daemon, "DELETE", qsid)
    assert r.status_code == 204, r.text
    assert scope(daemon, "GET", qsid).status_code == 404
    # And can be made again at once, with its limit enforced.
    r = scope(daemon, "POST", qsid, options={"limit_bytes": 2 * MiB})
    assert r.status_code == 204, r.text
    vfid = daemon.create_vfolder(new_vfid(qsid), volume="bt")
    assert write(daemon.vfolder_path(vfid, "bt") / "data.bin", 8 * MiB)[0] == errno.EDQUOT
    assert daemon.delete_vfolder(vfid, "bt")["status"] == "completed"
    assert scope(daemon, "DELETE", qsid).status_code == 204
    assert_healthy(daemon)


def test_s3_objects_of_two_vfolders_with_one_inode_keep_their_own_metadata(daemon):
    """Every vfolder here is a subvolume, and subvolumes number their inodes alike: the first
    object of two fresh buckets has the same inode number. Given the same size, mtime and
    ctime too (set by hand, the ctimes retried until one clock tick holds both), each must
    still be answered with its own ETag and Content-Type: until 2026-12-07 the metadata cache
    knew a file by its inode alone, and answered the second bucket with the first's."""
    qsid = make_scope(daemon)
    user = daemon.s3_user()["id"]
    s3 = daemon.s3_client(*daemon.s3_key(user))
    buckets, paths = [], []
    for body, ctype in ((b"x" * 10, "text/one"), (b"y" * 10, "text/two")):
        vfid = daemon.create_vfolder(new_vfid(qsid), volume="bt")
        name = f"bt-{uuid.uuid4().hex[:12]}"
        r = daemon.mgr("POST", "/s3/buckets",
                       json={"name": name, "volume": "bt", "vfid": vfid, "owner": user})
        assert r.status_code == 201, r.text
        s3.put_object(Bucket=name, Key="k", Body=body, ContentType=ctype)
        buckets.append(name)
        paths.append(daemon.vfolder_path(vfid, "bt") / "k")
    a, b = (os.stat(p) for p in paths)
    assert a.st_ino == b.st_ino and a.st_dev != b.st_dev, (a, b)
    when = a.st_mtime_ns
    for p in paths:  # the stored metadata made for this mtime
        meta = json.loads(os.getxattr(p, "user.sluice.object"))
        meta["n"] = when
        os.setxattr(p, "user.sluice.object", json.dumps(meta).encode())
    # Then the mtimes, back to back, until both ctimes fall on one timestamp: Linux 6.13's
    # multigrain timestamps move the floor of coarse ones whenever any process takes a
    # fine-grained one, which a loaded machine (other tests) does often.
    for _ in range(5000):
        for p in paths:  # (a change after the last stat, so that the next is coarse again)
            os.utime(p, ns=(when, when))
        for p in paths:
            os.utime(p, ns=(when, when))
        a, b = (os.stat(p) for p in paths)
        if a.st_ctime_ns == b.st_ctime_ns:
            break
    assert (a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns) == \
        (b.st_ino, b.st_size, b.st_mtime_ns, b.st_ctime_ns)
    for _ in range(2):  # the second round from the cache
        for name, body, ctype in zip(buckets, (b"x" * 10, b"y" * 10), ("text/one", "text/two")):
            h = s3.head_object(Bucket=name, Key="k")
            assert (h["ContentType"], h["ETag"]) == \
                (ctype, '"' + hashlib.md5(body).hexdigest() + '"'), name
            listed = s3.list_objects_v2(Bucket=name)["Contents"]
            assert [o["ETag"] for o in listed] == [h["ETag"]], name
