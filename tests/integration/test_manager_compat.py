"""What Backend.AI's current manager (26.x) reads from its storage proxy, checked against sluiced.

Bodies are the ones `manager/clients/storage_proxy/manager_facing_client.py` sends, and answers
are judged the way `base.py` turns them into exceptions (transcribed in `manager_exception`), so
each test states what the manager ends up doing, not what Sluice happens to answer.
"""

import os
import re
import uuid

import pytest
import requests

from conftest import new_qsid, new_vfid, running_daemon, write_tree

# common/exception.py: the parts of an error code, "<domain>_<operation>_<detail>".
DOMAINS = {
    "backendai", "api", "auth", "artifact", "artifact-registry", "artifact-association",
    "object-storage", "vfs-storage", "storage-namespace", "plugin", "bgtask", "leader-election",
    "kernel", "user", "keypair", "session", "group", "domain", "image", "image-alias", "template",
    "container-registry", "scaling-group", "instance", "endpoint", "endpoint-auto-scaling",
    "route", "dotfile", "vfolder", "quota-scope", "vfolder-invitation", "model-card",
    "model-service", "model-deployment", "resource-preset", "storage", "watcher", "agent",
    "kernel-registry", "permission", "role", "metric", "storage-proxy", "appproxy",
    "message-queue", "event", "notification", "health-check",
}  # fmt: skip
OPERATIONS = {
    "generic", "create", "access", "read", "update", "start", "soft-delete", "purge",
    "list-query", "auth", "hook", "request", "parsing", "execute", "schedule", "setup", "grant",
    "check-limit",
}  # fmt: skip
DETAILS = {
    "bad-request", "not-found", "gone", "conflict", "already-exists", "invalid-parameters",
    "data-expired", "forbidden", "unauthorized", "incomplete-user-profile", "not-ready",
    "invalid-data-format", "internal-error", "unavailable", "unreachable", "task-timeout",
    "canceled", "not-implemented", "deprecated", "mismatch", "timeout", "content-type-mismatch",
}  # fmt: skip
JSON_CT = re.compile(r"^application/(?:[\w.+-]+?\+)?json")  # aiohttp's check in resp.json()


def error_domain(code):
    """ErrorCode.from_str(code).domain, or None where the manager defaults (InvalidErrorCode)."""
    parts = code.split("_") if isinstance(code, str) else []
    if len(parts) != 3 or parts[0] not in DOMAINS:
        return None
    if parts[1] not in OPERATIONS or parts[2] not in DETAILS:
        return None
    return parts[0]


def manager_exception(r):
    """The exception `_handle_exceptional_response` raises for reply `r` (None for a 2xx)."""
    if 200 <= r.status_code < 300:
        return None
    if not JSON_CT.match(r.headers.get("Content-Type", "")):
        return "PassthroughError"
    data = r.json()
    domain = error_domain(data.get("error_code", "")) or "vfolder"
    if domain == "vfolder":
        return {
            400: "VFolderBadRequest",
            404: "VFolderNotFound",
            410: "VFolderGone",
            500: "VFolderOperationFailed",
        }.get(r.status_code, "VFolderOperationFailed")
    if domain == "quota-scope":
        return "QuotaScopeNotFoundError" if r.status_code == 404 else "UnexpectedStorageProxyResponseError"
    return "UnexpectedStorageProxyResponseError"


def dashed_vfid():
    """A vfid as the manager writes it: str(VFolderID) = "user:<dashed uuid>/<32 hex>"."""
    return f"user:{uuid.uuid4()}/{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def unmanaged(tmp_path_factory):
    """An allowed root with an unmanaged vfolder in it, and a directory outside every root."""
    base = tmp_path_factory.mktemp("unmanaged")
    write_tree(base / "allowed" / "shared", {"data/a.txt": b"alpha", "top.bin": b"\x00\x01"})
    write_tree(base / "outside", {"secret.txt": b"no"})
    return base


@pytest.fixture(scope="module")
def d(tmp_path_factory, unmanaged):
    with running_daemon(
        tmp_path_factory.mktemp("sluiced"), sluice={"unmanaged-roots": [str(unmanaged / "allowed")]}
    ) as daemon:
        yield daemon


def created(d):
    vfid = dashed_vfid()
    r = d.mgr("POST", "/folder/create", json={"volume": "local", "vfid": vfid, "options": {}})
    assert r.status_code == 204, r.text
    return vfid


# --------------------------------------------------------------------------- 1: /folder/mount


def test_mount_answers_the_root_and_the_manager_joins_the_subpath(d):
    vfid = created(d)
    r = d.mgr("POST", "/folder/file/mkdir",
              json={"volume": "local", "vfid": vfid, "relpath": ["a/b"], "exist_ok": True})  # fmt: skip
    assert r.status_code == 200, r.text
    r = d.mgr("GET", "/folder/mount", json={"volume": "local", "vfid": vfid, "subpath": "a/b"})
    assert manager_exception(r) is None, r.text
    # repositories/vfolder/mount.py: host_path = PurePosixPath(reply["path"]) / subpath
    root = d.vfolder_path(vfid)
    assert r.json()["path"] == str(root)
    assert f"{r.json()['path']}/a/b" == str(root / "a" / "b")
    assert (root / "a" / "b").is_dir()


def test_mount_refuses_an_escaping_subpath_and_a_missing_vfolder(d):
    vfid = created(d)
    r = d.mgr("GET", "/folder/mount", json={"volume": "local", "vfid": vfid, "subpath": "../x"})
    assert manager_exception(r) == "VFolderBadRequest", r.text
    r = d.mgr("GET", "/folder/mount", json={"volume": "local", "vfid": dashed_vfid(), "subpath": "."})
    assert r.status_code == 400
    assert manager_exception(r) == "VFolderBadRequest", r.text


# --------------------------------------------------------------------------- 2: the noop volume


def test_noop_volume_exists_unlisted_and_empty(d):
    vols = d.mgr("GET", "/volumes").json()["volumes"]
    assert "noop" not in {v["name"] for v in vols}
    vfid = dashed_vfid()
    r = d.mgr("GET", "/folder/usage", json={"volume": "noop", "vfid": vfid})
    assert manager_exception(r) is None, r.text
    assert (r.json()["used_bytes"], r.json()["file_count"]) == (0, 0)
    r = d.mgr("GET", "/folder/used-bytes", json={"volume": "noop", "vfid": vfid})
    assert r.json()["used_bytes"] == 0
    r = d.mgr("POST", "/folder/file/list", json={"volume": "noop", "vfid": vfid, "relpath": "."})
    assert manager_exception(r) is None and r.json()["items"] == [], r.text
    r = d.mgr("POST", "/folder/file/mkdir",
              json={"volume": "noop", "vfid": vfid, "relpath": ["x"], "exist_ok": False})  # fmt: skip
    assert r.status_code == 200 and r.json()["results"]["failed"] == [], r.text
    r = d.mgr("GET", "/volume/hwinfo", json={"volume": "noop"})
    assert r.json() == {"status": "healthy", "status_info": None, "metadata": {}}
    r = d.mgr("GET", "/quota-scope", json={"volume": "noop", "qsid": f"user:{uuid.uuid4()}"})
    assert manager_exception(r) == "QuotaScopeNotFoundError", r.text


def test_noop_delete_is_a_task(d):
    r = d.mgr("POST", "/folder/delete", json={"volume": "noop", "vfid": dashed_vfid()})
    assert r.status_code == 202, r.text
    assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"


def test_noop_refuses_uploads_rather_than_dropping_them(d):
    r = d.mgr("POST", "/folder/file/upload",
              json={"volume": "noop", "vfid": dashed_vfid(), "relpath": "f", "size": "3"})  # fmt: skip
    assert r.status_code >= 400 and manager_exception(r) is not None, r.text


def download_token(d, volume, vfid, relpath, unmanaged_path, archive=False):
    body = {"volume": volume, "vfid": vfid, "relpath": relpath, "archive": archive,
            "unmanaged_path": unmanaged_path}  # fmt: skip
    return d.mgr("POST", "/folder/file/download", json=body)


def test_unmanaged_download_from_an_allowed_root(d, unmanaged):
    shared = unmanaged / "allowed" / "shared"
    vfid = dashed_vfid()
    r = download_token(d, "noop", vfid, "data/a.txt", str(shared))
    assert manager_exception(r) is None, r.text
    got = requests.get(d.client_url("/download"), params={"token": r.json()["token"]}, timeout=30)
    assert got.status_code == 200 and got.content == b"alpha"
    # A directory as a ZIP, like any vfolder.
    r = download_token(d, "noop", vfid, "data", str(shared), archive=True)
    got = requests.get(d.client_url("/download"), params={"token": r.json()["token"]}, timeout=30)
    assert got.status_code == 200 and got.content[:2] == b"PK"
    # Escapes stay refused beneath the unmanaged directory.
    r = download_token(d, "noop", vfid, "../../outside/secret.txt", str(shared))
    assert r.status_code >= 400, r.text


def test_an_unmanaged_directory_is_resolved_at_each_download(d, unmanaged):
    # The token's directory is looked up (realpath, on the worker pool) for every request,
    # never kept from an earlier one: gone is 404 until it is back, and a symlink put in its
    # place that leads out of the roots is refused.
    allowed = unmanaged / "allowed"
    write_tree(allowed / "moving", {"f.txt": b"here"})
    r = download_token(d, "noop", dashed_vfid(), "f.txt", str(allowed / "moving"))
    assert manager_exception(r) is None, r.text
    params = {"token": r.json()["token"]}

    def fetch():
        return requests.get(d.client_url("/download"), params=params, timeout=30)

    (allowed / "moving").rename(allowed / "moved")
    got = fetch()
    assert got.status_code == 404, got.text
    (allowed / "moved").rename(allowed / "moving")
    got = fetch()
    assert got.status_code == 200 and got.content == b"here", got.text
    (allowed / "moving").rename(allowed / "moved")
    os.symlink(unmanaged / "outside", allowed / "moving")
    write_tree(unmanaged / "outside", {"f.txt": b"no"})
    try:
        got = fetch()
        assert got.status_code == 403 and b"no" != got.content, got.text
    finally:
        os.unlink(allowed / "moving")
        (unmanaged / "outside" / "f.txt").unlink()
        (allowed / "moved").rename(allowed / "moving")
    assert fetch().content == b"here"


def test_unmanaged_download_outside_the_roots_is_refused(d, unmanaged):
    for path in [str(unmanaged / "outside"), str(unmanaged / "allowed" / "shared" / ".." / ".." / "outside"), "relative/path"]:
        r = download_token(d, "noop", dashed_vfid(), "secret.txt", path)
        assert r.status_code in (400, 403), (path, r.text)
        assert "secret" not in r.text or "unmanaged" in r.text
    r = download_token(d, "noop", dashed_vfid(), "secret.txt", None)
    assert manager_exception(r) == "VFolderBadRequest", r.text


def test_managed_download_with_null_unmanaged_path(d):
    # The manager always sends the key; null for managed vfolders.
    vfid = created(d)
    write_tree(d.vfolder_path(vfid), {"f.txt": b"hello"})
    r = download_token(d, "local", vfid, "f.txt", None)
    assert manager_exception(r) is None, r.text
    got = requests.get(d.client_url("/download"), params={"token": r.json()["token"]}, timeout=30)
    assert got.content == b"hello"


# --------------------------------------------------------------------------- 3: error codes


def test_missing_quota_scope_is_quota_scope_not_found(d):
    qsid = f"user:{uuid.uuid4()}"
    for method, path in [("GET", "/quota-scope"), ("DELETE", "/quota-scope/quota")]:
        r = d.mgr(method, path, json={"volume": "local", "qsid": qsid})
        assert r.status_code == 404
        body = r.json()
        assert body["error_code"] == "quota-scope_read_not-found"
        assert body["status"] == 404
        assert manager_exception(r) == "QuotaScopeNotFoundError"


def test_missing_vfolder_is_vfolder_not_found(d):
    r = d.mgr("POST", "/folder/file/list", json={"volume": "local", "vfid": dashed_vfid(), "relpath": "."})
    assert r.json()["error_code"] == "vfolder_read_not-found"
    assert manager_exception(r) == "VFolderNotFound"


def test_problem_status_matches_http_status(d):
    r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": dashed_vfid()})
    assert r.status_code == 410 and r.json()["status"] == 410
    assert manager_exception(r) == "VFolderGone"
    r = d.mgr("PUT", "/folder/usage", json={"volume": "local", "vfid": dashed_vfid()})
    assert r.status_code == 405 and r.json()["status"] == 405


def test_existing_quota_scope_code(d):
    qsid = f"user:{uuid.uuid4()}"
    assert d.mgr("POST", "/quota-scope", json={"volume": "local", "qsid": qsid}).status_code == 204
    r = d.mgr("POST", "/quota-scope", json={"volume": "local", "qsid": qsid})
    assert r.status_code == 409 and r.json()["error_code"] == "quota-scope_create_already-exists"


# --------------------------------------------------------------------------- 4: status codes


def test_status_codes_that_pick_the_managers_exception(d):
    vfid = created(d)
    write_tree(d.vfolder_path(vfid), {"full/x": b"x"})
    r = d.mgr("POST", "/folder/file/list", json={"volume": "local", "vfid": vfid, "relpath": "nope"})
    assert r.status_code == 400 and manager_exception(r) == "VFolderBadRequest", r.text
    r = d.mgr("POST", "/folder/file/delete",
              json={"volume": "local", "vfid": vfid, "relpaths": ["full"], "recursive": False})  # fmt: skip
    assert r.status_code == 400 and manager_exception(r) == "VFolderBadRequest", r.text
    assert (d.vfolder_path(vfid) / "full" / "x").exists()
    r = d.mgr("GET", "/folder/mount", json={"volume": "local", "vfid": dashed_vfid(), "subpath": "."})
    assert r.status_code == 400 and manager_exception(r) == "VFolderBadRequest", r.text
    r = d.mgr("GET", "/folder/usage", json={"volume": "no-such", "vfid": vfid})
    assert r.status_code == 400
    assert r.json()["error_code"] == "storage_access_invalid-parameters"
    # As with the reference: a domain other than vfolder/quota-scope is "unexpected" there.
    assert manager_exception(r) == "UnexpectedStorageProxyResponseError"


# --------------------------------------------------------------------------- 5: hwinfo, /volume/quota


def test_hwinfo_is_hardware_metadata(d):
    r = d.mgr("GET", "/volume/hwinfo", json={"volume": "local"})
    j = r.json()
    # check_type(result, HardwareMetadata)
    assert set(j) == {"status", "status_info", "metadata"}
    assert j["status"] in {"healthy", "degraded", "offline", "unavailable"}
    assert j["status_info"] is None or isinstance(j["status_info"], str)
    assert isinstance(j["metadata"], dict) and j["metadata"]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in j["metadata"].items()), j


@pytest.mark.parametrize(
    "method,body,reason",
    [
        ("GET", {"volume": "local", "vfid": new_vfid()}, "get_quota"),
        ("PATCH", {"volume": "local", "vfid": new_vfid(), "size_bytes": 1}, "set_quota"),
    ],
)
def test_deprecated_volume_quota_is_plain_400(d, method, body, reason):
    r = d.mgr(method, "/volume/quota", json=body)
    assert r.status_code == 400
    assert manager_exception(r) == "PassthroughError"
    assert reason in r.text and "deprecated" in r.text


def test_legacy_scope_ids_still_work(d):
    # Sluice's own tests use 32-hex scope ids; the manager's dashed form is the same scope.
    qsid = new_qsid()
    assert d.mgr("POST", "/quota-scope", json={"volume": "local", "qsid": qsid}).status_code == 204
    hexid = qsid.split(":", 1)[1]
    dashed = f"user:{uuid.UUID(hexid)}"
    r = d.mgr("GET", "/quota-scope", json={"volume": "local", "qsid": dashed})
    assert r.status_code == 200, r.text
