"""vfs maintained usage through a real sluiced: a volume whose figures are kept by Sluice
(usage-walk-budget = 0: never walked per request) and reconciled by background walks."""

import time

import pytest

from conftest import new_qsid, new_vfid, problem, running_daemon, toml_section
from test_upload import new_session, patch

MiB = 1 << 20
RECONCILE_S = 1.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    root = tmp_path_factory.mktemp("sluiced-kept")
    kept = root / "vol-kept"
    kept.mkdir()
    with running_daemon(
        root,
        volumes={"kept": kept},
        extra_toml=toml_section("volume.kept", {"backend": "vfs", "path": str(kept)})
        + toml_section(
            "volume.kept.options",
            {"usage-walk-budget": "0s", "usage-reconcile-interval": f"{int(RECONCILE_S)}s"},
        ),
    ) as d:
        yield d


def usage(d, vfid, **extra):
    r = d.mgr("GET", "/folder/usage", json={"volume": "kept", "vfid": vfid, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(cond, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_writes_through_sluice_count_at_once_and_direct_writes_after_a_reconcile(daemon):
    vfid = daemon.create_vfolder(new_vfid(), volume="kept")
    vf = daemon.vfolder_path(vfid, volume="kept")
    u = usage(daemon, vfid)
    assert (u["file_count"], u["used_bytes"]) == (0, 0)
    assert "measured_at" in u and u["age_seconds"] >= 0
    # An upload through tus: counted without a walk.
    data = b"u" * (3 * MiB)
    token = new_session(daemon, vfid, "sub/up.bin", len(data), volume="kept")
    assert patch(daemon, token, 0, data).status_code == 204
    u = usage(daemon, vfid)
    assert u["used_bytes"] >= len(data)
    # mkdir and delete through the manager API: counted too.
    r = daemon.mgr(
        "POST", "/folder/file/mkdir", json={"volume": "kept", "vfid": vfid, "relpath": "a/b/c"}
    )
    assert r.status_code in (200, 204), r.text
    # Written behind Sluice's back: seen once the background walk has run.
    (vf / "direct.bin").write_bytes(b"d" * MiB)
    fresh = wait_for(lambda: [j for j in [usage(daemon, vfid)] if j["used_bytes"] >= 4 * MiB])[0]
    assert fresh["age_seconds"] < 10
    walked = usage(daemon, vfid, fresh=True)
    assert walked["used_bytes"] == sum(p.stat().st_size for p in vf.rglob("*") if p.is_file())
    assert walked["file_count"] == sum(1 for _ in vf.rglob("*"))
    assert walked["age_seconds"] < 5


def test_a_full_scope_refuses_uploads_by_the_kept_figure(daemon):
    qsid = new_qsid()
    r = daemon.mgr(
        "POST",
        "/quota-scope",
        json={"volume": "kept", "qsid": qsid, "options": {"limit_bytes": 4 * MiB}},
    )
    assert r.status_code == 204, r.text
    vfid = daemon.create_vfolder(new_vfid(qsid), volume="kept")
    token = new_session(daemon, vfid, "one.bin", 3 * MiB, volume="kept")
    # The first session holds 3 MiB: another 2 MiB do not fit even before a byte is written.
    r = daemon.mgr(
        "POST",
        "/folder/file/upload",
        json={"volume": "kept", "vfid": vfid, "relpath": "two.bin", "size": 2 * MiB},
    )
    assert r.status_code == 413, r.text
    assert "promised to other uploads" in problem(r)["msg"]
    assert patch(daemon, token, 0, b"o" * (3 * MiB)).status_code == 204
    # Written: the kept figure says 3 MiB used, so 2 MiB still do not fit.
    r = daemon.mgr(
        "POST",
        "/folder/file/upload",
        json={"volume": "kept", "vfid": vfid, "relpath": "two.bin", "size": 2 * MiB},
    )
    assert r.status_code == 413, r.text
    # Deleting through the manager API frees the room at once.
    r = daemon.mgr(
        "POST",
        "/folder/file/delete",
        json={"volume": "kept", "vfid": vfid, "relpaths": ["one.bin"]},
    )
    assert r.status_code in (200, 202, 204), r.text
    wait_for(lambda: usage(daemon, vfid)["used_bytes"] < MiB)
    new_session(daemon, vfid, "two.bin", 2 * MiB, volume="kept")
