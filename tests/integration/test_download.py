"""Client-facing downloads: GET/HEAD /download and /download-archive against real clients.

curl for ranges, resumed downloads and HEAD; Python's zipfile and `unzip -t` for archives; raw
requests for hostile input (forged, expired and misused tokens, path tricks signed with the test
secret, malformed Range headers). Hostile requests must leave the disk as it was.
"""

import base64
import hashlib
import hmac
import io
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import zipfile
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest
import requests

from conftest import TOKEN_SECRET, problem, sha256_file, write_tree

CURL_TIMEOUT = 60


# --------------------------------------------------------------------------- helpers


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def sign(claims, secret=TOKEN_SECRET, header=None):
    """An HS256 JWT made here, as an attacker who knows (or guesses) the secret would."""
    h = b64url(json.dumps(header or {"alg": "HS256", "typ": "JWT"}).encode())
    p = b64url(json.dumps(claims).encode())
    mac = hmac.new(secret.encode(), f"{h}.{p}".encode(), hashlib.sha256).digest()
    return f"{h}.{p}.{b64url(mac)}"


def claims_of(token):
    p = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))


def download_token(d, vfid, relpath, archive=False, volume="local"):
    r = d.mgr(
        "POST",
        "/folder/file/download",
        json={"volume": volume, "vfid": vfid, "relpath": relpath, "archive": archive},
    )
    assert r.status_code == 200, r.text
    return r.json()["token"]


def archive_token(d, vfid, files, filename=None, volume="local"):
    body = {"volume": volume, "virtual_folder_id": vfid, "files": files}
    if filename is not None:
        body["filename"] = filename
    r = d.mgr("POST", "/folder/file/archive-download-token", json=body)
    assert r.status_code == 200, r.text
    return r.json()["token"]


def url(d, token, route="/download", **query):
    q = urllib.parse.urlencode({"token": token, **query})
    return f"http://127.0.0.1:{d.client_port}{route}?{q}"


def get(d, token, route="/download", headers=None, **query):
    return requests.get(url(d, token, route, **query), headers=headers or {}, timeout=60)


class Curl:
    """The result of one curl run: exit code, status line of the last response, headers, body."""

    def __init__(self, tmp, *args, out=None):
        tmp = Path(tmp)
        hdr = tmp / f"curl-headers-{time.monotonic_ns()}"
        self.out = Path(out) if out else tmp / f"curl-body-{time.monotonic_ns()}"
        p = subprocess.run(
            ["curl", "-sS", "-D", str(hdr), "-o", str(self.out), *map(str, args)],
            capture_output=True,
            timeout=CURL_TIMEOUT,
        )
        self.rc = p.returncode
        self.stderr = p.stderr.decode(errors="replace")
        blocks = hdr.read_bytes().decode(errors="replace").split("\r\n\r\n") if hdr.exists() else [""]
        blocks = [b for b in blocks if b.strip()]
        last = blocks[-1] if blocks else ""
        lines = last.split("\r\n")
        self.status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
        self.headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()
        self.body = self.out.read_bytes() if self.out.exists() else b""


def multipart_parts(content_type, body):
    """[(content-range, bytes)] of a multipart/byteranges body."""
    m = re.search(r"boundary=([^;\s]+)", content_type)
    assert m, content_type
    delim = b"--" + m.group(1).encode()
    assert body.startswith(delim), body[:100]
    parts = []
    for chunk in body.split(delim)[1:]:
        if chunk.startswith(b"--"):
            break
        head, _, data = chunk.partition(b"\r\n\r\n")
        assert data.endswith(b"\r\n"), data[-20:]
        data = data[:-2]
        cr = re.search(rb"Content-Range: bytes (\S+)", head).group(1).decode()
        parts.append((cr, data))
    return parts


@pytest.fixture
def files(daemon, vfid):
    """A vfolder with a 1 MiB random file, a small text file and a tree for archives."""
    root = daemon.vfolder_path(vfid)
    data = os.urandom(1 << 20)
    write_tree(
        root,
        {
            "big.bin": data,
            "small.txt": "hello, sluice\n",
            "empty.txt": b"",
            "tree/a.txt": "alpha\n" * 1000,
            "tree/sub/b.bin": os.urandom(200_000),
            "tree/sub/deeper/c.txt": "c",
            "tree/empty-dir": None,
            "tree/sub/empty-too": None,
            "tree/link-in": ("link", "a.txt"),
            "tree/link-out": ("link", "/etc/passwd"),
        },
    )
    os.mkfifo(root / "tree" / "fifo")
    os.mkfifo(root / "fifo")
    return vfid, root, data


# --------------------------------------------------------------------------- plain files


def test_full_download_headers_and_body(daemon, files, tmp_path):
    vfid, root, data = files
    c = Curl(tmp_path, url(daemon, download_token(daemon, vfid, "big.bin")))
    assert c.rc == 0, c.stderr
    assert c.status == 200
    assert c.body == data
    h = c.headers
    assert h["content-length"] == str(len(data))
    assert h["content-type"] == "application/octet-stream"
    assert h["accept-ranges"] == "bytes"
    assert h["etag"].startswith('"') and h["etag"].endswith('"')
    st = os.stat(root / "big.bin")
    assert parsedate_to_datetime(h["last-modified"]).timestamp() == int(st.st_mtime)
    assert h["content-disposition"] == (
        "attachment; filename=\"big.bin\"; filename*=UTF-8''big.bin"
    )
    assert "cache-control" not in h


def test_cors_headers_only_for_cross_origin_requests(daemon, files, tmp_path):
    vfid, _, _ = files
    token = download_token(daemon, vfid, "small.txt")
    plain = Curl(tmp_path, url(daemon, token))
    assert plain.status == 200
    assert not [k for k in plain.headers if k.startswith("access-control-")]
    assert plain.headers["vary"] == "Origin"  # caches keep the two answers apart
    # Every answer is dated (RFC 9110 §6.6.1).
    assert abs(parsedate_to_datetime(plain.headers["date"]).timestamp() - time.time()) < 60
    browser = Curl(tmp_path, "-H", "Origin: https://console.example", url(daemon, token))
    assert browser.status == 200
    assert browser.headers["access-control-allow-origin"] == "*"
    assert "Content-Disposition" in browser.headers["access-control-expose-headers"]
    # Errors too: a browser must be able to read why it was refused.
    refused = Curl(tmp_path, "-H", "Origin: https://console.example", url(daemon, "forged"))
    assert refused.status == 403
    assert refused.headers["access-control-allow-origin"] == "*"


def test_head_gives_headers_only(daemon, files, tmp_path):
    vfid, root, data = files
    token = download_token(daemon, vfid, "big.bin")
    c = Curl(tmp_path, "-I", url(daemon, token))
    assert c.rc == 0, c.stderr
    assert c.status == 200
    assert c.headers["content-length"] == str(len(data))
    assert c.headers["accept-ranges"] == "bytes"
    assert "etag" in c.headers and "last-modified" in c.headers
    # HEAD with a range describes the partial answer.
    c = Curl(tmp_path, "-I", "-r", "10-19", url(daemon, token))
    assert c.status == 206
    assert c.headers["content-length"] == "10"
    assert c.headers["content-range"] == f"bytes 10-19/{len(data)}"


def test_no_cache_sets_cache_control(daemon, files, tmp_path):
    vfid, _, _ = files
    token = download_token(daemon, vfid, "small.txt")
    c = Curl(tmp_path, url(daemon, token, no_cache="true"))
    assert c.status == 200
    assert c.headers.get("cache-control") == "no-store"
    c = Curl(tmp_path, url(daemon, token, no_cache="false"))
    assert "cache-control" not in c.headers
    r = get(daemon, token, no_cache="maybe")
    assert r.status_code == 400
    assert "no_cache" in problem(r)["msg"]


def test_utf8_name_in_content_disposition(daemon, vfid, tmp_path):
    name = "데이터 \"파일\" 100%.csv"
    (daemon.vfolder_path(vfid) / name).write_text("x,y\n")
    c = Curl(tmp_path, url(daemon, download_token(daemon, vfid, name)))
    assert c.status == 200 and c.body == b"x,y\n"
    cd = c.headers["content-disposition"]
    assert cd.startswith('attachment; filename=" \\"\\" 100%.csv"; '), cd
    ext = re.search(r"filename\*=UTF-8''(\S+)$", cd).group(1)
    assert urllib.parse.unquote(ext, encoding="utf-8") == name
    # The plain parameter is printable ASCII only.
    plain = re.search(r'filename="((?:[^"\\]|\\.)*)"', cd).group(1)
    assert all(0x20 <= ord(ch) < 0x7F for ch in plain)


def test_empty_file(daemon, files, tmp_path):
    vfid, _, _ = files
    token = download_token(daemon, vfid, "empty.txt")
    c = Curl(tmp_path, url(daemon, token))
    assert c.rc == 0 and c.status == 200 and c.body == b""
    assert c.headers["content-length"] == "0"
    # No byte range of an empty file exists: the Range header is ignored.
    c = Curl(tmp_path, "-r", "0-10", url(daemon, token))
    assert c.status == 200 and c.body == b""


# --------------------------------------------------------------------------- ranges


@pytest.mark.parametrize(
    "spec,first,last",
    [("0-99", 0, 99), ("1000-", 1000, None), ("-500", None, None), ("1048000-9999999", 1048000, None)],
)
def test_single_range(daemon, files, tmp_path, spec, first, last):
    vfid, _, data = files
    size = len(data)
    if first is None:
        first = size - 500
    if last is None:
        last = size - 1
    c = Curl(tmp_path, "-r", spec, url(daemon, download_token(daemon, vfid, "big.bin")))
    assert c.rc == 0, c.stderr
    assert c.status == 206
    assert c.headers["content-range"] == f"bytes {first}-{last}/{size}"
    assert c.headers["content-length"] == str(last - first + 1)
    assert c.body == data[first : last + 1]


def test_multiple_ranges_are_multipart(daemon, files, tmp_path):
    vfid, _, data = files
    size = len(data)
    c = Curl(tmp_path, "-r", "0-9,5000-5099,-7", url(daemon, download_token(daemon, vfid, "big.bin")))
    assert c.rc == 0, c.stderr
    assert c.status == 206
    assert c.headers["content-type"].startswith("multipart/byteranges; boundary=")
    parts = multipart_parts(c.headers["content-type"], c.body)
    assert parts == [
        ("0-9/%d" % size, data[0:10]),
        ("5000-5099/%d" % size, data[5000:5100]),
        (f"{size - 7}-{size - 1}/{size}", data[size - 7 :]),
    ]


def test_overlapping_ranges_coalesce(daemon, files, tmp_path):
    vfid, _, data = files
    c = Curl(tmp_path, "-r", "100-199,150-299,0-0", url(daemon, download_token(daemon, vfid, "big.bin")))
    assert c.status == 206
    parts = multipart_parts(c.headers["content-type"], c.body)
    assert [p[0] for p in parts] == [f"0-0/{len(data)}", f"100-299/{len(data)}"]
    assert parts[1][1] == data[100:300]
    # Ranges that merge into one give a plain 206.
    c = Curl(tmp_path, "-r", "0-9,10-19", url(daemon, download_token(daemon, vfid, "big.bin")))
    assert c.status == 206
    assert c.headers["content-range"] == f"bytes 0-19/{len(data)}"
    assert c.body == data[:20]


def test_unsatisfiable_range_is_416(daemon, files, tmp_path):
    vfid, _, data = files
    size = len(data)
    token = download_token(daemon, vfid, "big.bin")
    for spec in (f"{size}-", f"{size + 10}-{size + 20}", "-0"):
        r = get(daemon, token, headers={"Range": f"bytes={spec}"})
        assert r.status_code == 416, spec
        assert r.headers["Content-Range"] == f"bytes */{size}"
        assert "range" in problem(r)["msg"]


@pytest.mark.parametrize(
    "value",
    ["bytes=abc", "items=0-1", "bytes=5-1", "bytes=", "bytes=1-2-3", "bytes=0-1;2-3", "bytes",
     "bytes=" + ",".join(f"{i}-{i}" for i in range(100))],
)
def test_malformed_range_sends_whole_file(daemon, files, value):
    vfid, _, data = files
    before = daemon.snapshot()
    r = get(daemon, download_token(daemon, vfid, "big.bin"), headers={"Range": value})
    assert r.status_code == 200, value
    assert r.content == data
    assert "Content-Range" not in r.headers
    assert daemon.snapshot() == before


def test_if_range(daemon, files, tmp_path):
    vfid, root, data = files
    token = download_token(daemon, vfid, "big.bin")
    head = requests.head(url(daemon, token), timeout=30)
    etag, lm = head.headers["ETag"], head.headers["Last-Modified"]
    cases = [
        (etag, 206),
        ('"not-the-etag"', 200),
        ("W/" + etag, 200),  # weak validators never allow a range
        (lm, 206),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 200),
        ("garbage", 200),
    ]
    for value, status in cases:
        r = get(daemon, token, headers={"Range": "bytes=10-19", "If-Range": value})
        assert r.status_code == status, value
        assert r.content == (data[10:20] if status == 206 else data)
    # A file changed since the client's copy: the stale ETag makes the server send it whole.
    new = os.urandom(len(data))
    (root / "big.bin").write_bytes(new)
    os.utime(root / "big.bin", ns=(1, 1_000_000_000))
    r = get(daemon, token, headers={"Range": "bytes=10-19", "If-Range": etag})
    assert r.status_code == 200 and r.content == new


def test_if_none_match_and_if_modified_since(daemon, files):
    vfid, _, _ = files
    token = download_token(daemon, vfid, "small.txt")
    r = get(daemon, token)
    etag, lm = r.headers["ETag"], r.headers["Last-Modified"]
    r = get(daemon, token, headers={"If-None-Match": etag})
    assert r.status_code == 304 and r.content == b""
    assert r.headers["ETag"] == etag
    r = get(daemon, token, headers={"If-None-Match": '"other"'})
    assert r.status_code == 200 and r.content == b"hello, sluice\n"
    r = get(daemon, token, headers={"If-Modified-Since": lm})
    assert r.status_code == 304
    r = get(daemon, token, headers={"If-Modified-Since": "Thu, 01 Jan 1970 00:00:00 GMT"})
    assert r.status_code == 200


def test_curl_resumes_an_interrupted_download(daemon, vfid, tmp_path):
    src = daemon.vfolder_path(vfid) / "resume.bin"
    size = 32 << 20
    src.write_bytes(os.urandom(size))
    token = download_token(daemon, vfid, "resume.bin")
    out = tmp_path / "resume.bin"
    # A slow download cut off after a second (curl exit 28: timeout) leaves part of the file.
    p = subprocess.run(
        ["curl", "-sS", "--limit-rate", "100K", "--max-time", "1", "-o", str(out),
         url(daemon, token)],
        capture_output=True,
        timeout=CURL_TIMEOUT,
    )
    assert p.returncode == 28, p.stderr
    partial = out.stat().st_size
    assert 0 < partial < size, partial
    # curl -C - asks for the rest with a Range header and appends it.
    c = Curl(tmp_path, "-C", "-", url(daemon, token), out=out)
    assert c.rc == 0, c.stderr
    assert c.status == 206
    assert c.headers["content-range"] == f"bytes {partial}-{size - 1}/{size}"
    assert sha256_file(out) == sha256_file(src)
    # Resuming a complete file: the server answers 416 and curl accepts that as done.
    c = Curl(tmp_path, "-C", "-", url(daemon, token), out=out)
    assert c.rc == 0, c.stderr
    assert c.status == 416
    assert sha256_file(out) == sha256_file(src)


def test_keep_alive_serves_many_requests_on_one_connection(daemon, files, tmp_path):
    vfid, _, data = files
    t1 = download_token(daemon, vfid, "small.txt")
    t2 = download_token(daemon, vfid, "big.bin")
    outs = [tmp_path / f"k{i}" for i in range(3)]
    p = subprocess.run(
        ["curl", "-sS", "-v", url(daemon, t1), "-o", str(outs[0]), url(daemon, t2), "-o",
         str(outs[1]), "-r", "0-99", url(daemon, t2), "-o", str(outs[2])],
        capture_output=True,
        timeout=CURL_TIMEOUT,
    )
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode(errors="replace")
    assert err.count("Connected to") == 1, err
    assert "Re-using existing connection" in err
    assert outs[0].read_bytes() == b"hello, sluice\n"
    assert outs[1].read_bytes() == data[:100]
    assert outs[2].read_bytes() == data[:100]


def read_responses(s, n):
    """n HTTP responses with Content-Length bodies from socket s: [(status, body)]."""
    got, out = b"", []
    while len(out) < n:
        head, sep, rest = got.partition(b"\r\n\r\n")
        if sep:
            lines = head.decode("latin-1").split("\r\n")
            length = next(int(l.split(":", 1)[1]) for l in lines
                          if l.lower().startswith("content-length:"))
            if len(rest) >= length:
                out.append((int(lines[0].split()[1]), rest[:length]))
                got = rest[length:]
                continue
        piece = s.recv(1 << 20)
        assert piece, f"connection closed after {len(out)} of {n} responses"
        got += piece
    return out


def test_pipelined_and_split_requests(daemon, files):
    """Requests sent back to back in one segment are answered in order; a request whose header
    arrives in pieces is answered once it is whole; a malformed one after them gets a 400."""
    vfid, _, data = files
    small = urllib.parse.quote(download_token(daemon, vfid, "small.txt"))
    big = urllib.parse.quote(download_token(daemon, vfid, "big.bin"))
    req = "GET /download?token={} HTTP/1.1\r\nHost: x\r\n{}\r\n"
    with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=30) as s:
        s.sendall((req.format(small, "") + req.format(big, "Range: bytes=0-99\r\n") +
                   req.format(small, "")).encode())
        assert read_responses(s, 3) == [(200, b"hello, sluice\n"), (206, data[:100]),
                                        (200, b"hello, sluice\n")]
        whole = req.format(big, "Range: bytes=5-9\r\n").encode()
        for i in range(0, len(whole), 97):
            s.sendall(whole[i:i + 97])
            time.sleep(0.01)
        assert read_responses(s, 1) == [(206, data[5:10])]
        s.sendall(b"GET /download HTTP/1.1\r\nHost x\r\n\r\n")
        assert read_responses(s, 1)[0][0] == 400


def test_a_client_that_half_closes_after_its_request_is_let_go_at_once(daemon, files):
    """A client that sends its last request and its FIN together (`shutdown(SHUT_WR)` right
    after it, as `nc -N` and some HTTP/1.0 tools do) gets its answer and then the server's
    close at once, not at keepalive-timeout (75 s): the FIN may come within the readiness edge
    of the request, so the read after the answer must try the socket rather than wait for an
    edge (since 2026-12-07 Asio's receive tries a recv at once; before, the async_wait's
    epoll_ctl re-checked readiness). Passes on the builds before and after that change."""
    req = small_request(daemon, files)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=5) as s:
            s.sendall(req)
            s.shutdown(socket.SHUT_WR)
            assert_answer_then_close(s)


def small_request(daemon, files):
    """A raw GET of small.txt."""
    token = urllib.parse.quote(download_token(daemon, files[0], "small.txt"))
    return f"GET /download?token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def recv_to_end(s):
    """What `s` receives until its end (within the socket's timeout)."""
    got = b""
    while True:
        piece = s.recv(1 << 20)
        if not piece:
            return got
        got += piece


def assert_answer_then_close(s):
    """The answer to small.txt on `s`, then the end of the stream within its timeout."""
    got = recv_to_end(s)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"hello, sluice\n"), got


def test_a_keep_alive_client_that_half_closes_behind_its_next_request_is_let_go_at_once(
        daemon, files):
    """As above, on a kept-alive connection: the first request answered, the second sent with
    its FIN in the same segment (TCP_CORK, then shutdown), so that one readiness event reports
    both. The FIN must still be seen once the answer is out, with no event left to report it:
    Asio's receive (Boost 1.74) takes the socket for drained only after a receive of nothing,
    so the read after the answer tries a recv, which finds the FIN. (A reactor that took a
    short read for drained would wait for keepalive-timeout here.) Passes on the builds before
    and after 2026-12-07's header-read change."""
    req = small_request(daemon, files)
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=5) as s:
            s.sendall(req)
            assert read_responses(s, 1) == [(200, b"hello, sluice\n")]
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            s.sendall(req)
            s.shutdown(socket.SHUT_WR)  # sends what the cork held, with the FIN
            assert_answer_then_close(s)


def test_small_files_to_a_reader_that_lags(daemon, vfid):
    """Small files go out with their header in one send; when the socket takes only part (a
    client that reads slowly behind many pipelined requests), the rest follows intact."""
    root = daemon.vfolder_path(vfid)
    bodies = [os.urandom(n) for n in (1, 4096, 9000, 16 << 10)]  # all small: one send each
    for i, b in enumerate(bodies):
        (root / f"s{i}").write_bytes(b)
    reqs = []
    for i in range(len(bodies)):
        token = urllib.parse.quote(download_token(daemon, vfid, f"s{i}"))
        reqs.append(f"GET /download?token={token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    order = [i % len(bodies) for i in range(800)]  # 6 MB: more than the socket holds
    with socket.create_connection(("127.0.0.1", daemon.client_port), timeout=60) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # less than is sent
        sender = threading.Thread(target=lambda: s.sendall(b"".join(reqs[i] for i in order)))
        sender.start()
        time.sleep(0.5)  # the server fills the socket while nothing is read
        got = read_responses(s, len(order))
        sender.join()
    assert got == [(200, bodies[i]) for i in order]


def test_head_on_directory_and_special_files(daemon, files):
    vfid, _, _ = files
    # A directory without archive=true is not a file.
    r = get(daemon, download_token(daemon, vfid, "tree"))
    assert r.status_code == 400
    assert "archive=true" in problem(r)["msg"]
    # A FIFO is refused at once (opening it must not wait for a writer).
    t0 = time.monotonic()
    r = get(daemon, download_token(daemon, vfid, "fifo"))
    assert r.status_code == 400
    assert "not a regular file" in problem(r)["msg"]
    assert time.monotonic() - t0 < 5


def test_symlink_inside_the_vfolder_is_followed(daemon, files):
    vfid, _, _ = files
    r = get(daemon, download_token(daemon, vfid, "tree/link-in"))
    assert r.status_code == 200 and r.content == b"alpha\n" * 1000


# --------------------------------------------------------------------------- archives


def zip_of(content):
    z = zipfile.ZipFile(io.BytesIO(content))
    assert z.testzip() is None
    return z


def unzip_t(path):
    p = subprocess.run(["unzip", "-t", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_directory_as_zip(daemon, files, tmp_path):
    vfid, root, _ = files
    before = daemon.snapshot()
    for token, query in (
        (download_token(daemon, vfid, "tree"), {"archive": "true"}),  # query flag
        (download_token(daemon, vfid, "tree", archive=True), {}),  # token claim
    ):
        c = Curl(tmp_path, url(daemon, token, **query))
        assert c.rc == 0, c.stderr
        assert c.status == 200
        assert c.headers["content-type"] == "application/zip"
        assert c.headers["content-disposition"] == (
            "attachment; filename=\"tree.zip\"; filename*=UTF-8''tree.zip"
        )
        z = zip_of(c.body)
        names = set(z.namelist())
        assert names == {
            "a.txt", "sub/", "sub/b.bin", "sub/deeper/", "sub/deeper/c.txt", "empty-dir/",
            "sub/empty-too/",
        }, names
        for n in ("a.txt", "sub/b.bin", "sub/deeper/c.txt"):
            assert z.read(n) == (root / "tree" / n).read_bytes()
        assert z.getinfo("empty-dir/").is_dir()
        unzip_t(c.out)
    assert daemon.snapshot() == before


def test_vfolder_root_as_zip_skips_upload_staging(daemon, vfid, tmp_path):
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"x.txt": "x", "d/y.txt": "y", "데이터/값.txt": "v"})
    r = daemon.mgr("POST", "/folder/file/upload",
                   json={"volume": "local", "vfid": vfid, "relpath": "up.bin", "size": 10})
    assert r.status_code == 200, r.text
    assert any((root / ".upload").iterdir())
    r = get(daemon, download_token(daemon, vfid, ".", archive=True))
    assert r.status_code == 200
    z = zip_of(r.content)
    assert set(z.namelist()) == {"x.txt", "d/", "d/y.txt", "데이터/", "데이터/값.txt"}
    assert z.read("데이터/값.txt") == b"v"
    assert z.getinfo("데이터/값.txt").flag_bits & 0x800  # names are flagged UTF-8
    hex_id = vfid.rsplit("/", 1)[1]
    assert f'filename="{hex_id}.zip"' in r.headers["Content-Disposition"]


def test_uploads_in_progress_are_not_downloaded(daemon, vfid):
    """The vfolder root's .upload holds partial uploads and their records: neither /download
    (a file, or the directory as an archive) nor /download-archive serves them."""
    root = daemon.vfolder_path(vfid)
    write_tree(root, {"x.txt": "x"})
    r = daemon.mgr("POST", "/folder/file/upload",
                   json={"volume": "local", "vfid": vfid, "relpath": "up.bin", "size": 10})
    assert r.status_code == 200, r.text
    staged = sorted(p.name for p in (root / ".upload").iterdir())
    assert staged
    for rel, archive in [(".upload/" + staged[0], False), (".upload", True),
                         ("./.upload/" + staged[0], False)]:
        r = get(daemon, download_token(daemon, vfid, rel, archive=archive))
        assert r.status_code == 404, (rel, r.status_code, r.text)
        assert "uploads in progress" in problem(r)["msg"], r.text
    r = get(daemon, archive_token(daemon, vfid, [".upload"]), route="/download-archive")
    assert r.status_code == 404, r.text
    r = get(daemon, archive_token(daemon, vfid, ["x.txt"]), route="/download-archive")
    assert r.status_code == 200 and zip_of(r.content).read("x.txt") == b"x"


def test_an_entry_name_too_long_for_a_zip_is_skipped(daemon, vfid):
    """A ZIP entry's name holds 65,535 bytes at most, and libarchive corrupts its heap past 64
    KiB. A tree whose path grows past kMaxZipEntryName (32 KiB as written: an invalid byte
    becomes three) has the entries below that depth skipped; the archive is whole and the
    daemon lives. Before, the name went to libarchive and the daemon aborted."""
    root = daemon.vfolder_path(vfid)
    fd = os.open(root, os.O_RDONLY)
    os.mkdir(b"t", dir_fd=fd)
    fd2 = os.open(b"t", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = fd2
    name = b"\xff" * 255  # 765 bytes as written
    for _ in range(90):  # past 65,536 bytes as written by level 86
        os.mkdir(name, dir_fd=fd)
        nfd = os.open(name, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    f = os.open(b"deep.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
    os.write(f, b"deep")
    os.close(f)
    os.close(fd)
    try:
        r = get(daemon, download_token(daemon, vfid, "t", archive=True))
    finally:
        # Other tests walk this volume by path, which PATH_MAX stops at this depth; rmtree
        # walks by descriptor.
        shutil.rmtree(os.path.join(root, "t"))
    assert r.status_code == 200
    z = zip_of(r.content)
    assert z.testzip() is None
    names = z.namelist()
    assert names and max(len(n.encode()) for n in names) < 32768, max(map(len, names))
    assert not any(n.endswith("deep.txt") for n in names)
    assert len(names) == 42  # 32,767 bytes hold 42 levels of 765 bytes and their slashes
    assert daemon.mgr("GET", "/status").status_code == 200


def test_archive_head_sends_no_body(daemon, files):
    vfid, _, _ = files
    r = requests.head(url(daemon, download_token(daemon, vfid, "tree", archive=True)), timeout=30)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/zip"
    assert r.content == b""


def test_archive_file_token_sends_the_file(daemon, files):
    vfid, _, _ = files
    r = get(daemon, download_token(daemon, vfid, "small.txt", archive=True))
    assert r.status_code == 200 and r.content == b"hello, sluice\n"


def test_big_archive_streams_with_bounded_memory(daemon, vfid, tmp_path):
    root = daemon.vfolder_path(vfid)
    (root / "big").mkdir()
    chunk = os.urandom(1 << 20)
    with open(root / "big" / "random.bin", "wb") as f:
        for _ in range(96):
            f.write(chunk)
    (root / "big" / "zeros.bin").write_bytes(b"\0" * (64 << 20))

    def rss():
        for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    base = rss()
    peak = base
    out = tmp_path / "big.zip"
    with requests.get(url(daemon, download_token(daemon, vfid, "big", archive=True)),
                      stream=True, timeout=120) as r:
        assert r.status_code == 200
        with open(out, "wb") as f:
            for piece in r.iter_content(1 << 20):
                f.write(piece)
                peak = max(peak, rss())
    assert peak - base < 48 << 20, f"RSS grew by {(peak - base) >> 20} MiB"
    listing = unzip_t(out)
    assert "random.bin" in listing and "zeros.bin" in listing
    z = zipfile.ZipFile(out)
    h = hashlib.sha256()
    with z.open("random.bin") as f:
        for piece in iter(lambda: f.read(1 << 20), b""):
            h.update(piece)
    assert h.hexdigest() == sha256_file(root / "big" / "random.bin")
    assert z.getinfo("zeros.bin").file_size == 64 << 20


def test_a_deep_tree_held_by_a_slow_client_keeps_few_directories_open(daemon, vfid, tmp_path):
    """An archive of a tree 40 levels deep, its client reading nothing while the walk is at
    the bottom: the walk keeps at most 16 directories open (and one file), not one a level;
    the archive is whole once the client reads on."""
    root = daemon.vfolder_path(vfid)
    d = root / "deep"
    for level in range(40):
        (d / "m").mkdir(parents=True)
        (d / "a.txt").write_text(str(level))
        (d / "z.txt").write_text(str(level))
        d = d / "m"
    (d / "bottom.bin").write_bytes(os.urandom(64 << 20))  # more than the sockets buffer

    def fds():
        return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))

    base = fds()
    with requests.get(url(daemon, download_token(daemon, vfid, "deep", archive=True)),
                      stream=True, timeout=120) as r:
        assert r.status_code == 200
        body = r.raw.read(1 << 16)  # then nothing for a while: the server's send blocks
        time.sleep(1)
        held = fds() - base
        body += r.raw.read()
    # The connection and the file being sent, beside the directories.
    assert held <= 16 + 4, held
    z = zip_of(body)
    names = set(z.namelist())
    assert len([n for n in names if n.endswith(".txt")]) == 80, len(names)
    assert z.read("m/" * 39 + "z.txt") == b"39"
    assert z.read("m/" * 40 + "bottom.bin") == (d / "bottom.bin").read_bytes()


def test_download_archive_of_named_files(daemon, files, tmp_path):
    vfid, root, _ = files
    token = archive_token(daemon, vfid, ["small.txt", "tree/sub", "tree/sub/b.bin", "./small.txt"],
                          filename="mine 📦.zip")
    c = Curl(tmp_path, url(daemon, token, route="/download-archive"))
    assert c.rc == 0, c.stderr
    assert c.status == 200
    ext = re.search(r"filename\*=UTF-8''(\S+)$", c.headers["content-disposition"]).group(1)
    assert urllib.parse.unquote(ext) == "mine 📦.zip"
    z = zip_of(c.body)
    # Names are relative to the vfolder root; a path inside a listed directory and a repeated
    # path appear once.
    assert sorted(z.namelist()) == sorted([
        "small.txt", "tree/sub/", "tree/sub/b.bin", "tree/sub/deeper/", "tree/sub/deeper/c.txt",
        "tree/sub/empty-too/",
    ])
    assert z.read("tree/sub/b.bin") == (root / "tree/sub/b.bin").read_bytes()
    unzip_t(c.out)
    # Without a filename claim: one member gives <name>.zip.
    r = get(daemon, archive_token(daemon, vfid, ["tree"]), route="/download-archive")
    assert r.status_code == 200
    assert 'filename="tree.zip"' in r.headers["Content-Disposition"]
    # HEAD answers the headers only.
    r = requests.head(url(daemon, archive_token(daemon, vfid, ["tree"]), route="/download-archive"),
                      timeout=30)
    assert r.status_code == 200 and r.content == b""


@pytest.mark.parametrize(
    "member,status,words",
    [
        ("tree/link-in", 400, "symbolic link"),
        ("tree/link-out", 400, "symbolic link"),
        ("tree/fifo", 400, "FIFO"),
        ("fifo", 400, "FIFO"),
        ("nope.txt", 404, "not found"),
        ("tree/nope/x", 404, "not found"),
        ("small.txt/x", 404, "not found"),
    ],
)
def test_download_archive_refuses_before_sending(daemon, files, member, status, words):
    vfid, _, _ = files
    before = daemon.snapshot()
    # Good members first: the refusal still comes before any byte of the archive.
    token = sign({
        "operation": "download", "volume": "local", "virtual_folder_id": vfid,
        "files": ["small.txt", "tree/a.txt", member], "exp": int(time.time()) + 60,
    })
    r = get(daemon, token, route="/download-archive")
    assert r.status_code == status, r.text
    body = problem(r)
    assert words in body["msg"], body
    assert daemon.snapshot() == before


# --------------------------------------------------------------------------- tokens


def test_token_failures_are_refused_with_reasons(daemon, files):
    vfid, _, _ = files
    good = download_token(daemon, vfid, "small.txt")
    c = claims_of(good)
    h, p, s = good.split(".")
    tampered = f"{h}.{b64url(json.dumps({**c, 'relpath': 'big.bin'}).encode())}.{s}"
    cases = [
        (None, "missing 'token'"),
        ("", "missing 'token'"),
        ("not-a-jwt", "invalid token"),
        ("a.b.c", "invalid token"),
        (sign(c, secret="wrong-secret"), "invalid token"),
        (tampered, "invalid token"),
        (sign({**c, "exp": int(time.time()) - 5}), "expired"),
        (sign({**c, "nbf": int(time.time()) + 60}), "not yet valid"),
        (sign({**c, "nbf": "soon"}), "nbf is not a number"),
        (sign(c, header={"alg": "none", "typ": "JWT"}), "invalid token"),
        (sign(c, header={"alg": 5}), "HS256"),
        (sign(c, header={"alg": "HS512"}), "HS256"),
        (sign(c, header=["HS256"]), "HS256"),
        (sign(c, header={"typ": "JWT", "alg": "HS256"}), "not-an-error"),
        (sign({**c, "op": "upload"}), "not a 'download' token"),
        (sign({k: v for k, v in c.items() if k != "op"}), "not a 'download' token"),
    ]
    before = daemon.snapshot()
    for token, words in cases:
        u = f"http://127.0.0.1:{daemon.client_port}/download"
        if token is not None:
            u += "?token=" + urllib.parse.quote(token)
        if words == "not-an-error":  # another header spelling of HS256 is fine
            assert requests.get(u, timeout=30).content == b"hello, sluice\n"
            continue
        for method in ("GET", "HEAD"):
            r = requests.request(method, u, timeout=30)
            assert r.status_code == 403, (token, r.status_code, r.text)
        body = problem(requests.get(u, timeout=30))
        assert words in body["msg"], (token, body)
    assert daemon.snapshot() == before


def test_tokens_are_scoped_to_their_route(daemon, files):
    vfid, _, _ = files
    upload = daemon.mgr("POST", "/folder/file/upload",
                        json={"volume": "local", "vfid": vfid, "relpath": "u.bin", "size": 5})
    assert upload.status_code == 200, upload.text
    before = daemon.snapshot()
    r = get(daemon, upload.json()["token"])
    assert r.status_code == 403 and "not a 'download' token" in problem(r)["msg"]
    r = get(daemon, archive_token(daemon, vfid, ["small.txt"]))
    assert r.status_code == 403 and "not a 'download' token" in problem(r)["msg"]
    r = get(daemon, download_token(daemon, vfid, "small.txt"), route="/download-archive")
    assert r.status_code == 403 and "not a 'download' token" in problem(r)["msg"]
    assert daemon.snapshot() == before


def test_token_for_another_or_missing_vfolder(daemon, files):
    vfid, _, _ = files
    other = daemon.create_vfolder()
    (daemon.vfolder_path(other) / "small.txt").write_text("other vfolder\n")
    token = download_token(daemon, other, "small.txt")
    assert get(daemon, token).content == b"other vfolder\n"
    # The vfolder in a token cannot be changed without the secret...
    c = claims_of(token)
    h, _, s = token.split(".")
    swapped = f"{h}.{b64url(json.dumps({**c, 'vfid': vfid}).encode())}.{s}"
    r = get(daemon, swapped)
    assert r.status_code == 403 and "invalid token" in problem(r)["msg"]
    # ...and a token outlives neither its vfolder nor its volume.
    daemon.delete_vfolder(other)
    r = get(daemon, token)
    assert r.status_code == 404
    assert "does not exist" in problem(r)["msg"] or "not found" in problem(r)["msg"].lower()
    r = get(daemon, sign({**c, "volume": "no-such-volume"}))
    assert r.status_code == 400  # Backend.AI's InvalidVolumeError
    assert problem(r)["error_code"] == "storage_access_invalid-parameters"
    r = get(daemon, sign({**c, "vfid": "not-a-vfid"}))
    assert r.status_code == 400
    r = get(daemon, sign({k: v for k, v in c.items() if k != "relpath"}))
    assert r.status_code == 400 and "relpath" in problem(r)["msg"]


@pytest.mark.parametrize(
    "relpath",
    ["../x", "a/../../x", "/etc/passwd", "a\u0000b", "out/passwd", "out-file", "..",
     "../../../../../../etc/passwd"],
)
def test_signed_path_tricks_read_nothing_outside(daemon, vfid, relpath):
    root = daemon.vfolder_path(vfid)
    secret = os.urandom(16).hex()
    (daemon.root / "x").write_text(secret)
    (root / "a").mkdir()
    (root / "out").symlink_to("/etc")
    (root / "out-file").symlink_to(daemon.root / "x")
    # Another vfolder's file, reachable by '..' from this one.
    victim = daemon.create_vfolder()
    (daemon.vfolder_path(victim) / "x").write_text(secret)
    before = daemon.snapshot()
    claims = {"op": "download", "volume": "local", "vfid": vfid, "relpath": relpath,
              "exp": int(time.time()) + 60}
    for query in ({}, {"archive": "true"}):
        r = get(daemon, sign(claims), **query)
        assert r.status_code == 404, (relpath, r.status_code, r.text[:200])
        assert secret not in r.text and "root:" not in r.text
        problem(r)
    # The same tricks in an archive token's file list.
    r = get(daemon, sign({"operation": "download", "volume": "local", "virtual_folder_id": vfid,
                          "files": [relpath], "exp": int(time.time()) + 60}),
            route="/download-archive")
    assert r.status_code in (400, 404), (relpath, r.status_code, r.text[:200])
    assert secret not in r.text and "root:" not in r.text
    assert daemon.snapshot() == before


def test_dst_dir_and_unmanaged_path_are_refused(daemon, files):
    vfid, _, _ = files
    r = get(daemon, download_token(daemon, vfid, "small.txt"), dst_dir="tree")
    assert r.status_code == 400 and "dst_dir" in problem(r)["msg"]
    c = claims_of(download_token(daemon, vfid, "small.txt"))
    r = get(daemon, sign({**c, "unmanaged_path": "/etc"}))
    assert r.status_code == 400 and "unmanaged_path" in problem(r)["msg"]


def raw_request(daemon, raw):
    s = socket.create_connection(("127.0.0.1", daemon.client_port), timeout=30)
    s.sendall(raw.encode("latin-1"))
    got = recv_to_end(s)
    s.close()
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_raw_http_odd_requests(daemon, files):
    """Odd requests on a raw socket: each gets its answer and the daemon keeps serving."""
    vfid, _, data = files
    token = download_token(daemon, vfid, "big.bin")
    q = urllib.parse.quote(token)
    before = daemon.snapshot()
    # Control bytes in Range: refused as a malformed request, or ignored (whole file).
    status, _, body = raw_request(
        daemon, f"GET /download?token={q} HTTP/1.1\r\nHost: x\r\nRange: bytes=\x01\x02\r\n"
        "Connection: close\r\n\r\n")
    assert status in (200, 400)
    assert status == 400 or body == data
    # HTTP/1.0 has no chunked encoding: a multipart body ends with the connection.
    status, headers, body = raw_request(
        daemon, f"GET /download?token={q} HTTP/1.0\r\nRange: bytes=0-1,4-5\r\n\r\n")
    assert status == 206
    assert "transfer-encoding" not in headers
    assert multipart_parts(headers["content-type"], body) == [
        (f"0-1/{len(data)}", data[0:2]), (f"4-5/{len(data)}", data[4:6])]
    # Other methods are not downloads.
    status, headers, _ = raw_request(
        daemon, f"POST /download?token={q} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
        "Connection: close\r\n\r\n")
    assert status == 405
    assert daemon.snapshot() == before
    assert requests.get(url(daemon, token), timeout=30).content == data


# --------------------------------------------------------------------------- TLS


def test_download_over_tls(make_daemon, tmp_path):
    """With `[api.client] ssl-enabled` file bodies go through the pread path, not sendfile:
    whole files, single ranges and multipart ranges must still be exact."""
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost".split()
    subprocess.run([*cmd, "-keyout", key, "-out", cert], check=True, capture_output=True)
    d = make_daemon(client={"ssl-enabled": True, "ssl-cert": str(cert), "ssl-privkey": str(key)})
    vfid = d.create_vfolder()
    data = os.urandom(5 * (1 << 20) + 12345)  # several 256 KiB pread pieces, an odd tail
    (d.vfolder_path(vfid) / "big.bin").write_bytes(data)
    token = download_token(d, vfid, "big.bin")
    base = f"https://127.0.0.1:{d.client_port}/download"

    def fetch(headers=None):
        r = requests.get(
            base, params={"token": token}, headers=headers or {}, timeout=60, verify=False
        )
        assert r.url.startswith("https://")
        return r

    r = fetch()
    assert r.status_code == 200, r.text[:300]
    assert int(r.headers["Content-Length"]) == len(data)
    assert r.content == data

    first, last = 1_000_003, 4_500_001  # not aligned to any buffer size
    r = fetch({"Range": f"bytes={first}-{last}"})
    assert r.status_code == 206, r.text[:300]
    assert r.headers["Content-Range"] == f"bytes {first}-{last}/{len(data)}"
    assert r.content == data[first : last + 1]

    r = fetch({"Range": "bytes=-70000"})
    assert r.status_code == 206
    assert r.content == data[-70000:]

    r = fetch({"Range": "bytes=0-99,3000000-3300000"})
    assert r.status_code == 206
    parts = multipart_parts(r.headers["Content-Type"], r.content)
    assert parts == [
        (f"0-99/{len(data)}", data[:100]),
        (f"3000000-3300000/{len(data)}", data[3000000:3300001]),
    ]

    # curl over TLS, resuming a partial file (-C -), ends with the exact bytes too.
    out = tmp_path / "resumed.bin"
    out.write_bytes(data[:2_000_000])
    c = Curl(tmp_path, "-k", "-C", "-", f"{base}?token={token}", out=out)
    assert c.rc == 0, c.stderr
    assert c.status == 206
    assert out.read_bytes() == data

    # Plain HTTP on the TLS port gets no file.
    try:
        plain = requests.get(f"http://127.0.0.1:{d.client_port}/download",
                             params={"token": token}, timeout=5)
        assert plain.status_code != 200
    except requests.RequestException:
        pass
