"""File operations inside a vfolder: mkdir, list, rename, move, fetch, delete."""

import errno
import hashlib
import os

from conftest import new_vfid, problem, write_tree


def op(daemon, vfid, route, **body):
    body = {"volume": "local", "vfid": vfid, **body}
    return daemon.mgr("POST", f"/folder/file/{route}", json=body)


# --------------------------------------------------------------------------- mkdir


def test_mkdir_with_parents(daemon, vfid):
    r = op(daemon, vfid, "mkdir", relpath="a/b/c")
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [e["item"] for e in res["success"]] == ["a/b/c"]
    assert res["failed"] == []
    assert (daemon.vfolder_path(vfid) / "a" / "b" / "c").is_dir()


def test_mkdir_partial_failure_is_207(daemon, vfid):
    (daemon.vfolder_path(vfid) / "exists").mkdir()
    r = op(daemon, vfid, "mkdir", relpath=["exists", "new1", "new2"], exist_ok=False)
    assert r.status_code == 207, r.text
    res = r.json()["results"]
    assert sorted(e["item"] for e in res["success"]) == ["new1", "new2"]
    assert [e["item"] for e in res["failed"]] == ["exists"]
    assert res["failed"][0]["msg"]
    assert (daemon.vfolder_path(vfid) / "new1").is_dir()
    assert (daemon.vfolder_path(vfid) / "new2").is_dir()


def test_mkdir_exist_ok(daemon, vfid):
    (daemon.vfolder_path(vfid) / "exists").mkdir()
    r = op(daemon, vfid, "mkdir", relpath=["exists"], exist_ok=True)
    assert r.status_code == 200, r.text


def test_mkdir_all_failed_is_422(daemon, vfid):
    for name in ("x", "y"):
        (daemon.vfolder_path(vfid) / name).mkdir()
    r = op(daemon, vfid, "mkdir", relpath=["x", "y"])
    assert r.status_code == 422, r.text
    res = r.json()["results"]
    assert res["success"] == []
    assert sorted(e["item"] for e in res["failed"]) == ["x", "y"]


def test_mkdir_too_many_paths_is_400(daemon, vfid):
    r = op(daemon, vfid, "mkdir", relpath=[f"d{i}" for i in range(51)])
    assert r.status_code == 400, r.text
    problem(r)
    assert os.listdir(daemon.vfolder_path(vfid)) == []


def test_mkdir_fifty_paths_is_fine(daemon, vfid):
    r = op(daemon, vfid, "mkdir", relpath=[f"d{i}" for i in range(50)])
    assert r.status_code == 200, r.text
    assert len(os.listdir(daemon.vfolder_path(vfid))) == 50


def test_mkdir_without_parents(daemon, vfid):
    r = op(daemon, vfid, "mkdir", relpath="missing/child", parents=False)
    res = r.json()["results"]
    assert [e["item"] for e in res["failed"]] == ["missing/child"]
    assert res["success"] == []
    assert r.status_code == 422, r.text
    assert not (daemon.vfolder_path(vfid) / "missing").exists()


def test_mkdir_in_missing_vfolder_is_404(daemon):
    r = op(daemon, new_vfid(), "mkdir", relpath="a")
    assert r.status_code == 404, r.text


# --------------------------------------------------------------------------- list


def test_list(daemon, vfid):
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"f.txt": b"abc", "d": None, "d/inner": b"12345", "s": ("link", "f.txt")})
    r = op(daemon, vfid, "list", relpath=".")
    assert r.status_code == 200, r.text
    items = {i["name"]: i for i in r.json()["items"]}
    assert set(items) == {"f.txt", "d", "s"}
    assert items["f.txt"]["type"] == "FILE"
    assert items["d"]["type"] == "DIRECTORY"
    assert items["s"]["type"] == "SYMLINK"
    assert items["s"]["symlink_target"] == "f.txt"
    assert items["f.txt"]["stat"]["size"] == 3
    for name, item in items.items():
        assert {"mode", "size", "created", "modified"} <= set(item["stat"])
        assert item["stat"]["mode"] == os.lstat(root / name).st_mode

    r = op(daemon, vfid, "list", relpath="d")
    assert r.status_code == 200, r.text
    assert [(i["name"], i["type"], i["stat"]["size"]) for i in r.json()["items"]] == [
        ("inner", "FILE", 5)
    ]


# Filesystem errors inside a vfolder are 400 {msg, errno, paths} (Backend.AI's handle_fs_errors:
# VFolderBadRequest in the manager), never 404 (which the manager reads as "no such vfolder").
def fs_error(r, err):
    assert r.status_code == 400, r.text
    body = problem(r)
    assert body["errno"] == err, body
    assert "error_code" not in body, body
    return body


def test_list_missing_dir_is_400(daemon, vfid):
    fs_error(op(daemon, vfid, "list", relpath="nope"), errno.ENOENT)


def test_scandir_limit(make_daemon):
    d = make_daemon(storage_proxy={"scandir-limit": 5})
    vfid = d.create_vfolder()
    write_tree(d.vfolder_path(vfid), {f"f{i}": b"x" for i in range(10)})
    r = d.mgr("POST", "/folder/file/list", json={"volume": "local", "vfid": vfid, "relpath": "."})
    assert r.status_code == 200, r.text
    assert len(r.json()["items"]) == 5


# --------------------------------------------------------------------------- rename and move


def test_rename(daemon, vfid):
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"dir/old.txt": b"data", "dir/taken.txt": b"other"})
    r = op(daemon, vfid, "rename", relpath="dir/old.txt", new_name="new.txt")
    assert r.status_code == 204, r.text
    assert (root / "dir" / "new.txt").read_bytes() == b"data"
    assert not (root / "dir" / "old.txt").exists()

    r = op(daemon, vfid, "rename", relpath="dir/new.txt", new_name="sub/x.txt")
    assert r.status_code == 400, r.text
    problem(r)

    r = op(daemon, vfid, "rename", relpath="dir/new.txt", new_name="taken.txt")
    fs_error(r, errno.EEXIST)
    assert (root / "dir" / "taken.txt").read_bytes() == b"other"
    assert (root / "dir" / "new.txt").read_bytes() == b"data"


def test_rename_missing_is_400(daemon, vfid):
    fs_error(op(daemon, vfid, "rename", relpath="nope", new_name="x"), errno.ENOENT)


def test_move(daemon, vfid):
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"m1.txt": b"one", "m2.txt": b"two", "sub": None})
    r = op(daemon, vfid, "move", src_relpath="m1.txt", dst_relpath="sub/renamed.txt")
    assert r.status_code == 204, r.text
    assert (root / "sub" / "renamed.txt").read_bytes() == b"one"
    assert not (root / "m1.txt").exists()

    # Onto an existing directory: into it.
    r = op(daemon, vfid, "move", src_relpath="m2.txt", dst_relpath="sub")
    assert r.status_code == 204, r.text
    assert (root / "sub" / "m2.txt").read_bytes() == b"two"
    assert not (root / "m2.txt").exists()


def test_move_missing_is_400(daemon, vfid):
    fs_error(op(daemon, vfid, "move", src_relpath="nope", dst_relpath="x"), errno.ENOENT)


# --------------------------------------------------------------------------- fetch


def test_fetch_large_file(daemon, vfid):
    data = os.urandom(5 << 20)
    (daemon.vfolder_path(vfid) / "big.bin").write_bytes(data)
    r = op(daemon, vfid, "fetch", relpath="big.bin")
    assert r.status_code == 200, r.text[:300]
    assert int(r.headers["Content-Length"]) == len(data)
    assert hashlib.sha256(r.content).hexdigest() == hashlib.sha256(data).hexdigest()


def test_fetch_empty_file(daemon, vfid):
    (daemon.vfolder_path(vfid) / "empty").write_bytes(b"")
    r = op(daemon, vfid, "fetch", relpath="empty")
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["Content-Length"] == "0"


def test_fetch_directory_is_400(daemon, vfid):
    (daemon.vfolder_path(vfid) / "d").mkdir()
    r = op(daemon, vfid, "fetch", relpath="d")
    assert r.status_code == 400, r.text
    problem(r)


def test_fetch_missing_is_400(daemon, vfid):
    fs_error(op(daemon, vfid, "fetch", relpath="nope.bin"), errno.ENOENT)


# --------------------------------------------------------------------------- delete


def test_delete_files(daemon, vfid):
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"a.txt": b"a", "b.txt": b"b", "emptydir": None, "keep.txt": b"k"})
    r = op(daemon, vfid, "delete", relpaths=["a.txt", "b.txt", "emptydir"])
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "ok"
    assert sorted(os.listdir(root)) == ["keep.txt"]


def test_delete_nonempty_dir_needs_recursive(daemon, vfid):
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"f.txt": b"f", "full/inner/x": b"x"})
    r = op(daemon, vfid, "delete", relpaths=["f.txt", "full"])
    fs_error(r, errno.ENOTEMPTY)
    # Nothing was deleted, not even the file listed first.
    assert (root / "f.txt").exists()
    assert (root / "full" / "inner" / "x").exists()

    r = op(daemon, vfid, "delete", relpaths=["f.txt", "full"], recursive=True)
    assert r.status_code == 200, r.text
    assert os.listdir(root) == []


def test_delete_missing_is_400(daemon, vfid):
    fs_error(op(daemon, vfid, "delete", relpaths=["nope"]), errno.ENOENT)


def test_delete_async(daemon, vfid):
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"tree/a/b/c.bin": os.urandom(1000), "tree/d.txt": b"d", "keep": b"k"})
    r = op(daemon, vfid, "delete-async", relpaths=["tree"], recursive=True)
    assert r.status_code == 202, r.text
    task = daemon.wait_task(r.json()["bgtask_id"])
    assert task["status"] == "completed", task
    assert os.listdir(root) == ["keep"]
    assert task["params"]["relpaths"] == ["tree"] and task["params"]["relpath_count"] == 1
    # A long list is counted in the task's record, not kept whole.
    names = [f"f{i:03d}" for i in range(150)]
    write_tree(root, {n: b"x" for n in names})
    r = op(daemon, vfid, "delete-async", relpaths=names)
    task = daemon.wait_task(r.json()["bgtask_id"])
    assert task["status"] == "completed", task
    assert task["params"]["relpaths"] == names[:100] and task["params"]["relpath_count"] == 150
    assert os.listdir(root) == ["keep"]
