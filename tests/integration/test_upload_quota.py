"""An upload that runs into a kernel quota mid-PATCH: a btrfs volume whose quota scope has a
qgroup limit (root is not exempt from btrfs qgroups), so the staging file's writes fail with
EDQUOT while the body is arriving. Uses the loop-mounted btrfs volume of test_btrfs.py."""

import hashlib
import os

from conftest import new_vfid, problem
from test_btrfs import btrfs_mount, daemon, make_scope, scope  # noqa: F401 - fixtures
from test_upload import claims_of, new_session, offset_of, patch

MiB = 1 << 20


def test_edquot_mid_patch_keeps_the_durable_prefix_and_resumes(daemon):  # noqa: F811
    # The session is made, and its first PATCH checked against the scope, while the limit is
    # large; only then is the limit lowered below the upload, so that the kernel (not Sluice's
    # own check) stops the writes.
    qsid = make_scope(daemon, 256 * MiB)
    vfid = daemon.create_vfolder(new_vfid(qsid), volume="bt")
    vf = daemon.vfolder_path(vfid, "bt")
    data = os.urandom(48 * MiB)
    token = new_session(daemon, vfid, "q/big.bin", len(data), volume="bt")
    stage = vf / ".upload" / claims_of(token)["session"]
    final = vf / "q" / "big.bin"
    r = patch(daemon, token, 0, data[: 4 * MiB])
    assert r.status_code == 204, (r.status_code, r.text)
    assert offset_of(daemon, token) == 4 * MiB

    r = scope(daemon, "PATCH", qsid, options={"limit_bytes": 16 * MiB})
    assert r.status_code == 204, r.text
    assert scope(daemon, "GET", qsid).json()["limit_bytes"] == 16 * MiB

    r = patch(daemon, token, 4 * MiB, data[4 * MiB :])
    assert r.status_code == 413, (r.status_code, r.text[:300])
    msg = problem(r)["msg"]
    assert "quota" in msg, msg
    off = offset_of(daemon, token)
    # Durable: at least the first PATCH. What the failing PATCH wrote past the last sync may be
    # lost (recording a new offset is itself a write the full quota refuses), never corrupted.
    assert 4 * MiB <= off < 16 * MiB, off
    staged = stage.read_bytes()
    assert len(staged) >= off
    assert staged[:off] == data[:off]
    assert not final.exists()
    assert not final.parent.exists() or list(final.parent.iterdir()) == []

    # Room again: the same session resumes from the durable offset and completes.
    r = scope(daemon, "PATCH", qsid, options={"limit_bytes": 256 * MiB})
    assert r.status_code == 204, r.text
    r = patch(daemon, token, off, data[off:])
    assert r.status_code == 204, (r.status_code, r.text[:300])
    assert int(r.headers["Upload-Offset"]) == len(data)
    assert offset_of(daemon, token) == len(data)
    h = hashlib.sha256()
    with open(final, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert not stage.exists()

    assert daemon.delete_vfolder(vfid, "bt")["status"] == "completed"
    assert scope(daemon, "DELETE", qsid).status_code == 204
