"""Uploads: the tus 1.0.0 core protocol on the client listener's /upload.

Sessions are created through the manager (POST /folder/file/upload); the client side is driven
with `requests` for protocol-level checks and with tus-js-client (tests/tus-client) as a real
client. Every test checks the disk as well as the answers: nothing partial at the final path,
staging files where they should be, nothing written outside the vfolder.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from conftest import (
    REPO,
    TOKEN_SECRET,
    Daemon,
    new_qsid,
    new_vfid,
    problem,
    rss_kib,
    sha256_file,
    tree_state,
)

TUS = {"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream"}
TUS_CLIENT = REPO / "tests" / "tus-client"
MiB = 1 << 20


# --------------------------------------------------------------------------- helpers


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def sign(claims, secret=TOKEN_SECRET):
    """An HS256 JWT signed like Sluice's own tokens (for forged and hostile claims)."""
    head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(json.dumps(claims).encode())
    mac = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(mac)}"


def claims_of(token):
    body = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def upload_url(d):
    return f"http://127.0.0.1:{d.client_port}/upload"


def new_session(d, vfid, relpath, size, volume="local"):
    r = d.mgr(
        "POST",
        "/folder/file/upload",
        json={"volume": volume, "vfid": vfid, "relpath": relpath, "size": size},
    )
    assert r.status_code == 200, r.text
    return r.json()["token"]


def head(d, token, **params):
    return requests.head(upload_url(d), params={"token": token, **params}, timeout=30)


def patch(d, token, offset, data, headers=None, params=None, timeout=60):
    h = dict(TUS)
    h["Upload-Offset"] = str(offset)
    h.update(headers or {})
    h = {k: v for k, v in h.items() if v is not None}
    return requests.patch(
        upload_url(d),
        params={"token": token, **(params or {})},
        headers=h,
        data=data,
        timeout=timeout,
    )


def offset_of(d, token):
    r = head(d, token)
    assert r.status_code == 200, (r.status_code, r.headers)
    return int(r.headers["Upload-Offset"])


def staging(d, vfid, token, volume="local"):
    return d.vfolder_path(vfid, volume) / ".upload" / claims_of(token)["session"]


def upload_whole(d, token, data, piece=None):
    off = 0
    piece = piece or len(data) or 1
    while True:
        r = patch(d, token, off, data[off : off + piece])
        assert r.status_code == 204, (r.status_code, r.text)
        off = int(r.headers["Upload-Offset"])
        if off >= len(data):
            return r


class HeldPatch(threading.Thread):
    """A PATCH whose body sends `first`, then waits for release() before sending `rest`."""

    def __init__(self, url, token, offset, first, rest=b""):
        super().__init__(daemon=True)
        self.url, self.token, self.offset = url, token, offset
        self.first, self.rest = first, rest
        self.released = threading.Event()
        self.resp = None
        self.exc = None

    def body(self):
        yield self.first
        self.released.wait(60)
        if self.rest:
            yield self.rest

    def run(self):
        try:
            self.resp = requests.patch(
                self.url,
                params={"token": self.token},
                headers={**TUS, "Upload-Offset": str(self.offset)},
                data=self.body(),
                timeout=90,
            )
        except requests.RequestException as e:
            self.exc = e

    def release(self):
        self.released.set()
        self.join(90)
        assert not self.is_alive()


def wait_for(pred, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def wait_size(path, size, timeout=15.0):
    wait_for(
        lambda: path.exists() and path.stat().st_size >= size,
        timeout,
        f"{path} to reach {size} bytes",
    )


def written_bytes(d, volume="local"):
    text = requests.get(d.internal_url("/metrics"), timeout=10).text
    m = re.search(
        r'^sluice_volume_written_bytes_total\{[^}]*volume="%s"[^}]*\} (\S+)$' % volume,
        text,
        re.M,
    )
    assert m, "no sluice_volume_written_bytes_total for the volume in /metrics"
    return float(m.group(1))


# --------------------------------------------------------------------------- protocol


def test_options_advertises_tus(make_daemon):
    d = make_daemon(storage_proxy={"max-upload-size": "3g"})
    # A browser's preflight carries Origin; only such requests get the CORS headers.
    r = requests.options(upload_url(d), headers={"Origin": "https://console.example"},
                         timeout=10)
    assert r.status_code in (200, 204)
    assert r.headers["Tus-Resumable"] == "1.0.0"
    assert r.headers["Tus-Version"] == "1.0.0"
    assert r.headers["Tus-Max-Size"] == str(3 << 30)
    assert "PATCH" in r.headers["Access-Control-Allow-Methods"]
    assert "Upload-Offset" in r.headers["Access-Control-Allow-Headers"]
    assert r.headers["Access-Control-Allow-Origin"] == "*"


def test_upload_in_pieces_then_rename_into_place(daemon, vfid):
    data = os.urandom(3 * MiB + 12345)
    token = new_session(daemon, vfid, "deep/er/file.bin", len(data))
    stage = staging(daemon, vfid, token)
    final = daemon.vfolder_path(vfid) / "deep/er/file.bin"
    assert stage.is_file() and stage.stat().st_size == 0
    r = head(daemon, token)
    assert r.status_code == 200
    assert r.headers["Upload-Offset"] == "0"
    assert r.headers["Upload-Length"] == str(len(data))
    assert r.headers["Cache-Control"] == "no-store"
    assert r.headers["Tus-Resumable"] == "1.0.0"
    off = 0
    for piece in (1, MiB, 1000, MiB):
        r = patch(daemon, token, off, data[off : off + piece])
        assert r.status_code == 204, r.text
        off += piece
        assert r.headers["Upload-Offset"] == str(off)
        assert r.headers["Tus-Resumable"] == "1.0.0"
        assert offset_of(daemon, token) == off
        assert not final.exists() and not final.parent.exists()
        assert stage.read_bytes() == data[:off]
    r = patch(daemon, token, off, data[off:])
    assert r.status_code == 204
    assert r.headers["Upload-Offset"] == str(len(data))
    assert final.read_bytes() == data
    assert not stage.exists()
    # Staged privately, published readable by the session containers (as Backend.AI does).
    assert stat.S_IMODE(final.stat().st_mode) == 0o644
    # A finished session still answers HEAD (a client that lost the last answer), and an
    # empty PATCH at the end is harmless; anything else is refused.
    r = head(daemon, token)
    assert r.status_code == 200 and r.headers["Upload-Offset"] == str(len(data))
    r = patch(daemon, token, len(data), b"")
    assert r.status_code == 204 and r.headers["Upload-Offset"] == str(len(data))
    assert patch(daemon, token, 0, b"x").status_code == 409
    assert patch(daemon, token, len(data), b"x").status_code == 413
    assert final.read_bytes() == data


def test_empty_file(daemon, vfid):
    token = new_session(daemon, vfid, "empty.txt", 0)
    r = patch(daemon, token, 0, b"")
    assert r.status_code == 204 and r.headers["Upload-Offset"] == "0"
    assert (daemon.vfolder_path(vfid) / "empty.txt").read_bytes() == b""
    # Complete, as any finished session: HEAD says so, and a PATCH retried (its 204 lost) too.
    assert offset_of(daemon, token) == 0
    r = patch(daemon, token, 0, b"")
    assert r.status_code == 204 and r.headers["Upload-Offset"] == "0", r.text
    # Completed by a HEAD alone (every byte of an empty file is there): the same afterwards.
    token = new_session(daemon, vfid, "empty2.txt", 0)
    assert offset_of(daemon, token) == 0
    assert (daemon.vfolder_path(vfid) / "empty2.txt").read_bytes() == b""
    assert offset_of(daemon, token) == 0
    assert patch(daemon, token, 0, b"").status_code == 204


def test_wrong_offsets_are_409_and_change_nothing(daemon, vfid):
    data = os.urandom(100_000)
    token = new_session(daemon, vfid, "f.bin", len(data))
    assert patch(daemon, token, 0, data[:40_000]).status_code == 204
    before = tree_state(daemon.vfolder_path(vfid))
    # (An offset past the length too: 409 with the session's offset, as tus requires; before,
    # 413 without it.)
    for off in (0, 1, 39_999, 40_001, 99_999, 100_000, 100_001):
        r = patch(daemon, token, off, data[off : off + 10])
        assert r.status_code == 409, (off, r.status_code, r.text)
        assert r.headers["Upload-Offset"] == "40000"
        assert "40000" in problem(r)["msg"]
    assert tree_state(daemon.vfolder_path(vfid)) == before
    assert offset_of(daemon, token) == 40_000
    assert patch(daemon, token, 40_000, data[40_000:]).status_code == 204
    assert (daemon.vfolder_path(vfid) / "f.bin").read_bytes() == data


@pytest.mark.parametrize(
    "headers,status",
    [
        ({"Tus-Resumable": None}, 412),
        ({"Tus-Resumable": "0.2.2"}, 412),
        ({"Tus-Resumable": "1.0.0, 1.0.0"}, 412),
        ({"Content-Type": None}, 415),
        ({"Content-Type": "application/octet-stream"}, 415),
        ({"Content-Type": "text/plain"}, 415),
        ({"Upload-Offset": None}, 400),
        ({"Upload-Offset": ""}, 400),
        ({"Upload-Offset": "abc"}, 400),
        ({"Upload-Offset": "-1"}, 400),
        ({"Upload-Offset": "+0"}, 400),
        ({"Upload-Offset": "1.0"}, 400),
        ({"Upload-Offset": "0x10"}, 400),
        ({"Upload-Offset": "1 2"}, 400),
        ({"Upload-Offset": "99999999999999999999999999"}, 400),
        ({"Upload-Length": "5"}, 400),
        ({"Upload-Length": "many"}, 400),
    ],
)
def test_malformed_headers(daemon, vfid, headers, status):
    data = b"0123456789"
    token = new_session(daemon, vfid, "m.bin", len(data))
    stage = staging(daemon, vfid, token)
    r = patch(daemon, token, 0, data, headers=headers)
    assert r.status_code == status, r.text
    problem(r)
    assert r.headers["Tus-Resumable"] == "1.0.0"
    if status == 412:
        assert r.headers["Tus-Version"] == "1.0.0"
    assert stage.stat().st_size == 0
    assert offset_of(daemon, token) == 0
    assert not (daemon.vfolder_path(vfid) / "m.bin").exists()
    # The session is still usable.
    assert patch(daemon, token, 0, data).status_code == 204
    assert (daemon.vfolder_path(vfid) / "m.bin").read_bytes() == data


def test_head_refuses_another_tus_version(daemon, vfid):
    """A HEAD naming another Tus-Resumable is 412 with Tus-Version, before anything is done (a
    HEAD may commit a complete upload); before, it was answered. One naming none is answered,
    as clients of Backend.AI's storage proxy may send none."""
    token = new_session(daemon, vfid, "v.bin", 3)
    r = requests.head(upload_url(daemon), params={"token": token},
                      headers={"Tus-Resumable": "0.2.2"}, timeout=30)
    assert r.status_code == 412 and r.headers["Tus-Version"] == "1.0.0", r.status_code
    assert offset_of(daemon, token) == 0


def test_a_fifo_for_a_record_is_an_error_not_a_hang(daemon, vfid):
    """`.upload` lies in the vfolder, which its users write: a FIFO made where a session's
    offset record goes made every open of it wait for a writer (a HEAD held a pool thread for
    good, and so did the janitor's sweep). Now it is an error at once."""
    token = new_session(daemon, vfid, "fifo.bin", 10)
    record = Path(str(staging(daemon, vfid, token)) + ".offset")
    if record.exists():
        record.unlink()
    os.mkfifo(record)
    try:
        assert head(daemon, token).status_code >= 500  # (a HEAD's answer has no body)
        r = patch(daemon, token, 0, b"0123456789", timeout=15)
        assert r.status_code >= 500 and "not a regular file" in r.text, (r.status_code, r.text)
    finally:
        record.unlink()


def test_duplicate_offset_header_is_400(daemon, vfid):
    token = new_session(daemon, vfid, "dup.bin", 4)
    with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=10) as s:
        s.sendall(
            (
                f"PATCH /upload?token={token} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
                "Content-Type: application/offset+octet-stream\r\nUpload-Offset: 0\r\n"
                "Upload-Offset: 0\r\nContent-Length: 4\r\n\r\nabcd"
            ).encode()
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 400")
    assert offset_of(daemon, token) == 0


def test_expect_100_continue(daemon, vfid):
    """A refused PATCH is answered before the body is sent; an accepted one gets 100 first."""
    data = os.urandom(64 * 1024)
    token = new_session(daemon, vfid, "cont.bin", len(data))
    req = (
        "PATCH /upload?token={t} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
        "Content-Type: application/offset+octet-stream\r\nUpload-Offset: {o}\r\n"
        "Content-Length: {n}\r\nExpect: 100-continue\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=10) as s:
        s.sendall(req.format(t=token, o=7, n=100).encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 409")
    with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=10) as s:
        s.sendall(req.format(t=token, o=0, n=len(data)).encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 100")
        s.sendall(data)
        resp = s.recv(4096)
        assert resp.startswith(b"HTTP/1.1 204"), resp
        assert f"Upload-Offset: {len(data)}".encode() in resp
    assert (daemon.vfolder_path(vfid) / "cont.bin").read_bytes() == data


# --------------------------------------------------------------------------- tokens


def test_forged_expired_and_wrong_tokens(daemon, vfid):
    data = b"hello"
    token = new_session(daemon, vfid, "t.txt", len(data))
    c = claims_of(token)
    vf = daemon.vfolder_path(vfid)
    before = tree_state(vf)
    bad = {
        "missing": None,
        "garbage": "not-a-jwt",
        "other secret": sign(c, secret="some-other-secret"),
        "expired": sign({**c, "exp": int(time.time()) - 10}),
        "download op": sign({**c, "op": "download"}),
        "no op": sign({k: v for k, v in c.items() if k != "op"}),
        "tampered": token[:-2] + ("AA" if not token.endswith("AA") else "BB"),
        "alg none": b64url(b'{"alg":"none","typ":"JWT"}') + "." + token.split(".")[1] + ".",
    }
    for what, t in bad.items():
        params = {} if t is None else {"token": t}
        r = requests.head(upload_url(daemon), params=params, timeout=10)
        assert r.status_code == 403, (what, r.status_code)
        r = requests.patch(
            upload_url(daemon),
            params=params,
            headers={**TUS, "Upload-Offset": "0"},
            data=data,
            timeout=10,
        )
        assert r.status_code == 403, (what, r.status_code, r.text)
        assert problem(r)["status"] == 403
    assert tree_state(vf) == before
    assert patch(daemon, token, 0, data).status_code == 204


def test_missing_session_is_404(daemon, vfid):
    token = new_session(daemon, vfid, "gone.bin", 10)
    staging(daemon, vfid, token).unlink()
    assert head(daemon, token).status_code == 404
    r = patch(daemon, token, 0, b"0123456789")
    assert r.status_code == 404
    assert "session" in problem(r)["msg"]
    # A well-signed token for a session that never existed, or a vfolder that is not there.
    c = claims_of(token)
    assert head(daemon, sign({**c, "session": "ab" * 16})).status_code == 404
    assert head(daemon, sign({**c, "vfid": new_vfid()})).status_code == 404
    assert head(daemon, sign({**c, "volume": "no-such-volume"})).status_code == 400  # InvalidVolumeError
    assert not (daemon.vfolder_path(vfid) / "gone.bin").exists()


@pytest.mark.parametrize(
    "change",
    [
        {"relpath": "../escape.bin"},
        {"relpath": "a/../../escape.bin"},
        {"relpath": "/etc/escape.bin"},
        {"relpath": ""},
        {"relpath": "."},
        {"relpath": "a/\u0000b"},
        {"relpath": ".upload/x"},
        {"relpath": "x" * 300},
        {"relpath": 7},
        {"session": "../../escape"},
        {"session": "abc"},
        {"session": "AB" * 16},
        {"session": "ab" * 16 + ".offset"},
        {"vfid": "../../../etc"},
        {"vfid": 5},
        {"size": -1},
        {"size": "10"},
        {"size": 1.5},
    ],
)
def test_hostile_claims_are_400(daemon, vfid, change):
    """A validly signed token with hostile claims writes nothing anywhere."""
    token = new_session(daemon, vfid, "ok.bin", 10)
    c = claims_of(token)
    c.update(change)
    forged = sign(c)
    before = tree_state(daemon.root, exclude=("sluiced.log",))
    r = head(daemon, forged)
    assert r.status_code == 400, (change, r.status_code)
    r = patch(daemon, forged, 0, b"0123456789")
    assert r.status_code == 400, (change, r.status_code, r.text)
    problem(r)
    assert tree_state(daemon.root, exclude=("sluiced.log",)) == before
    assert offset_of(daemon, token) == 0


@pytest.mark.parametrize("dst_dir", ["..", "../..", "/tmp", "a/../../x", ".upload"])
def test_hostile_dst_dir_is_400(daemon, vfid, dst_dir):
    token = new_session(daemon, vfid, "ok.bin", 4)
    before = tree_state(daemon.root, exclude=("sluiced.log",))
    r = patch(daemon, token, 0, b"abcd", params={"dst_dir": dst_dir})
    assert r.status_code == 400, r.text
    assert tree_state(daemon.root, exclude=("sluiced.log",)) == before


def test_dst_dir_places_the_file_below_it(daemon, vfid):
    token = new_session(daemon, vfid, "in/dst.bin", 4)
    r = patch(daemon, token, 0, b"abcd", params={"dst_dir": "sub/dir"})
    assert r.status_code == 204
    assert (daemon.vfolder_path(vfid) / "sub/dir/in/dst.bin").read_bytes() == b"abcd"


def test_manager_refuses_hostile_relpaths(daemon, vfid):
    for rel in ("../x", "/x", "", ".upload/x", "a/../../x"):
        r = daemon.mgr(
            "POST",
            "/folder/file/upload",
            json={"volume": "local", "vfid": vfid, "relpath": rel, "size": 1},
        )
        assert r.status_code == 400, (rel, r.text)
    assert not (daemon.vfolder_path(vfid) / ".upload").exists() or not any(
        (daemon.vfolder_path(vfid) / ".upload").iterdir()
    )


def test_symlink_out_of_the_vfolder_is_refused(daemon, vfid, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    vf = daemon.vfolder_path(vfid)
    os.symlink(outside, vf / "link")
    data = b"x" * 1000
    # Through an existing symlink: refused before any byte is written.
    token = new_session(daemon, vfid, "link/x.bin", len(data))
    r = patch(daemon, token, 0, data)
    assert r.status_code == 400, r.text
    assert staging(daemon, vfid, token).stat().st_size == 0
    # Through a symlink planted while the PATCH is running: the rename into place refuses it.
    token = new_session(daemon, vfid, "late/x.bin", len(data))
    held = HeldPatch(upload_url(daemon), token, 0, data[:500], data[500:])
    held.start()
    wait_size(staging(daemon, vfid, token), 500)
    os.symlink(outside, vf / "late")
    held.release()
    assert held.exc is None and held.resp.status_code == 400, held.resp.text
    assert list(outside.iterdir()) == []
    # The bytes stay staged: nothing partial or misplaced became visible.
    assert staging(daemon, vfid, token).read_bytes() == data


def test_the_staging_directory_is_refused_through_a_symlink(daemon, vfid):
    """A symlink in the vfolder to the vfolder itself spells the staging directory another way:
    an upload to lnk/.upload/<another session> must not replace that session's staged bytes."""
    vf = daemon.vfolder_path(vfid)
    victim = os.urandom(1000)
    vtoken = new_session(daemon, vfid, "victim.bin", len(victim))
    assert patch(daemon, vtoken, 0, victim[:400]).status_code == 204
    vstage = staging(daemon, vfid, vtoken)
    os.symlink(".", vf / "lnk")
    for rel in (f"lnk/.upload/{vstage.name}", "lnk/.upload/sub/x.bin"):
        data = b"A" * 1000
        token = new_session(daemon, vfid, rel, len(data))
        r = patch(daemon, token, 0, data)
        assert r.status_code == 400 and "staging directory" in r.text, (rel, r.text)
    assert not (vf / ".upload" / "sub").exists()
    assert vstage.read_bytes()[:400] == victim[:400]
    # The victim's upload goes on from where it was, and lands whole.
    r = head(daemon, vtoken)
    assert r.status_code == 200 and r.headers["Upload-Offset"] == "400"
    assert patch(daemon, vtoken, 400, victim[400:]).status_code == 204
    assert (vf / "victim.bin").read_bytes() == victim


def test_existing_directory_is_not_replaced_but_a_file_is(daemon, vfid):
    vf = daemon.vfolder_path(vfid)
    (vf / "adir").mkdir()
    (vf / "adir" / "keep").write_text("keep")
    token = new_session(daemon, vfid, "adir", 3)
    r = patch(daemon, token, 0, b"abc")
    assert r.status_code == 409, r.text
    assert (vf / "adir" / "keep").read_text() == "keep"
    # A parent that is a file.
    (vf / "afile").write_text("x")
    token = new_session(daemon, vfid, "afile/child.bin", 3)
    r = patch(daemon, token, 0, b"abc")
    assert r.status_code == 409, r.text
    assert (vf / "afile").read_text() == "x"
    # An existing file is replaced atomically (Backend.AI replaces too).
    (vf / "old.txt").write_text("old contents")
    token = new_session(daemon, vfid, "old.txt", 3)
    assert patch(daemon, token, 0, b"new").status_code == 204
    assert (vf / "old.txt").read_text() == "new"


# --------------------------------------------------------------------------- sizes


def test_oversize_bodies_are_413(daemon, vfid):
    data = os.urandom(10_000)
    token = new_session(daemon, vfid, "o.bin", len(data))
    stage = staging(daemon, vfid, token)
    # Known length: refused before the body is read.
    r = patch(daemon, token, 0, data + b"x")
    assert r.status_code == 413, r.text
    assert stage.stat().st_size == 0 and offset_of(daemon, token) == 0
    assert patch(daemon, token, 0, data[:6000]).status_code == 204
    r = patch(daemon, token, 6000, data[6000:] + b"extra")
    assert r.status_code == 413
    assert offset_of(daemon, token) == 6000
    # An offset past the length is a mismatch (tus: 409 with the offset; before, 413).
    r = patch(daemon, token, 10_001, b"")
    assert r.status_code == 409 and r.headers["Upload-Offset"] == "6000", r.status_code

    # Unknown length (chunked): refused when the body runs past the end, and void as a whole.
    def gen():
        yield data[6000:8000]
        yield data[8000:] + b"more than declared"

    r = patch(daemon, token, 6000, gen())
    assert r.status_code == 413, r.text
    assert offset_of(daemon, token) == 6000
    assert stage.read_bytes() == data[:6000]
    assert not (daemon.vfolder_path(vfid) / "o.bin").exists()
    assert patch(daemon, token, 6000, data[6000:]).status_code == 204
    assert (daemon.vfolder_path(vfid) / "o.bin").read_bytes() == data


def test_max_upload_size(make_daemon):
    d = make_daemon(storage_proxy={"max-upload-size": "1m"})
    vfid = d.create_vfolder()
    r = d.mgr(
        "POST",
        "/folder/file/upload",
        json={"volume": "local", "vfid": vfid, "relpath": "big", "size": MiB + 1},
    )
    assert r.status_code == 413
    token = new_session(d, vfid, "big", MiB)
    # A token claiming more than the limit (minted before the limit was lowered, say).
    forged = sign({**claims_of(token), "size": 2 * MiB})
    assert head(d, forged).status_code == 413
    r = patch(d, forged, 0, b"x" * 1000)
    assert r.status_code == 413
    assert staging(d, vfid, token).stat().st_size == 0
    assert patch(d, token, 0, b"y" * MiB).status_code == 204


def test_quota_limit_is_enforced_before_bytes_are_written(daemon):
    qsid = new_qsid()
    r = daemon.mgr(
        "POST",
        "/quota-scope",
        json={"volume": "local", "qsid": qsid, "options": {"limit_bytes": 2 * MiB}},
    )
    assert r.status_code == 204, r.text
    vfid = daemon.create_vfolder(new_vfid(qsid))
    vf = daemon.vfolder_path(vfid)
    # At session creation.
    r = daemon.mgr(
        "POST",
        "/folder/file/upload",
        json={"volume": "local", "vfid": vfid, "relpath": "x", "size": 2 * MiB + 1},
    )
    assert r.status_code == 413, r.text
    assert "quota" in problem(r)["msg"]
    # At the first PATCH: usage grew after the session was made.
    token = new_session(daemon, vfid, "x", MiB)
    (vf / "filler").write_bytes(b"f" * (MiB + MiB // 2))
    r = patch(daemon, token, 0, b"z" * MiB)
    assert r.status_code == 413, r.text
    assert "quota" in problem(r)["msg"]
    assert staging(daemon, vfid, token).stat().st_size == 0
    assert not (vf / "x").exists()
    # Room again: the same session goes through.
    (vf / "filler").unlink()
    assert patch(daemon, token, 0, b"z" * MiB).status_code == 204
    assert (vf / "x").stat().st_size == MiB


def test_enospc_mid_upload_keeps_the_durable_prefix(tmp_path):
    """A full filesystem mid-PATCH: 507, the staging file intact up to the durable offset, and
    the upload resumes once there is room."""
    d = Daemon(tmp_path / "d")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(d.vol)], check=True)
    try:
        d.start()
        vfid = d.create_vfolder()
        filler = d.vol / "filler"
        filler.write_bytes(b"f" * (11 * MiB))
        data = os.urandom(8 * MiB)
        token = new_session(d, vfid, "full.bin", len(data))
        assert patch(d, token, 0, data[: 2 * MiB]).status_code == 204
        r = patch(d, token, 2 * MiB, data[2 * MiB :])
        assert r.status_code == 507, (r.status_code, r.text)
        assert "out of space" in problem(r)["msg"]
        # A tus client resumes from the answer itself: it carries the protocol and the offset.
        assert r.headers.get("Tus-Resumable") == "1.0.0"
        off = offset_of(d, token)
        assert int(r.headers["Upload-Offset"]) == off
        assert 2 * MiB <= off < len(data)
        # Every byte written before ENOSPC was synced and recorded: the offset record is
        # overwritten in place, which needs no room.
        reached = int(re.search(r"at offset (\d+)", problem(r)["msg"]).group(1))
        assert off == reached, (off, reached)
        assert staging(d, vfid, token).read_bytes()[:off] == data[:off]
        assert not (d.vfolder_path(vfid) / "full.bin").exists()
        filler.unlink()
        assert patch(d, token, off, data[off:]).status_code == 204
        assert (d.vfolder_path(vfid) / "full.bin").read_bytes() == data
        d.stop()
    finally:
        d.kill()
        subprocess.run(["umount", "-l", str(d.vol)], check=False)


# --------------------------------------------------------------------------- one writer


def test_concurrent_patch_is_409(daemon, vfid):
    data = os.urandom(2 * MiB)
    token = new_session(daemon, vfid, "c.bin", len(data))
    stage = staging(daemon, vfid, token)
    held = HeldPatch(upload_url(daemon), token, 0, data[:MiB], data[MiB:])
    held.start()
    try:
        wait_size(stage, MiB)
        for off in (0, MiB):
            r = patch(daemon, token, off, data[off:])
            assert r.status_code == 409, (off, r.status_code, r.text)
            assert "one writer" in problem(r)["msg"]
        assert head(daemon, token).status_code == 200
    finally:
        held.release()
    assert held.exc is None, held.exc
    assert held.resp.status_code == 204, held.resp.text
    assert (daemon.vfolder_path(vfid) / "c.bin").read_bytes() == data


def test_two_daemons_on_one_volume_share_the_lock(make_daemon, tmp_path):
    d1 = make_daemon()
    d2 = Daemon(tmp_path / "second")
    d2.volumes["local"] = d2.vol = d1.vol
    d2.config_path.write_text(d2._config({}, {}, ""))
    d2.start()
    try:
        vfid = d1.create_vfolder()
        data = os.urandom(3 * MiB)
        token = new_session(d1, vfid, "shared.bin", len(data))
        held = HeldPatch(upload_url(d1), token, 0, data[:MiB], data[MiB : 2 * MiB])
        held.start()
        try:
            wait_size(staging(d1, vfid, token), MiB)
            r = patch(d2, token, 0, data)
            assert r.status_code == 409, r.text
            r = patch(d2, token, MiB, data[MiB:])
            assert r.status_code == 409, r.text
        finally:
            held.release()
        assert held.exc is None and held.resp.status_code == 204
        # The offset lives on the volume: the other node continues where the first stopped.
        assert offset_of(d2, token) == 2 * MiB
        assert patch(d2, token, 0, data).status_code == 409
        assert patch(d2, token, 2 * MiB, data[2 * MiB :]).status_code == 204
        assert offset_of(d1, token) == len(data)
        assert (d1.vfolder_path(vfid) / "shared.bin").read_bytes() == data
        d2.stop()
    finally:
        d2.kill()


def test_a_session_finished_through_another_daemon_releases_its_reservation(make_daemon,
                                                                            tmp_path):
    """A session made through one node and finished through another: the node that made it
    reserved its bytes in its own memory, and must not go on counting them once the file is
    in place (the usage figure holds them then), or it refuses uploads that fit."""
    d1 = make_daemon(storage_proxy={"session-expire": "8s"})  # a sweep every 2 s
    d2 = Daemon(tmp_path / "second")
    d2.volumes["local"] = d2.vol = d1.vol
    d2.config_path.write_text(d2._config({}, {}, ""))
    d2.start()
    try:
        qsid = new_qsid()
        r = d1.mgr("POST", "/quota-scope",
                   json={"volume": "local", "qsid": qsid, "options": {"limit_bytes": 4 * MiB}})
        assert r.status_code == 204, r.text
        vfid = d1.create_vfolder(new_vfid(qsid))
        data = os.urandom(3 * MiB)
        token = new_session(d1, vfid, "first.bin", len(data))  # 3 MiB reserved on d1
        assert patch(d2, token, 0, data).status_code == 204  # finished through d2
        assert (d1.vfolder_path(vfid) / "first.bin").read_bytes() == data
        # 3 MiB used: half a MiB fits, 2 MiB do not (the reservation is not counted twice).
        r = d1.mgr("POST", "/folder/file/upload",
                   json={"volume": "local", "vfid": vfid, "relpath": "x", "size": 2 * MiB})
        assert r.status_code == 413, r.text
        assert "promised" not in problem(r)["msg"], problem(r)
        token = new_session(d1, vfid, "second.bin", MiB // 2)
        assert patch(d1, token, 0, b"s" * (MiB // 2)).status_code == 204
        # The same found by d1's sweep, before any refusal.
        (d1.vfolder_path(vfid) / "first.bin").unlink()
        data = os.urandom(MiB)
        token = new_session(d1, vfid, "again.bin", len(data))
        assert patch(d2, token, 0, data).status_code == 204
        wait_for(lambda: "reservations of 1 upload" in d1.log(), what="d1's sweep")
        token = new_session(d1, vfid, "third.bin", 2 * MiB)
        assert patch(d1, token, 0, b"t" * 2 * MiB).status_code == 204
        d2.stop()
    finally:
        d2.kill()


def test_interrupted_patch_keeps_what_arrived(daemon, vfid):
    data = os.urandom(4 * MiB)
    token = new_session(daemon, vfid, "cut.bin", len(data))
    stage = staging(daemon, vfid, token)
    with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=10) as s:
        s.sendall(
            (
                f"PATCH /upload?token={token} HTTP/1.1\r\nHost: x\r\nTus-Resumable: 1.0.0\r\n"
                "Content-Type: application/offset+octet-stream\r\nUpload-Offset: 0\r\n"
                f"Content-Length: {len(data)}\r\n\r\n"
            ).encode()
        )
        s.sendall(data[: 3 * MiB])
        wait_size(stage, 3 * MiB)
    # The connection is gone: the server syncs what it received and advances the offset.
    wait_for(lambda: offset_of(daemon, token) == 3 * MiB, what="offset 3 MiB")
    assert not (daemon.vfolder_path(vfid) / "cut.bin").exists()
    assert patch(daemon, token, 3 * MiB, data[3 * MiB :]).status_code == 204
    assert (daemon.vfolder_path(vfid) / "cut.bin").read_bytes() == data


def test_bytes_past_the_durable_offset_are_discarded(daemon, vfid):
    """A writer that died between two syncs left bytes past the durable offset."""
    data = os.urandom(300_000)
    token = new_session(daemon, vfid, "tail.bin", len(data))
    assert patch(daemon, token, 0, data[:100_000]).status_code == 204
    stage = staging(daemon, vfid, token)
    with open(stage, "ab") as f:
        f.write(b"\0garbage from a crashed writer" * 1000)
    assert offset_of(daemon, token) == 100_000
    assert patch(daemon, token, 100_000, data[100_000:]).status_code == 204
    assert (daemon.vfolder_path(vfid) / "tail.bin").read_bytes() == data


def test_crash_between_last_sync_and_rename_is_finished_by_head(daemon, vfid):
    data = os.urandom(50_000)
    token = new_session(daemon, vfid, "x/y/fin.bin", len(data))
    stage = staging(daemon, vfid, token)
    # The state a crash right after the last sync leaves: all bytes durable, not renamed yet.
    stage.write_bytes(data)
    (stage.parent / (stage.name + ".offset")).write_text(json.dumps({"offset": len(data)}))
    final = daemon.vfolder_path(vfid) / "x/y/fin.bin"
    assert not final.exists()
    r = head(daemon, token)
    assert r.status_code == 200 and r.headers["Upload-Offset"] == str(len(data))
    assert final.read_bytes() == data and not stage.exists()


def test_metrics_count_written_bytes(daemon, vfid):
    before = written_bytes(daemon)
    data = os.urandom(MiB)
    upload_whole(daemon, new_session(daemon, vfid, "m.bin", len(data)), data)
    assert written_bytes(daemon) - before >= len(data)


# --------------------------------------------------------------------------- abandoned sessions


def test_abandoned_sessions_are_swept_periodically(make_daemon):
    # session-expire 2 s: abandoned after 2 s + 2 s grace; the sweep runs every second.
    d = make_daemon(storage_proxy={"session-expire": "2s"})
    vfid = d.create_vfolder()
    data = os.urandom(200_000)
    t_abandoned = new_session(d, vfid, "abandoned.bin", len(data))
    assert patch(d, t_abandoned, 0, data[:1000]).status_code == 204
    t_held = new_session(d, vfid, "held.bin", len(data))
    stage_abandoned = staging(d, vfid, t_abandoned)
    stage_held = staging(d, vfid, t_held)
    sidecar = stage_abandoned.parent / (stage_abandoned.name + ".offset")
    assert sidecar.exists()
    # A PATCH that holds its session the whole time: old, but alive.
    held = HeldPatch(upload_url(d), t_held, 0, data[:100_000], data[100_000:])
    held.start()
    try:
        wait_size(stage_held, 100_000)
        wait_for(lambda: not stage_abandoned.exists(), timeout=20, what="the sweep")
        assert not sidecar.exists()
        time.sleep(2.5)
        assert stage_held.exists()
        assert stage_held.stat().st_size == 100_000
    finally:
        held.release()
    assert held.exc is None and held.resp.status_code == 204, held.resp.text
    assert (d.vfolder_path(vfid) / "held.bin").read_bytes() == data
    # The completed session's marker and the empty staging directory go too.
    wait_for(
        lambda: not (d.vfolder_path(vfid) / ".upload").exists(),
        timeout=20,
        what="the staging directory to go",
    )


def plant_old_session(vf, name=None, age=3 * 86400):
    up = vf / ".upload"
    up.mkdir(exist_ok=True)
    name = name or os.urandom(16).hex()
    f = up / name
    f.write_bytes(b"stale")
    side = up / (name + ".offset")
    side.write_text('{"offset": 5}')
    t = time.time() - age
    for p in (f, side):
        os.utime(p, (t, t))
    return f, side


def test_abandoned_sessions_are_swept_at_start_and_on_session_creation(make_daemon):
    d = make_daemon()
    v3 = d.create_vfolder()
    legacy = os.urandom(16).hex()
    d.create_vfolder(legacy)
    vf_legacy = d.vol / legacy[0:2] / legacy[2:4] / legacy[4:]
    assert vf_legacy.is_dir()
    d.stop()
    old_v3 = plant_old_session(d.vfolder_path(v3))
    old_legacy = plant_old_session(vf_legacy)
    young = plant_old_session(d.vfolder_path(v3), age=0)
    d.start()
    wait_for(
        lambda: not any(p.exists() for p in old_v3 + old_legacy),
        timeout=15,
        what="the start-up sweep",
    )
    assert all(p.exists() for p in young)
    # The periodic sweep is minutes away with the default session-expire: creating a session
    # in the vfolder sweeps it.
    stale = plant_old_session(d.vfolder_path(v3))
    new_session(d, v3, "n.bin", 1)
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in young)


# --------------------------------------------------------------------------- crash safety


class SlowSender(threading.Thread):
    """PATCHes data[offset:] in pieces with pauses; counts the bytes handed to the socket."""

    def __init__(self, d, token, offset, data, piece=256 * 1024, pause=0.05):
        super().__init__(daemon=True)
        self.url = upload_url(d)
        self.token, self.offset, self.data = token, offset, data
        self.piece, self.pause = piece, pause
        self.sent = 0
        self.resp = None
        self.exc = None

    def body(self):
        for i in range(self.offset, len(self.data), self.piece):
            chunk = self.data[i : i + self.piece]
            self.sent += len(chunk)  # counted before it goes: an upper bound of what arrived
            yield chunk
            time.sleep(self.pause)

    def run(self):
        try:
            self.resp = requests.patch(
                self.url,
                params={"token": self.token},
                headers={**TUS, "Upload-Offset": str(self.offset)},
                data=self.body(),
                timeout=120,
            )
        except requests.RequestException as e:
            self.exc = e


def test_kill_9_mid_upload_then_resume(make_daemon):
    d = make_daemon()
    vfid = d.create_vfolder()
    vf = d.vfolder_path(vfid)
    files = {f"crash/{i}.bin": os.urandom(32 * MiB) for i in range(2)}
    tokens = {rel: new_session(d, vfid, rel, len(data)) for rel, data in files.items()}
    senders = [SlowSender(d, tokens[rel], 0, data) for rel, data in files.items()]
    for s in senders:
        s.start()
    # Long enough for several time-based syncs; checking the final paths all along.
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        for rel in files:
            assert not (vf / rel).exists(), "a partial upload became visible"
        time.sleep(0.1)
    d.kill()
    sent = [s.sent for s in senders]
    for s in senders:
        s.join(30)
    for rel in files:
        assert not (vf / rel).exists()
    d.start()
    for (rel, data), s, n in zip(files.items(), senders, sent):
        off = offset_of(d, tokens[rel])
        assert 0 < off <= n, (rel, off, n)
        assert off < len(data)
        assert staging(d, vfid, tokens[rel]).read_bytes()[:off] == data[:off]
        assert not (vf / rel).exists()
        r = patch(d, tokens[rel], off, data[off:])
        assert r.status_code == 204, r.text
        assert sha256_file(vf / rel) == hashlib.sha256(data).hexdigest()
        assert not staging(d, vfid, tokens[rel]).exists()


# --------------------------------------------------------------------------- tus-js-client


def tus_js(url, path, *args, timeout=300):
    node = shutil.which("node")
    assert node, "node is not installed (scripts/install-deps.sh)"
    assert (TUS_CLIENT / "node_modules" / "tus-js-client").is_dir(), (
        "tests/tus-client/node_modules is missing: run scripts/install-deps.sh"
    )
    p = subprocess.run(
        [node, str(TUS_CLIENT / "upload.js"), "--url", url, "--file", str(path), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = p.stdout.strip().splitlines()
    assert lines, f"tus-js-client printed nothing (rc {p.returncode}): {p.stderr[-2000:]}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("chunk_size", [None, 8 * MiB])
def test_tus_js_client_interrupted_and_resumed(daemon, vfid, tmp_path, chunk_size):
    src = tmp_path / "src.bin"
    size = 96 * MiB + 777
    with open(src, "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
        f.write(os.urandom(size % MiB))
    rel = f"tus/{chunk_size}/model.safetensors"
    token = new_session(daemon, vfid, rel, size)
    url = f"{upload_url(daemon)}?token={token}"
    extra = [] if chunk_size is None else ["--chunk-size", chunk_size]
    out = tus_js(url, src, "--stop-after", 40 * MiB, *extra)
    assert out["status"] == "stopped", out
    final = daemon.vfolder_path(vfid) / rel
    assert not final.exists()
    wait_for(lambda: offset_of(daemon, token) > 0, what="a durable offset after the abort")
    off = offset_of(daemon, token)
    assert 0 < off <= 40 * MiB  # never past what the client let go of
    out = tus_js(url, src, *extra)
    assert out["status"] == "complete", out
    # It resumed from the server's offset (which may still have grown while the aborted PATCH
    # settled), not from 0.
    assert off <= out["resumedFrom"] < size, (off, out)
    assert sha256_file(final) == sha256_file(src)
    assert not staging(daemon, vfid, token).exists()
    # Running it again finds the upload complete (HEAD says so) and sends nothing.
    out = tus_js(url, src, *extra)
    assert out["status"] == "complete", out


def test_tus_js_client_gets_409_from_a_busy_session(daemon, vfid, tmp_path):
    data = os.urandom(2 * MiB)
    src = tmp_path / "busy.bin"
    src.write_bytes(data)
    token = new_session(daemon, vfid, "busy.bin", len(data))
    held = HeldPatch(upload_url(daemon), token, 0, data[:MiB], data[MiB:])
    held.start()
    try:
        wait_size(staging(daemon, vfid, token), MiB)
        out = tus_js(f"{upload_url(daemon)}?token={token}", src)
        assert out["status"] == "error" and out["httpStatus"] == 409, out
    finally:
        held.release()
    assert held.resp.status_code == 204
    assert (daemon.vfolder_path(vfid) / "busy.bin").read_bytes() == data


# --------------------------------------------------------------------------- memory


def test_resident_size_does_not_grow_with_the_upload(daemon, vfid):
    size = 256 * MiB
    token = new_session(daemon, vfid, "rss.bin", size)
    piece = os.urandom(MiB)

    def body():
        for _ in range(size // MiB):
            yield piece

    base = rss_kib(daemon.proc.pid)
    peak = base
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_kib(daemon.proc.pid))
            time.sleep(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        r = patch(daemon, token, 0, body(), timeout=300)
    finally:
        done.set()
        t.join()
    assert r.status_code == 204, r.text
    assert (daemon.vfolder_path(vfid) / "rss.bin").stat().st_size == size
    # A few buffers per connection, not the file: far below the 256 MiB uploaded.
    assert peak - base < 32 * 1024, f"VmRSS grew by {(peak - base) / 1024:.1f} MiB"
