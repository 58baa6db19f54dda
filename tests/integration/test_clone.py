"""POST /folder/clone: background copy of a vfolder, within a volume and across volumes."""

import os

import pytest

from conftest import content_manifest, new_qsid, new_vfid, problem, running_daemon, write_tree


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """Two vfs volumes: `local` and `other`."""
    with running_daemon(tmp_path_factory.mktemp("sluiced-clone"), extra_volumes=["other"]) as d:
        yield d


def populated_vfolder(daemon, volume="local"):
    vfid = daemon.create_vfolder(volume=volume)
    write_tree(
        daemon.vfolder_path(vfid, volume),
        {
            "top.bin": os.urandom(70000),
            "empty.txt": b"",
            "dir1/file2": os.urandom(3000),
            "dir1/dir2/dir3/deep.txt": b"deep",
            "dir1/emptier": None,
            "empty": None,
            "link": ("link", "dir1/file2"),
            "dangling": ("link", "no/such/target"),
            "dir1/uplink": ("link", "../top.bin"),
        },
    )
    return vfid


def clone(daemon, src, dst, src_volume="local", dst_volume="local"):
    return daemon.mgr(
        "POST",
        "/folder/clone",
        json={
            "src_volume": src_volume,
            "src_vfid": src,
            "dst_volume": dst_volume,
            "dst_vfid": dst,
        },
    )


def test_clone_copies_tree(daemon):
    src = populated_vfolder(daemon)
    dst = new_vfid()
    r = clone(daemon, src, dst)
    assert r.status_code == 200, r.text
    task = daemon.wait_task(r.json()["bgtask_id"])
    assert task["status"] == "completed", task
    src_tree = content_manifest(daemon.vfolder_path(src))
    dst_tree = content_manifest(daemon.vfolder_path(dst))
    assert dst_tree == src_tree
    assert dst_tree["link"] == ("link", "dir1/file2")
    assert dst_tree["empty"] == ("dir",)
    assert os.path.islink(daemon.vfolder_path(dst) / "dangling")
    # The source is untouched and the copy is independent of it.
    (daemon.vfolder_path(dst) / "top.bin").write_bytes(b"changed")
    assert content_manifest(daemon.vfolder_path(src)) == src_tree


def test_clone_into_new_scope_creates_it(daemon):
    src = populated_vfolder(daemon)
    qsid = new_qsid("project")
    r = clone(daemon, src, new_vfid(qsid))
    assert r.status_code == 200, r.text
    assert daemon.wait_task(r.json()["bgtask_id"])["status"] == "completed"
    r = daemon.mgr("GET", "/quota-scope", json={"volume": "local", "qsid": qsid})
    assert r.status_code == 200, r.text


def test_clone_into_existing_is_409(daemon):
    src = populated_vfolder(daemon)
    dst = daemon.create_vfolder()
    before = content_manifest(daemon.vfolder_path(dst))
    r = clone(daemon, src, dst)
    assert r.status_code == 409, r.text
    problem(r)
    assert content_manifest(daemon.vfolder_path(dst)) == before


def test_clone_missing_source_is_404(daemon):
    dst = new_vfid()
    r = clone(daemon, new_vfid(), dst)
    assert r.status_code == 404, r.text
    problem(r)
    assert not daemon.vfolder_path(dst).exists()


def test_clone_over_quota_fails_and_cleans_up(daemon):
    src = daemon.create_vfolder()
    (daemon.vfolder_path(src) / "data.bin").write_bytes(os.urandom(64 << 10))
    qsid = new_qsid()
    body = {"volume": "local", "qsid": qsid, "options": {"limit_bytes": 1000}}
    r = daemon.mgr("POST", "/quota-scope", json=body)
    assert r.status_code == 204, r.text
    dst = new_vfid(qsid)
    r = clone(daemon, src, dst)
    assert r.status_code == 200, r.text
    task = daemon.wait_task(r.json()["bgtask_id"])
    assert task["status"] == "failed", task
    assert "quota" in task["error"]["msg"].lower(), task
    assert not daemon.vfolder_path(dst).exists()
    r = daemon.mgr("GET", "/folder/usage", json={"volume": "local", "vfid": dst})
    assert r.status_code == 404, r.text


def test_clone_across_volumes(daemon):
    src = populated_vfolder(daemon, "local")
    dst = new_vfid()
    r = clone(daemon, src, dst, "local", "other")
    assert r.status_code == 200, r.text
    task = daemon.wait_task(r.json()["bgtask_id"])
    assert task["status"] == "completed", task
    assert not daemon.vfolder_path(dst, "local").exists()
    assert content_manifest(daemon.vfolder_path(dst, "other")) == content_manifest(
        daemon.vfolder_path(src, "local")
    )
    r = daemon.mgr("GET", "/folder/mount", json={"volume": "other", "vfid": dst})
    assert r.status_code == 200, r.text
    assert r.json()["path"] == str(daemon.vfolder_path(dst, "other"))

    # And back again.
    back = new_vfid()
    r = clone(daemon, dst, back, "other", "local")
    assert r.status_code == 200, r.text
    assert daemon.wait_task(r.json()["bgtask_id"])["status"] == "completed"
    assert content_manifest(daemon.vfolder_path(back)) == content_manifest(daemon.vfolder_path(src))


def test_volumes_lists_both(daemon):
    vols = {v["name"]: v for v in daemon.mgr("GET", "/volumes").json()["volumes"]}
    assert set(vols) == {"local", "other"}
    assert vols["other"]["path"] == str(daemon.volumes["other"])
