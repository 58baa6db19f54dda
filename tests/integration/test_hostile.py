"""Hostile input: path escapes and malformed bodies; each is a 400 that changes nothing on disk."""

import pytest

from conftest import new_vfid, problem

SOME_VFID = "user:" + "1" * 32 + "/" + "2" * 32
HOSTILE_PATHS = {
    "dotdot": "../x",
    "dotdot-inner": "a/../../x",
    "absolute": "/etc/passwd",
    "nul": "a\u0000b",
    "long-component": "c" * 300,
    "long-path": "a/" * 2100 + "z",  # over 4096 bytes
}


@pytest.fixture
def hostile(daemon):
    """A vfolder holding a file, a directory and a symlink `out` to the daemon's whole tmp dir.

    Outside the vfolder, <tmp>/x is a file a successful escape would read, move or delete.
    """
    vfid = daemon.create_vfolder()
    root = daemon.vfolder_path(vfid)
    (root / "inside.txt").write_bytes(b"inside")
    (root / "a").mkdir()
    (root / "out").symlink_to(daemon.root)
    (daemon.root / "x").write_bytes(b"outside")
    return vfid


def refused(daemon, method, path, body):
    """Asserts a 400 problem answer and an unchanged disk."""
    before = daemon.snapshot()
    r = daemon.mgr(method, path, json=body)
    after = daemon.snapshot()
    assert r.status_code == 400, f"{method} {path} {body!r:.200}: {r.status_code} {r.text[:300]}"
    problem(r)
    assert after == before, f"{path} changed the disk: {set(after) ^ set(before)}"
    return r


def file_requests(vfid, p, w):
    """(route, body) pairs that put a hostile path in every path parameter of the file routes.

    p goes to the routes that only read, w to those that write (an absolute w names a file of
    our own, so a server that follows it damages nothing but the tree the test watches).
    """
    base = {"volume": "local", "vfid": vfid}
    return [
        ("list", {**base, "relpath": p}),
        ("fetch", {**base, "relpath": p}),
        ("mkdir", {**base, "relpath": w}),
        ("mkdir", {**base, "relpath": ["ok-dir", w]}),
        ("rename", {**base, "relpath": w, "new_name": "renamed"}),
        ("move", {**base, "src_relpath": w, "dst_relpath": "moved"}),
        ("move", {**base, "src_relpath": "inside.txt", "dst_relpath": w}),
        ("delete", {**base, "relpaths": [w]}),
        ("delete", {**base, "relpaths": ["inside.txt", w], "recursive": True}),
        ("delete-async", {**base, "relpaths": [w], "recursive": True}),
    ]


@pytest.mark.parametrize("name", list(HOSTILE_PATHS))
def test_hostile_relpath(daemon, hostile, name):
    p = HOSTILE_PATHS[name]
    w = str(daemon.root / "x") if name == "absolute" else p
    for route, body in file_requests(hostile, p, w):
        refused(daemon, "POST", f"/folder/file/{route}", body)


@pytest.mark.parametrize("name", list(HOSTILE_PATHS))
def test_hostile_mount_subpath(daemon, hostile, name):
    body = {"volume": "local", "vfid": hostile, "subpath": HOSTILE_PATHS[name]}
    refused(daemon, "GET", "/folder/mount", body)


@pytest.mark.parametrize("subpath", ["../..", "..", "out", "out/x"])
def test_mount_subpath_escape(daemon, hostile, subpath):
    body = {"volume": "local", "vfid": hostile, "subpath": subpath}
    refused(daemon, "GET", "/folder/mount", body)


@pytest.mark.parametrize(
    "route,body",
    [
        ("mkdir", {"relpath": "out/evil"}),
        ("mkdir", {"relpath": "out/evil", "parents": False}),
        ("fetch", {"relpath": "out/x"}),
        ("fetch", {"relpath": "out/storage-proxy.toml"}),
        ("list", {"relpath": "out"}),
        ("list", {"relpath": "out/state"}),
        ("delete", {"relpaths": ["out/x"]}),
        ("delete", {"relpaths": ["out/vol"], "recursive": True}),
        ("move", {"src_relpath": "inside.txt", "dst_relpath": "out/y"}),
        ("move", {"src_relpath": "inside.txt", "dst_relpath": "out"}),
        ("move", {"src_relpath": "out/x", "dst_relpath": "stolen"}),
        ("rename", {"relpath": "out/x", "new_name": "w"}),
        ("rename", {"relpath": "inside.txt", "new_name": "../z"}),
        ("rename", {"relpath": "inside.txt", "new_name": ".."}),
        ("rename", {"relpath": "inside.txt", "new_name": "a/z"}),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(str(x) for x in v.values())[:40],
)
def test_symlink_escape(daemon, hostile, route, body):
    refused(daemon, "POST", f"/folder/file/{route}", {"volume": "local", "vfid": hostile, **body})


# --------------------------------------------------------------------------- malformed requests


@pytest.mark.parametrize(
    "body", [b"{not json", b'{"volume": "local",', b"\xff\xfe", b"[1, 2]", b'"str"', b"42"]
)
def test_bad_body_is_400(daemon, hostile, body):
    before = daemon.snapshot()
    r = daemon.mgr(
        "POST", "/folder/file/mkdir", data=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text
    problem(r)
    assert daemon.snapshot() == before


@pytest.mark.parametrize(
    "method,path,body,missing",
    [
        ("POST", "/folder/create", {"volume": "local"}, "vfid"),
        ("POST", "/folder/create", {"vfid": SOME_VFID}, "volume"),
        ("GET", "/quota-scope", {"volume": "local"}, "qsid"),
        ("POST", "/folder/file/fetch", {"volume": "local", "vfid": SOME_VFID}, "relpath"),
        ("POST", "/folder/file/delete", {"volume": "local", "vfid": SOME_VFID}, "relpaths"),
        ("POST", "/folder/clone", {"src_volume": "local", "src_vfid": SOME_VFID}, "dst_vfid"),
        ("GET", "/bgtask", {}, "task_id"),
    ],
)
def test_missing_param_is_400(daemon, method, path, body, missing):
    r = daemon.mgr(method, path, json=body)
    assert r.status_code == 400, r.text
    assert missing in problem(r)["msg"]


@pytest.mark.parametrize(
    "body",
    [
        {"mode": "rwx"},
        {"mode": -1},
        {"mode": 0o17777},
        {"options": {"initial_max_size_for_quota_scope": -5}},
    ],
)
def test_bad_create_params_are_400(daemon, body):
    vfid = new_vfid()
    r = daemon.mgr("POST", "/folder/create", json={"volume": "local", "vfid": vfid, **body})
    assert r.status_code == 400, r.text
    assert not daemon.vfolder_path(vfid).exists()
