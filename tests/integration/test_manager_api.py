"""Manager-facing API: auth, health, volumes, quota scopes, vfolders, background tasks, metrics."""

import os
import stat

import pytest
import requests

from conftest import new_qsid, new_vfid, problem, write_tree

# Every token-protected route the manager API serves.
PROTECTED_ROUTES = [
    ("GET", "/volumes"),
    ("GET", "/volume/hwinfo"),
    ("GET", "/volume/performance-metric"),
    ("POST", "/quota-scope"),
    ("GET", "/quota-scope"),
    ("PATCH", "/quota-scope"),
    ("DELETE", "/quota-scope"),
    ("DELETE", "/quota-scope/quota"),
    ("POST", "/folder/create"),
    ("POST", "/folder/delete"),
    ("POST", "/folder/clone"),
    ("GET", "/folder/mount"),
    ("GET", "/folder/usage"),
    ("GET", "/folder/used-bytes"),
    ("GET", "/folder/fs-usage"),
    ("POST", "/folder/file/mkdir"),
    ("POST", "/folder/file/list"),
    ("POST", "/folder/file/rename"),
    ("POST", "/folder/file/move"),
    ("POST", "/folder/file/fetch"),
    ("POST", "/folder/file/download"),
    ("POST", "/folder/file/archive-download-token"),
    ("POST", "/folder/file/upload"),
    ("POST", "/folder/file/delete"),
    ("POST", "/folder/file/delete-async"),
    ("GET", "/bgtask"),
    ("GET", "/bgtasks"),
    ("GET", "/folder/metadata"),
    ("POST", "/folder/metadata"),
    ("GET", "/volume/quota"),
    ("PATCH", "/volume/quota"),
]
HEALTH_ROUTES = ["/", "/status", "/health", "/livez", "/readyz"]


def qs(daemon, method, qsid, volume="local", **extra):
    return daemon.mgr(method, "/quota-scope", json={"volume": volume, "qsid": qsid, **extra})


# --------------------------------------------------------------------------- auth and health


@pytest.mark.parametrize("token", [False, "wrong-secret"], ids=["missing", "wrong"])
@pytest.mark.parametrize("method,path", PROTECTED_ROUTES, ids=[m + p for m, p in PROTECTED_ROUTES])
def test_protected_route_needs_token(daemon, method, path, token):
    vfid = new_vfid()
    body = {"volume": "local", "vfid": vfid, "qsid": vfid.split("/")[0], "relpath": "x"}
    r = daemon.mgr(method, path, json=body, token=token)
    assert r.status_code == 403, r.text
    assert problem(r)["msg"]


@pytest.mark.parametrize("path", HEALTH_ROUTES)
def test_health_routes_need_no_token(daemon, path):
    r = daemon.mgr("GET", path, token=False)
    assert r.status_code == 200, r.text
    assert isinstance(r.json(), dict)


@pytest.mark.parametrize("path", ["/", "/status"])
def test_root_identifies_manager_api(daemon, path):
    j = daemon.mgr("GET", path, token=False).json()
    assert j["status"] == "ok"
    assert j["type"] == "manager-facing"
    assert isinstance(j["storage-proxy"], str) and j["storage-proxy"]


def test_unknown_route_is_404(daemon):
    r = daemon.mgr("GET", "/no/such/route")
    assert r.status_code == 404
    problem(r)


@pytest.mark.parametrize(
    "method,path", [("DELETE", "/volumes"), ("GET", "/folder/create"), ("PUT", "/quota-scope")]
)
def test_wrong_method_is_405(daemon, method, path):
    assert daemon.mgr(method, path, json={}).status_code == 405


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_folder_metadata_is_a_noop(daemon, method):
    vfid = new_vfid()
    r = daemon.mgr(method, "/folder/metadata", json={"volume": "local", "vfid": vfid})
    assert 200 <= r.status_code < 300, r.text
    assert not daemon.vfolder_path(vfid).exists()


# --------------------------------------------------------------------------- volumes


def test_volumes(daemon):
    r = daemon.mgr("GET", "/volumes")
    assert r.status_code == 200, r.text
    vols = r.json()["volumes"]
    assert [v["name"] for v in vols] == ["local"]
    v = vols[0]
    assert v["backend"] == "vfs"
    assert v["path"] == str(daemon.vol)
    assert isinstance(v["fsprefix"], str)
    assert isinstance(v["capabilities"], list)
    assert {"vfolder", "quota"} <= set(v["capabilities"])


def test_hwinfo(daemon):
    r = daemon.mgr("GET", "/volume/hwinfo", json={"volume": "local"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "healthy"


def test_fs_usage(daemon):
    r = daemon.mgr("GET", "/folder/fs-usage", json={"volume": "local"})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["capacity_bytes"] > 0
    assert j["used_bytes"] > 0
    assert j["used_bytes"] <= j["capacity_bytes"]


def test_performance_metric(daemon):
    r = daemon.mgr("GET", "/volume/performance-metric", json={"volume": "local"})
    assert r.status_code == 200, r.text
    j = r.json()
    keys = {
        "iops_read",
        "iops_write",
        "io_bytes_read",
        "io_bytes_write",
        "io_usec_read",
        "io_usec_write",
    }
    assert keys <= set(j["metric"])
    assert all(isinstance(j["metric"][k], (int, float)) for k in keys)
    assert isinstance(j["observed_at"], str) and j["observed_at"]


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("GET", "/volume/hwinfo", {}),
        ("GET", "/folder/fs-usage", {}),
        ("GET", "/volume/performance-metric", {}),
        ("POST", "/quota-scope", {"qsid": new_qsid()}),
        ("GET", "/quota-scope", {"qsid": new_qsid()}),
        ("POST", "/folder/create", {"vfid": new_vfid()}),
        ("GET", "/folder/usage", {"vfid": new_vfid()}),
    ],
)
def test_unknown_volume_is_400(daemon, method, path, body):
    # Backend.AI's InvalidVolumeError: 400 storage_access_invalid-parameters.
    r = daemon.mgr(method, path, json={"volume": "no-such-volume", **body})
    assert r.status_code == 400, r.text
    assert problem(r)["error_code"] == "storage_access_invalid-parameters"


# --------------------------------------------------------------------------- parameters


def test_params_from_json_body_on_get(daemon):
    qsid = new_qsid()
    assert qs(daemon, "POST", qsid, options={"limit_bytes": 1234}).status_code == 204
    r = daemon.mgr("GET", "/quota-scope", json={"volume": "local", "qsid": qsid})
    assert r.status_code == 200, r.text
    assert r.json()["limit_bytes"] == 1234


def test_params_from_query_string(daemon):
    qsid = new_qsid()
    assert qs(daemon, "POST", qsid, options={"limit_bytes": 4321}).status_code == 204
    r = daemon.mgr("GET", "/quota-scope", params={"volume": "local", "qsid": qsid})
    assert r.status_code == 200, r.text
    assert r.json()["limit_bytes"] == 4321

    vfid = new_vfid()
    r = daemon.mgr("POST", "/folder/create", params={"volume": "local", "vfid": vfid})
    assert r.status_code == 204, r.text
    assert daemon.vfolder_path(vfid).is_dir()
    r = daemon.mgr("GET", "/folder/mount", params={"volume": "local", "vfid": vfid})
    assert r.status_code == 200, r.text
    assert r.json()["path"] == str(daemon.vfolder_path(vfid))


# --------------------------------------------------------------------------- quota scopes


def test_quota_scope_lifecycle(daemon):
    qsid = new_qsid()
    assert qs(daemon, "POST", qsid, options={"limit_bytes": 10 << 20}).status_code == 204
    assert daemon.scope_path(qsid).is_dir()
    r = qs(daemon, "POST", qsid, options={"limit_bytes": 10 << 20})
    assert r.status_code == 409, r.text
    problem(r)

    r = qs(daemon, "GET", qsid)
    assert r.status_code == 200, r.text
    assert r.json()["used_bytes"] == 0
    assert r.json()["limit_bytes"] == 10 << 20

    assert qs(daemon, "PATCH", qsid, options={"limit_bytes": 20 << 20}).status_code == 204
    assert qs(daemon, "GET", qsid).json()["limit_bytes"] == 20 << 20

    r = daemon.mgr("DELETE", "/quota-scope/quota", json={"volume": "local", "qsid": qsid})
    assert r.status_code == 204, r.text
    j = qs(daemon, "GET", qsid).json()
    assert j["limit_bytes"] is None
    assert daemon.scope_path(qsid).is_dir()

    assert qs(daemon, "DELETE", qsid).status_code == 204
    assert not daemon.scope_path(qsid).exists()
    assert qs(daemon, "GET", qsid).status_code == 404
    assert qs(daemon, "DELETE", qsid).status_code == 404


def test_quota_scope_without_limit(daemon):
    qsid = new_qsid("project")
    assert qs(daemon, "POST", qsid).status_code == 204
    j = qs(daemon, "GET", qsid).json()
    assert j["limit_bytes"] is None
    assert j["used_bytes"] == 0


def test_missing_quota_scope_is_404(daemon):
    r = qs(daemon, "GET", new_qsid())
    assert r.status_code == 404
    problem(r)


def test_patch_creates_missing_scope(daemon):
    qsid = new_qsid()
    assert qs(daemon, "PATCH", qsid, options={"limit_bytes": 777}).status_code == 204
    assert daemon.scope_path(qsid).is_dir()
    assert qs(daemon, "GET", qsid).json()["limit_bytes"] == 777


def test_quota_scope_used_bytes(daemon):
    qsid = new_qsid()
    vfid = daemon.create_vfolder(new_vfid(qsid))
    (daemon.vfolder_path(vfid) / "f").write_bytes(b"x" * 5000)
    j = qs(daemon, "GET", qsid).json()
    assert j["used_bytes"] >= 5000


def test_delete_scope_with_vfolders_is_409(daemon):
    qsid = new_qsid()
    vfid = daemon.create_vfolder(new_vfid(qsid))
    r = qs(daemon, "DELETE", qsid)
    assert r.status_code == 409, r.text
    problem(r)
    assert daemon.vfolder_path(vfid).is_dir()
    assert daemon.delete_vfolder(vfid)["status"] == "completed"
    assert qs(daemon, "DELETE", qsid).status_code == 204
    assert not daemon.scope_path(qsid).exists()


@pytest.mark.parametrize("bad", ["group:xyz", "user:xyz", "user", "nonsense"])
def test_bad_qsid_is_400(daemon, bad):
    r = qs(daemon, "POST", bad)
    assert r.status_code == 400, r.text
    problem(r)
    assert qs(daemon, "GET", bad).status_code == 400


# --------------------------------------------------------------------------- vfolders


def test_create_vfolder_layout_and_mode(daemon):
    qsid = new_qsid()
    vfid = new_vfid(qsid)
    r = daemon.mgr("POST", "/folder/create", json={"volume": "local", "vfid": vfid, "mode": 0o750})
    assert r.status_code == 204, r.text
    p = daemon.vfolder_path(vfid)
    assert p.is_dir() and not p.is_symlink()
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o750
    # The scope was created on demand.
    assert qs(daemon, "GET", qsid).status_code == 200

    r = daemon.mgr("POST", "/folder/create", json={"volume": "local", "vfid": vfid})
    assert r.status_code == 409, r.text
    problem(r)


def test_create_vfolder_default_mode(daemon):
    vfid = daemon.create_vfolder()
    assert stat.S_IMODE(os.stat(daemon.vfolder_path(vfid)).st_mode) == 0o755


def test_create_vfolder_initial_scope_limit(daemon):
    qsid = new_qsid()
    daemon.create_vfolder(
        new_vfid(qsid), options={"initial_max_size_for_quota_scope": 5 << 20}
    )
    assert qs(daemon, "GET", qsid).json()["limit_bytes"] == 5 << 20


def test_bad_vfid_is_400(daemon):
    for bad in ["group:xyz/" + "a" * 32, new_qsid() + "/xyz", "nope"]:
        r = daemon.mgr("POST", "/folder/create", json={"volume": "local", "vfid": bad})
        assert r.status_code == 400, (bad, r.text)


def test_a_parameter_of_the_wrong_type_is_400_not_its_default(daemon, vfid):
    # Before, a value that was not a string counted as missing: relpath 7 listed the root,
    # dst_volume 7 cloned into the source's volume, vfid 7 evicted a whole cache.
    write_tree(daemon.vfolder_path(vfid), {"f": b"x"})
    for path, body in [
        ("/folder/file/list", {"relpath": 7}),
        ("/folder/mount", {"subpath": ["a"]}),
        ("/folder/clone", {"src_volume": "local", "src_vfid": vfid, "dst_vfid": new_vfid(),
                           "dst_volume": 7}),
        ("/folder/file/archive-download-token", {"virtual_folder_id": vfid, "files": ["f"],
                                                 "filename": 7}),
    ]:
        method = "GET" if path == "/folder/mount" else "POST"
        r = daemon.mgr(method, path, json={"volume": "local", "vfid": vfid, **body})
        assert r.status_code == 400 and "must be a string" in problem(r)["msg"], (path, r.text)
    # null is missing, as before.
    r = daemon.mgr("POST", "/folder/file/list", json={"volume": "local", "vfid": vfid,
                                                      "relpath": None})
    assert r.status_code == 200, r.text


def test_usage_and_used_bytes(daemon, vfid):
    write_tree(
        daemon.vfolder_path(vfid),
        {
            "a.bin": b"a" * 100,
            "d1/b.bin": b"b" * 2000,
            "d1/d2/c.txt": b"ccccc",
            "empty": None,
        },
    )
    # below the root: a.bin, d1, d1/b.bin, d1/d2, d1/d2/c.txt, empty
    r = daemon.mgr("GET", "/folder/usage", json={"volume": "local", "vfid": vfid})
    assert r.status_code == 200, r.text
    assert (r.json()["file_count"], r.json()["used_bytes"]) == (6, 2105)

    r = daemon.mgr("GET", "/folder/used-bytes", json={"volume": "local", "vfid": vfid})
    assert r.status_code == 200, r.text
    assert r.json()["used_bytes"] == 2105


def test_usage_of_empty_vfolder(daemon, vfid):
    r = daemon.mgr("GET", "/folder/usage", json={"volume": "local", "vfid": vfid})
    assert r.status_code == 200, r.text
    assert (r.json()["file_count"], r.json()["used_bytes"]) == (0, 0)


def test_delete_vfolder(daemon, vfid):
    p = daemon.vfolder_path(vfid)
    write_tree(p, {"x/y/z.bin": os.urandom(4096), "top.txt": "hello"})
    r = daemon.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": vfid})
    assert r.status_code == 202, r.text
    task_id = r.json()["bgtask_id"]
    assert isinstance(task_id, str) and task_id
    assert not p.exists()  # gone at once; the tree is removed in the background
    assert daemon.wait_task(task_id)["status"] == "completed"

    r = daemon.mgr("GET", "/folder/usage", json={"volume": "local", "vfid": vfid})
    assert r.status_code == 404
    # A repeated delete is 410 Gone, as Backend.AI answers (managers read it as "already deleted").
    r = daemon.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": vfid})
    assert r.status_code == 410
    problem(r)


def test_delete_missing_vfolder_is_410(daemon):
    r = daemon.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": new_vfid()})
    assert r.status_code == 410
    problem(r)
    # An unknown volume is 400, as everywhere.
    r = daemon.mgr("POST", "/folder/delete", json={"volume": "nope", "vfid": new_vfid()})
    assert r.status_code == 400


# --------------------------------------------------------------------------- background tasks


def test_unknown_bgtask_is_404(daemon):
    r = daemon.mgr("GET", "/bgtask", json={"task_id": "nope"})
    assert r.status_code == 404
    problem(r)


def test_task_history_survives_a_restart(make_daemon):
    """GET /bgtask answers the same after a restart (failed and interrupted tasks: the unit
    tests of TaskStore)."""
    d = make_daemon()
    gone = d.create_vfolder()
    r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": gone})
    assert r.status_code == 202, r.text
    task_id = r.json()["bgtask_id"]
    before = d.wait_task(task_id)
    assert before["status"] == "completed"
    d.stop()
    assert (d.state / "tasks.db").is_file()
    d.start()
    after = d.task(task_id)
    assert after.status_code == 200, after.text
    assert after.json() == before
    listed = {t["task_id"] for t in d.mgr("GET", "/bgtasks").json()["tasks"]}
    assert task_id in listed


def test_bgtasks_lists_tasks(daemon, vfid):
    r = daemon.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": vfid})
    task_id = r.json()["bgtask_id"]
    done = daemon.wait_task(task_id)
    assert done["status"] == "completed"
    r = daemon.mgr("GET", "/bgtasks")
    assert r.status_code == 200, r.text
    j = r.json()
    tasks = j["tasks"] if isinstance(j, dict) else j
    ids = {t["task_id"] for t in tasks}
    assert task_id in ids


# --------------------------------------------------------------------------- internal listener


@pytest.mark.parametrize("path", ["/health", "/livez", "/readyz"])
def test_internal_health(daemon, path):
    r = requests.get(daemon.internal_url(path), timeout=10)
    assert r.status_code == 200, r.text


def test_metrics(daemon):
    daemon.mgr("GET", "/volumes")
    daemon.mgr("GET", "/folder/fs-usage", json={"volume": "local"})
    r = requests.get(daemon.internal_url("/metrics"), timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    assert 'sluice_http_requests_total{listener="manager"' in r.text
    assert "sluice_http_request_duration_seconds_bucket" in r.text
