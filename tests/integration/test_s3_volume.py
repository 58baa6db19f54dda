"""s3 volumes (`backend = "s3"`): a sluiced whose volume lives in an S3 origin. The origin here
is a second sluiced's S3 API (test_s3_differential.py runs the same suite on Ceph RGW): the
Volume interface conformance suite runs on it, then the manager and client APIs read, list,
archive and manage files put on the origin by another client, and the errors an operator meets
(an origin down, wrong credentials, uploads not taken yet) are checked."""

import concurrent.futures
import contextlib
import errno
import io
import json
import os
import pathlib
import signal
import subprocess
import threading
import time
import uuid
import zipfile

import botocore.exceptions
import pytest
import requests

from aws_rules import AwsRulesProxy
from conftest import (BIN_DIR, new_qsid, new_vfid, pause, problem, running_daemon, run_sluiced,
                      split_vfid, start_daemon, tail, toml_section)
from test_download import archive_token, download_token
from test_http_hardening import metric
from test_upload import HeldPatch, new_session, offset_of, patch, upload_url, wait_for

KiB, MiB = 1 << 10, 1 << 20
BUCKET = "origin"


def start_origin(root, s3=None, verify=None):
    d = running_daemon(root, s3=s3 or {})
    o = d.__enter__()
    o.user = o.s3_user()["id"]
    o.ak, o.sk = o.s3_key(o.user)
    o.boto = o.s3_client(o.ak, o.sk, verify=verify)
    o.boto.create_bucket(Bucket=BUCKET)
    return d, o


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    ctx, o = start_origin(tmp_path_factory.mktemp("origin"))
    yield o
    ctx.__exit__(None, None, None)


def s3_volume(o, prefix="ds", endpoint=None, name="remote", **options):
    return toml_section(f"volume.{name}", {
        "backend": "s3", "path": f"s3://{BUCKET}/{prefix}",
        "options": {"endpoint": endpoint or o.s3_url(), "bucket": BUCKET, "prefix": prefix,
                    "access-key": o.ak, "secret-key": o.sk, **options}})


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, origin):
    with running_daemon(tmp_path_factory.mktemp("proxy"), s3={},
                        extra_toml=s3_volume(origin, **{"part-size": "5m"})) as d:
        yield d


def sluice_admin(d, *args, rc=0):
    """`sluice ARGS` against daemon `d`'s manager API; its exit status must be `rc`."""
    from conftest import MANAGER_SECRET
    p = subprocess.run([str(BIN_DIR / "sluice"), "--endpoint", d.url(""), "--token",
                        MANAGER_SECRET, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == rc, f"sluice {args}: {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def clone_vfolder(d, src_volume, src_vfid, dst_volume):
    """Clones `src_vfid` into a new vfolder of `dst_volume` and waits for the task: its id."""
    dst = new_vfid()
    r = d.mgr("POST", "/folder/clone", json={"src_volume": src_volume, "src_vfid": src_vfid,
                                             "dst_volume": dst_volume, "dst_vfid": dst})
    assert r.status_code == 200, r.text
    assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"
    return dst


def vfolder_prefix(vfid, prefix="ds"):
    scope, vf = split_vfid(vfid)
    return f"{prefix}/{scope}/{vf[0:2]}/{vf[2:4]}/{vf[4:]}/"


def run_interface_suite(endpoint, bucket, ak, sk):
    env = dict(os.environ, SLUICE_TEST_S3=f"{endpoint} {bucket} {ak} {sk}")
    p = subprocess.run([str(BIN_DIR / "sluice_unit_tests"),
                        "--gtest_filter=Backends/VolumeInterface.*/s3"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    # Every case of the suite ran on the s3 instance (none filtered away by a typo).
    assert "[  PASSED  ] 13 tests." in p.stdout, p.stdout[-3000:]


def test_interface_suite_on_a_sluice_origin(origin):
    run_interface_suite(origin.s3_url(), BUCKET, origin.ak, origin.sk)


def test_files_on_the_origin_through_every_read_api(proxy, origin):
    d = proxy
    vfid = d.create_vfolder(volume="remote")
    base = vfolder_prefix(vfid)
    # The vfolder is a record on the origin; its files are keys below its prefix, put here by
    # another client.
    scope, vf = split_vfid(vfid)
    record = origin.boto.get_object(Bucket=BUCKET, Key=f"ds/.sluice/vfolders/{scope}/{vf}")
    assert "mode" in json.loads(record["Body"].read())
    big = os.urandom(3 * MiB + 5)  # past what a reader fetches at open: ranged reads follow
    files = {"a.txt": b"alpha", "data/big.bin": big, "data/deep/c.txt": b"gamma",
             "data/empty": b""}
    for rel, body in files.items():
        origin.boto.put_object(Bucket=BUCKET, Key=base + rel, Body=body)

    items = d.file_op("remote", "list", vfid=vfid, relpath="data").json()["items"]
    assert sorted((i["name"], i["type"]) for i in items) == [
        ("big.bin", "FILE"), ("deep", "DIRECTORY"), ("empty", "FILE")]
    assert next(i for i in items if i["name"] == "big.bin")["stat"]["size"] == len(big)

    url = d.client_url("/download")
    r = requests.get(url, params={"token": download_token(d, vfid, "data/big.bin",
                                                          volume="remote")}, timeout=60)
    assert r.status_code == 200 and r.content == big
    r = requests.get(url, params={"token": download_token(d, vfid, "data/big.bin",
                                                          volume="remote")},
                     headers={"Range": f"bytes={2 * MiB}-{2 * MiB + 99}"}, timeout=60)
    assert r.status_code == 206 and r.content == big[2 * MiB:2 * MiB + 100]
    r = requests.get(url, params={"token": download_token(d, vfid, "data/empty",
                                                          volume="remote")}, timeout=60)
    assert r.status_code == 200 and r.content == b""

    r = requests.get(d.client_url("/download-archive"),
                     params={"token": archive_token(d, vfid, ["data"], volume="remote")},
                     timeout=60)
    assert r.status_code == 200
    z = zipfile.ZipFile(io.BytesIO(r.content))
    assert z.read("data/big.bin") == big and z.read("data/deep/c.txt") == b"gamma"

    usage = d.mgr("GET", "/folder/usage", json={"volume": "remote", "vfid": vfid}).json()
    assert usage["used_bytes"] == sum(len(b) for b in files.values())

    # Managed through Sluice, seen on the origin.
    assert d.file_op("remote", "mkdir", vfid=vfid, relpath="made/here").status_code == 200
    assert d.file_op("remote", "rename", vfid=vfid, relpath="a.txt",
                     new_name="b.txt").status_code == 204
    r = d.file_op("remote", "delete", vfid=vfid, relpaths=["data/deep"], recursive=True)
    assert r.status_code in (200, 202, 204), r.text
    keys = {o["Key"][len(base):] for o in
            origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=base).get("Contents", [])}
    # (Directories with something below them are listed as markers or not, as the origin
    # keeps them: a Sluice origin lists only empty ones.)
    assert {k for k in keys if not k.endswith("/")} == {"b.txt", "data/big.bin", "data/empty"}
    assert "made/here/" in keys and not any("deep" in k for k in keys)
    assert origin.boto.get_object(Bucket=BUCKET, Key=base + "b.txt")["Body"].read() == b"alpha"

    # Hostile paths never reach the origin.
    r = d.file_op("remote", "list", vfid=vfid, relpath="../..")
    assert r.status_code == 400, r.text


def staging_left(origin):
    """What upload sessions hold on the origin besides their records."""
    page = origin.boto.list_objects_v2(Bucket=BUCKET, Prefix="ds/.sluice/staging/")
    return [o["Key"] for o in page.get("Contents", [])
            if ".tail" in o["Key"] or o["Key"].endswith(".data")]


def test_uploads_go_to_the_origin_and_resume_after_a_restart(proxy, origin):
    d = proxy
    vfid = d.create_vfolder(volume="remote")
    # 12 MiB in 5 MiB parts: two parts sent as the PATCHes make them durable, the rest the last.
    data = os.urandom(12 * MiB + 17)
    token = new_session(d, vfid, "up/blob.bin", len(data), volume="remote")
    assert patch(d, token, 0, data[:7 * MiB]).status_code == 204
    d.stop()
    # A session's record lists its parts and outgrows 64 KiB past about 745 of them (11.6 GiB
    # in 16 MiB parts): padded so here, it still resumes. Before, every HEAD and PATCH of such
    # a session answered 413 and the sweep never removed it.
    page = origin.boto.list_objects_v2(Bucket=BUCKET, Prefix="ds/.sluice/staging/")
    recs = [o["Key"] for o in page.get("Contents", [])
            if not any(t in o["Key"] for t in (".tail", ".data", ".lock"))]
    assert len(recs) == 1, page.get("Contents")
    rec = json.loads(origin.boto.get_object(Bucket=BUCKET, Key=recs[0])["Body"].read())
    assert rec["durable"] == 7 * MiB and len(rec["parts"]) == 1, rec
    rec["padding"] = "p" * (200 << 10)
    origin.boto.put_object(Bucket=BUCKET, Key=recs[0], Body=json.dumps(rec).encode())
    d.start()  # what was acknowledged is on the origin: the session resumes there
    assert offset_of(d, token) == 7 * MiB
    assert patch(d, token, 7 * MiB, data[7 * MiB:]).status_code == 204
    key = vfolder_prefix(vfid) + "up/blob.bin"
    assert origin.boto.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data
    r = requests.get(d.client_url("/download"),
                     params={"token": download_token(d, vfid, "up/blob.bin", volume="remote")},
                     timeout=60)
    assert r.status_code == 200 and r.content == data
    # A small file is one PUT; nothing of either session stays on the origin but its record.
    token = new_session(d, vfid, "small.txt", 5, volume="remote")
    assert patch(d, token, 0, b"hello").status_code == 204
    assert origin.boto.get_object(Bucket=BUCKET,
                                  Key=vfolder_prefix(vfid) + "small.txt")["Body"].read() == b"hello"
    assert staging_left(origin) == []


@contextlib.contextmanager
def faulty_origin(root, rules):
    """An origin sluiced whose bucket BUCKET lies on a volume under fault `rules`."""
    from test_faults import faulty_daemon

    o = faulty_daemon(root, rules, s3={})
    o.start()
    try:
        o.user = o.s3_user(volume="faulty")["id"]
        o.ak, o.sk = o.s3_key(o.user)
        o.boto = o.s3_client(o.ak, o.sk)
        o.boto.create_bucket(Bucket=BUCKET)
        yield o
        o.stop()
    finally:
        o.kill()


@contextlib.contextmanager
def proxy_on_faulty_origin(tmp_path, rules, part_size="5m"):
    """(origin, proxy, vfid): a proxy whose volume "remote" (one attempt per request, parts of
    `part_size`) is on a faulty origin under `rules`, and a vfolder made there."""
    options = {"max-attempts": 1, **({"part-size": part_size} if part_size else {})}
    with faulty_origin(tmp_path / "origin", rules) as o, running_daemon(
            tmp_path / "proxy", extra_toml=s3_volume(o, **options)) as d:
        yield o, d, d.create_vfolder(volume="remote")


def test_a_resume_after_a_record_that_did_not_land_reads_the_recorded_tail(tmp_path):
    """A PATCH that sends parts writes its tail (the bytes past them) under a new key before it
    records them: when that record fails (here the origin refuses it once), the tail the
    record names is still the one it was, so the session resumes from the recorded offset with
    the right bytes. (Before, the PATCH overwrote the one tail object, and the resumed upload
    took the later tail's bytes for its first MiB.)"""
    # The session's record is the key whose last component is the 32-digit session id (its
    # tails and leases have suffixes); its fourth write is the PATCH's record: after the
    # session's creation, the first PATCH's record and the one naming the multipart upload.
    record = "*/staging/*/*/" + "[0-9a-f]" * 32
    rules = [{"op": "commit", "path": record, "error": "EIO", "skip": 3, "times": 1}]
    with proxy_on_faulty_origin(tmp_path, rules) as (o, d, vfid):
        data = os.urandom(12 * MiB)
        token = new_session(d, vfid, "blob.bin", len(data), volume="remote")
        assert patch(d, token, 0, data[:MiB]).status_code == 204
        r = patch(d, token, MiB, data[MiB:])
        assert r.status_code >= 500, (r.status_code, r.text)  # its record did not land
        assert offset_of(d, token) == MiB
        assert patch(d, token, MiB, data[MiB:]).status_code == 204
        got = o.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "blob.bin")
        assert got["Body"].read() == data
        assert staging_left(o) == []


def test_a_commit_whose_last_record_fails_still_stands(tmp_path):
    """The file of an upload is in place when its session's last record (the one saying it is
    complete) fails: the PATCH is answered 204 and the session goes, instead of an error for a
    file that was written and a session no resume could finish (its tail gone)."""
    record = "*/staging/*/*/" + "[0-9a-f]" * 32
    # The session's third record write: after its creation and the PATCH's sync.
    rules = [{"op": "commit", "path": record, "error": "EIO", "skip": 2, "times": 1}]
    with proxy_on_faulty_origin(tmp_path, rules, part_size=None) as (o, d, vfid):
        token = new_session(d, vfid, "small.txt", 5, volume="remote")
        r = patch(d, token, 0, b"hello")
        assert r.status_code == 204, (r.status_code, r.text)
        got = o.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "small.txt")
        assert got["Body"].read() == b"hello"
        assert "its record was not updated" in d.log_path.read_text()
        assert staging_left(o) == []


def staging_uploads(origin, prefix="ds"):
    """The origin's multipart uploads under the staging prefix of volume `prefix`."""
    page = origin.boto.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{prefix}/.sluice/staging/")
    return [u["Key"] for u in page.get("Uploads", [])]


def test_an_origin_upload_its_record_could_not_name_is_aborted(tmp_path):
    """A PATCH that sends a part first creates the session's multipart upload on the origin,
    then records its id: when that record fails (the origin refuses it once), the upload is
    aborted at once. Before, nothing named it and it stayed on the origin for good, its parts
    billed; a retried PATCH made another."""
    record = "*/staging/*/*/" + "[0-9a-f]" * 32
    # The session's second record write: after its creation, the one naming the upload.
    rules = [{"op": "commit", "path": record, "error": "EIO", "skip": 1, "times": 1}]
    with proxy_on_faulty_origin(tmp_path, rules) as (o, d, vfid):
        data = os.urandom(12 * MiB)
        token = new_session(d, vfid, "blob.bin", len(data), volume="remote")
        r = patch(d, token, 0, data)
        assert r.status_code >= 500, (r.status_code, r.text)
        assert staging_uploads(o) == []
        assert offset_of(d, token) == 0
        assert patch(d, token, 0, data).status_code == 204
        got = o.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "blob.bin")
        assert got["Body"].read() == data
        assert staging_uploads(o) == [] and staging_left(o) == []


def test_the_sweep_removes_unreadable_records_and_uploads_no_record_names(tmp_path, origin):
    """What no writer could ever resume goes with the upload sweep once it is older than the
    abandon age: a session record that is not one (cut short, here not JSON) with its tail, and
    an origin multipart upload under staging that no record names (a node that crashed between
    creating it and recording it). Before, both stayed on the origin for good."""
    pre = f"sweep{uuid.uuid4().hex[:8]}"
    staging = f"{pre}/.sluice/staging/legacy/{uuid.uuid4().hex}/"
    bad, lost = uuid.uuid4().hex, uuid.uuid4().hex
    origin.boto.put_object(Bucket=BUCKET, Key=staging + bad, Body=b'{"parts": [')
    origin.boto.put_object(Bucket=BUCKET, Key=f"{staging}{bad}.tail.0", Body=b"tail")
    origin.boto.create_multipart_upload(Bucket=BUCKET, Key=f"{staging}{bad}.data")
    origin.boto.create_multipart_upload(Bucket=BUCKET, Key=f"{staging}{lost}.data")
    assert len(staging_uploads(origin, pre)) == 2
    # session-expire 2 s: abandoned past 2 s and the grace; a sweep every second.
    with running_daemon(tmp_path / "proxy", storage_proxy={"session-expire": "2s"},
                        extra_toml=s3_volume(origin, prefix=pre)) as d:
        def gone():
            page = origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=staging)
            return not page.get("Contents") and staging_uploads(origin, pre) == []
        wait_for(gone, timeout=30, what="the sweep")
        assert "removing unreadable session record" in d.log()


def test_a_commit_whose_copy_failed_completes_when_retried(tmp_path):
    """A tus upload of several parts whose copy onto its target fails once (the origin refuses
    it) is completed by the client's next HEAD. Before, the retry sent the last part again to
    the multipart upload the failed commit had completed, was answered NoSuchUpload every time,
    and the session's bytes went with the sweep."""
    rules = [{"op": "commit", "path": "*/retried.bin", "error": "EIO", "times": 1}]
    with proxy_on_faulty_origin(tmp_path, rules) as (o, d, vfid):
        data = os.urandom(12 * MiB)  # two parts and a tail
        token = new_session(d, vfid, "retried.bin", len(data), volume="remote")
        r = patch(d, token, 0, data)
        assert r.status_code >= 500, (r.status_code, r.text)
        assert offset_of(d, token) == len(data)
        got = o.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "retried.bin")
        assert got["Body"].read() == data
        assert staging_left(o) == []


def test_a_write_whose_copy_onto_its_target_fails_leaves_nothing_staged(tmp_path):
    """An S3 PUT of several parts through the proxy completes them into the session's `.data`
    on the origin, then copies that onto the target: when the copy fails (the origin refuses
    the target), the PUT fails and the session goes whole, `.data` too (before, `.data` stayed
    on the origin for good, counted nowhere)."""
    rules = [{"op": "commit", "path": "*/big.bin", "error": "EIO"}]
    with faulty_origin(tmp_path / "origin", rules) as o, running_daemon(
            tmp_path / "proxy", s3={}, extra_toml=s3_volume(o, **{"part-size": "5m"})) as d:
        ak, sk = d.s3_key(d.s3_user(volume="remote")["id"])
        s3 = d.s3_client(ak, sk)
        s3.create_bucket(Bucket="bkt")
        with pytest.raises(Exception):
            s3.put_object(Bucket="bkt", Key="big.bin", Body=os.urandom(12 * MiB))
        assert staging_left(o) == []
        s3.put_object(Bucket="bkt", Key="small.bin", Body=b"fine")  # the proxy still writes
        assert s3.get_object(Bucket="bkt", Key="small.bin")["Body"].read() == b"fine"


def test_an_upload_past_the_origins_part_limit_is_refused_at_once(proxy, origin):
    """A session the origin could never take (more than 10,000 parts of part-size) is refused
    when it is made, saying what to change, not after its bytes were sent."""
    d = proxy
    vfid = d.create_vfolder(volume="remote")
    def staged():
        page = origin.boto.list_objects_v2(Bucket=BUCKET, Prefix="ds/.sluice/staging/")
        return {o["Key"] for o in page.get("Contents", [])}
    before = staged()
    r = d.mgr("POST", "/folder/file/upload",
              json={"volume": "remote", "vfid": vfid, "relpath": "huge.bin",
                    "size": 10000 * 5 * MiB + 1})
    assert r.status_code == 413, (r.status_code, r.text)
    assert "10000 origin parts of part-size 5242880" in r.text, r.text
    assert "[volume.remote] part-size" in r.text, r.text
    assert not staged() - before
    assert new_session(d, vfid, "fits.bin", 10000 * 5 * MiB, volume="remote")  # at the limit
    assert staged() - before
    d.delete_vfolder(vfid, volume="remote")


def test_a_slow_upload_is_synced_at_part_boundaries(proxy, origin):
    """A PATCH that trickles in over seconds is synced where a part ends, so the origin gets
    each byte once: whole parts and empty tails. (Before, its syncs came every second and sent
    the bytes past the last part again each time: here 11 MiB cost 15 MiB of writes.)"""
    d = proxy
    vfid = d.create_vfolder(volume="remote")
    data = os.urandom(12 * MiB)
    token = new_session(d, vfid, "slow.bin", len(data), volume="remote")
    sent, released = threading.Event(), threading.Event()

    def body():
        for at in range(0, 11 * MiB, 256 * 1024):
            yield data[at:at + 256 * 1024]
            time.sleep(0.08)  # 44 pieces: about 3.5 s
        sent.set()
        released.wait(60)
        yield data[11 * MiB:]

    def written():
        return metric(origin, "sluice_volume_written_bytes_total", volume="local")

    before = written()
    done = {}
    t = threading.Thread(target=lambda: done.update(r=requests.patch(
        upload_url(d), params={"token": token},
        headers={"Tus-Resumable": "1.0.0", "Content-Type": "application/offset+octet-stream",
                 "Upload-Offset": "0"}, data=body(), timeout=90)), daemon=True)
    t.start()
    try:
        assert sent.wait(30)
        wait_for(lambda: offset_of(d, token) == 10 * MiB, timeout=5, what="two parts synced")
        time.sleep(0.5)
        during = written() - before
    finally:
        released.set()
        t.join(60)
    assert done["r"].status_code == 204, done["r"].text
    assert 10 * MiB <= during <= 10 * MiB + 64 * 1024, during  # two parts, records, no tails
    got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "slow.bin")
    assert got["Body"].read() == data


def test_scope_limits_hold_on_writes(proxy, origin):
    d = proxy
    qsid = new_qsid()
    r = d.mgr("POST", "/quota-scope",
              json={"volume": "remote", "qsid": qsid, "options": {"limit_bytes": MiB}})
    assert r.status_code == 204, r.text
    got = d.mgr("GET", "/quota-scope", json={"volume": "remote", "qsid": qsid}).json()
    assert got["limit_bytes"] == MiB
    vfid = d.create_vfolder(vfid=new_vfid(qsid), volume="remote")
    token = new_session(d, vfid, "fits.bin", 600 * KiB, volume="remote")
    assert patch(d, token, 0, b"a" * (600 * KiB)).status_code == 204
    r = d.mgr("POST", "/folder/file/upload",
              json={"volume": "remote", "vfid": vfid, "relpath": "over.bin", "size": 600 * KiB})
    if r.status_code == 200:  # refused when the bytes come, if not when the session is made
        r = patch(d, r.json()["token"], 0, b"b" * (600 * KiB))
    assert r.status_code in (413, 507), (r.status_code, r.text)
    keys = [o["Key"] for o in origin.boto.list_objects_v2(
        Bucket=BUCKET, Prefix=vfolder_prefix(vfid)).get("Contents", [])]
    assert [k[len(vfolder_prefix(vfid)):] for k in keys] == ["fits.bin"]
    # A session's bytes are staged outside the vfolder's keys until its commit, so its
    # reservation keeps them (before, it shrank as they came, as on vfs where they count in
    # the usage: a second session fitted in the room the first one's bytes had left).
    qsid = new_qsid()
    r = d.mgr("POST", "/quota-scope",
              json={"volume": "remote", "qsid": qsid, "options": {"limit_bytes": MiB}})
    assert r.status_code == 204, r.text
    vfid = d.create_vfolder(vfid=new_vfid(qsid), volume="remote")
    first = new_session(d, vfid, "first.bin", 800 * KiB, volume="remote")
    assert patch(d, first, 0, b"f" * (400 * KiB)).status_code == 204
    r = d.mgr("POST", "/folder/file/upload",
              json={"volume": "remote", "vfid": vfid, "relpath": "second.bin", "size": 400 * KiB})
    if r.status_code == 200:
        r = patch(d, r.json()["token"], 0, b"s" * (400 * KiB))
    assert r.status_code in (413, 507), (r.status_code, r.text)
    assert patch(d, first, 400 * KiB, b"f" * (400 * KiB)).status_code == 204
    used = d.mgr("GET", "/quota-scope", json={"volume": "remote", "qsid": qsid}).json()
    assert used["used_bytes"] == 800 * KiB, used


def leases(origin):
    """The upload sessions' lease generations on the origin: {key: its JSON}."""
    page = origin.boto.list_objects_v2(Bucket=BUCKET, Prefix="ds/.sluice/staging/")
    out = {}
    for o in page.get("Contents", []):
        if ".lock." in o["Key"]:
            try:
                out[o["Key"]] = json.loads(
                    origin.boto.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read())
            except origin.boto.exceptions.NoSuchKey:
                pass  # an older generation, removed by the writer that made a newer one
    return out


def test_two_nodes_share_an_upload_sessions_lease(tmp_path, origin):
    """Two nodes on one s3 volume: while one writes to an upload session, the other's PATCH
    of it is 409 (the session's lease on the origin, made with If-None-Match: *); once it is
    released the other continues; a node killed while writing holds the session for at most
    upload-lock-ttl."""
    options = {"part-size": "5m", "upload-lock-ttl": "4s"}
    a = start_daemon(tmp_path / "a", extra_toml=s3_volume(origin, **options))
    try:
        with running_daemon(tmp_path / "b", extra_toml=s3_volume(origin, **options)) as b:
            vfid = a.create_vfolder(volume="remote")
            data = os.urandom(3 * MiB)
            token = new_session(a, vfid, "shared.bin", len(data), volume="remote")
            held = HeldPatch(upload_url(a), token, 0, data[:MiB], data[MiB:2 * MiB])
            held.start()
            try:
                wait_for(lambda: any(not l["released"] for l in leases(origin).values()),
                         what="a's lease")
                r = patch(b, token, 0, data)
                assert r.status_code == 409 and "one writer" in problem(r)["msg"], r.text
            finally:
                held.release()
            assert held.exc is None and held.resp.status_code == 204, held.resp.text
            assert all(l["released"] for l in leases(origin).values())
            assert offset_of(b, token) == 2 * MiB
            # b writes the next part; a dies in the middle of the rest.
            held = HeldPatch(upload_url(b), token, 2 * MiB, data[2 * MiB:2 * MiB + 1])
            held.start()
            wait_for(lambda: any(not l["released"] for l in leases(origin).values()),
                     what="b's lease")
            assert patch(a, token, 2 * MiB, data[2 * MiB:]).status_code == 409
            held.release()
            assert held.resp.status_code == 204, held.resp.text
            left = 2 * MiB + 1
            cut = HeldPatch(upload_url(a), token, left, data[left:left + 1])
            cut.start()
            wait_for(lambda: any(not l["released"] for l in leases(origin).values()),
                     what="a's second lease")
            a.kill()
            cut.release()
            r = patch(b, token, offset_of(b, token), b"")
            assert r.status_code == 409, r.text  # a's lease has not expired yet
            deadline = time.monotonic() + 30
            while True:
                at = offset_of(b, token)
                r = patch(b, token, at, data[at:])
                if r.status_code == 204 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert r.status_code == 204, r.text
            got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "shared.bin")
            assert got["Body"].read() == data
    finally:
        a.kill()


def test_a_stalled_writer_keeps_its_lease_and_a_paused_node_loses_it(tmp_path, origin):
    """A writer waiting for bytes keeps its session past upload-lock-ttl (its node renews the
    lease); a node paused whole (SIGSTOP) loses it once it expires: another node takes the
    session over and completes it, and the paused writer, resumed, stops with 409 before
    writing anything. The file is the other node's."""
    options = {"part-size": "5m", "upload-lock-ttl": "2s"}
    with running_daemon(tmp_path / "a", extra_toml=s3_volume(origin, **options)) as a, \
            running_daemon(tmp_path / "b", extra_toml=s3_volume(origin, **options)) as b:
        vfid = a.create_vfolder(volume="remote")
        data = os.urandom(MiB)
        token = new_session(a, vfid, "taken.bin", len(data), volume="remote")
        stalled = HeldPatch(upload_url(a), token, 0, b"s", os.urandom(len(data) - 1))
        stalled.start()
        try:
            wait_for(lambda: any(not l["released"] for l in leases(origin).values()),
                     what="a's lease")
            time.sleep(3)  # past the ttl: a's heartbeat renews it
            r = patch(b, token, 0, data)
            assert r.status_code == 409 and "one writer" in problem(r)["msg"], r.text
            pause(a.proc.pid)
            try:
                time.sleep(3)  # a's lease expires
                r = patch(b, token, 0, data)
                assert r.status_code == 204, r.text
            finally:
                os.kill(a.proc.pid, signal.SIGCONT)
        finally:
            stalled.release()
        assert stalled.exc is None and stalled.resp.status_code == 409, stalled.resp.text
        assert "took it over" in problem(stalled.resp)["msg"]
        got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "taken.bin")
        assert got["Body"].read() == data


def test_scope_usage_is_maintained(tmp_path, origin):
    """A quota scope's usage on an s3 volume is a maintained figure: this node's writes and
    deletes change it at once, its quota checks list nothing, and what others wrote on the
    origin shows once the figure is measured again (usage-reconcile-interval)."""
    options = {"part-size": "5m", "usage-walk-budget": "0s", "usage-reconcile-interval": "10s"}
    with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(origin, **options)) as d:
        qsid = new_qsid()
        r = d.mgr("POST", "/quota-scope",
                  json={"volume": "remote", "qsid": qsid, "options": {"limit_bytes": MiB}})
        assert r.status_code == 204, r.text
        vfid = d.create_vfolder(vfid=new_vfid(qsid), volume="remote")

        def used():
            return d.mgr("GET", "/quota-scope", json={"volume": "remote", "qsid": qsid}
                         ).json()["used_bytes"]

        assert used() == 0
        token = new_session(d, vfid, "a.bin", 400 * KiB, volume="remote")
        assert patch(d, token, 0, b"a" * (400 * KiB)).status_code == 204
        assert used() == 400 * KiB  # counted by the write, not measured
        token = new_session(d, vfid, "b.bin", 300 * KiB, volume="remote")
        assert patch(d, token, 0, b"b" * (300 * KiB)).status_code == 204
        assert used() == 700 * KiB
        r = d.mgr("POST", "/folder/file/upload", json={
            "volume": "remote", "vfid": vfid, "relpath": "over.bin", "size": 400 * KiB})
        if r.status_code == 200:  # refused when the bytes come, if not when the session is made
            r = patch(d, r.json()["token"], 0, b"c" * (400 * KiB))
        assert r.status_code in (413, 507), (r.status_code, r.text)
        assert d.file_op("remote", "delete", vfid=vfid, relpaths=["b.bin"]).status_code == 200
        assert used() == 400 * KiB
        # Another client of the origin writes below the vfolder: measured again, it counts.
        origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "other.bin",
                               Body=b"o" * (200 * KiB))
        assert used() == 400 * KiB  # the figure, not a listing
        deadline = time.monotonic() + 30
        while used() != 600 * KiB and time.monotonic() < deadline:
            time.sleep(0.2)
        assert used() == 600 * KiB

        def vfolder_usage():
            return d.mgr("GET", "/folder/usage", json={"volume": "remote", "vfid": vfid}).json()

        while vfolder_usage()["used_bytes"] != 600 * KiB and time.monotonic() < deadline:
            time.sleep(0.2)
        usage = vfolder_usage()
        assert usage["used_bytes"] == 600 * KiB and usage["file_count"] == 2, usage


def multipart_put(s3, bucket, key, body, part, **create):
    """`body` put as a multipart upload of `part`-byte parts (`create`: CreateMultipartUpload's
    arguments)."""
    up = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    parts = []
    for i, at in enumerate(range(0, len(body), part)):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=i + 1,
                           Body=body[at:at + part])
        parts.append({"PartNumber": i + 1, "ETag": r["ETag"]})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                 MultipartUpload={"Parts": parts})


def test_the_aws_rules_proxy_forwards_chunked_bodies(origin):
    """The tooling's AwsRulesProxy takes a body sent in chunks (as SDKs send a stream of
    unknown length) and forwards it whole: before, it read only by Content-Length, and such a
    request reached the origin without its body."""
    import http.client
    port = int(origin.s3_url().rsplit(":", 1)[1])
    with AwsRulesProxy("127.0.0.1", port) as rules:
        url = origin.boto.generate_presigned_url(
            "put_object", Params={"Bucket": BUCKET, "Key": "chunked/o.bin"}, ExpiresIn=300)
        target = urlsplit_path(url)
        host, rport = rules.url.split("//", 1)[1].split(":")
        conn = http.client.HTTPConnection(host, int(rport), timeout=30)
        parts = [os.urandom(70 * KiB), b"", os.urandom(3)]
        conn.request("PUT", target, body=iter(p for p in parts if p),
                     headers={"Host": url.split("//", 1)[1].split("/", 1)[0]},
                     encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 200, (r.status, r.read())
        conn.close()
    got = origin.boto.get_object(Bucket=BUCKET, Key="chunked/o.bin")["Body"].read()
    assert got == b"".join(parts)


def urlsplit_path(url):
    """`url`'s path and query, as a request line names them."""
    from urllib.parse import urlsplit
    u = urlsplit(url)
    return u.path + ("?" + u.query if u.query else "")


def test_objects_past_max_copy_size_copy_in_parts(tmp_path, origin):
    """Server-side copies of objects larger than max-copy-size (AWS's CopyObject stops at
    5 GiB) are multipart uploads of UploadPartCopy parts: a rename, a clone, an upload's
    commit. Content and metadata arrive whole; the ETags show the parts.

    Through AwsRulesProxy: every multipart upload the volume makes (parts copied, parts sent
    from memory, a file's parts sent from its descriptor) names each part's CRC32C in its
    Complete, as AWS requires of an upload created with a checksum algorithm."""
    options = {"part-size": "6m", "max-copy-size": "5m"}
    port = int(origin.s3_url().rsplit(":", 1)[1])
    with AwsRulesProxy("127.0.0.1", port) as rules, running_daemon(
            tmp_path / "proxy", s3={},
            extra_toml=s3_volume(origin, endpoint=rules.url, **options)) as d:
        user = d.s3_user(volume="remote")["id"]
        s3 = d.s3_client(*d.s3_key(user))
        s3.create_bucket(Bucket="parts")
        body = os.urandom(11 * MiB)
        multipart_put(s3, "parts", "m.bin", body, 6 * MiB, ContentType="x-model/w",
                      Metadata={"epoch": "7"})
        b = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"]
                 if b["name"] == "parts")
        vfid = b["vfid"]
        base = vfolder_prefix(vfid)

        def on_origin(key):
            got = origin.boto.get_object(Bucket=BUCKET, Key=base + key)
            return got["Body"].read(), got["ETag"].strip('"')

        assert on_origin("m.bin")[0] == body  # one PUT: it never filled a part in memory
        # The rename's Complete is done and its answer lost: the retry finds the upload gone,
        # and the object there, of the parts' size and the ETag they make, is the copy.
        rules.lose_completes = 1
        r = d.file_op("remote", "rename", vfid=vfid, relpath="m.bin", new_name="n.bin")
        assert r.status_code in (200, 204), r.text
        assert rules.lost == 1
        data, etag = on_origin("n.bin")
        assert data == body and etag.endswith("-3"), etag
        got = s3.get_object(Bucket="parts", Key="n.bin")
        assert got["Body"].read() == body
        assert got["ContentType"] == "x-model/w" and got["Metadata"] == {"epoch": "7"}, got
        dst = clone_vfolder(d, "remote", vfid, "remote")
        got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(dst) + "n.bin")
        assert got["Body"].read() == body and got["ETag"].strip('"').endswith("-3")
        # A tus upload of 17 MiB in three PATCHes: its data goes to the origin in 6 MiB
        # parts (an upload of three), then onto the file in four parts of 5 MiB.
        big = os.urandom(17 * MiB)
        token = new_session(d, vfid, "t.bin", len(big), volume="remote")
        for at in range(0, len(big), 6 * MiB):
            assert patch(d, token, at, big[at:at + 6 * MiB]).status_code == 204
        data, etag = on_origin("t.bin")
        assert data == big and etag.endswith("-4"), etag
        # A local file past part-size cloned in: parts sent from its descriptor.
        src = d.create_vfolder(volume="local")
        with open(os.path.join(d.vfolder_path(src), "local.bin"), "wb") as f:
            f.write(big)
        into = clone_vfolder(d, "local", src, "remote")
        got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(into) + "local.bin")
        assert got["Body"].read() == big and got["ETag"].strip('"').endswith("-3")
        assert rules.refused == [] and len(rules.algorithms) >= 5, rules.algorithms
        # Nothing left in progress on the origin: every copy completed its upload.
        assert not origin.boto.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_completes_and_copies_are_assembled_on_the_origin(tmp_path, origin):
    """A multipart Complete and a CopyObject on an s3 volume (also onto another s3 volume of the
    same origin and key) have the origin copy the bytes (UploadPartCopy, pinned to the ETag of
    what was opened): no part comes back through the proxy, and only a last part shorter than
    S3's smallest (5 MiB) is read and sent again.
    Before, every byte of a Complete was read back from the origin and uploaded once more."""
    port = int(origin.s3_url().rsplit(":", 1)[1])
    # A second volume on the same origin, read with the same key (another prefix).
    with AwsRulesProxy("127.0.0.1", port) as rules, running_daemon(
            tmp_path / "proxy", s3={},
            extra_toml=s3_volume(origin, endpoint=rules.url, **{"part-size": "5m"}) +
            s3_volume(origin, prefix="other", endpoint=rules.url, name="remote2")) as d:
        user = d.s3_user(volume="remote")["id"]
        s3 = d.s3_client(*d.s3_key(user))
        s3.create_bucket(Bucket="asm")
        # Ten parts copied (eight at once, then two), and a short last one.
        sizes = [6 * MiB, 7 * MiB] + [5 * MiB] * 8 + [3 * MiB + 3]
        body = os.urandom(sum(sizes))
        up = s3.create_multipart_upload(Bucket="asm", Key="big.bin",
                                        ChecksumAlgorithm="CRC32C")["UploadId"]
        parts, at = [], 0
        for i, n in enumerate(sizes):
            r = s3.upload_part(Bucket="asm", Key="big.bin", UploadId=up, PartNumber=i + 1,
                               Body=body[at:at + n], ChecksumAlgorithm="CRC32C")
            parts.append({"PartNumber": i + 1, "ETag": r["ETag"],
                          "ChecksumCRC32C": r["ChecksumCRC32C"]})
            at += n
        sent, received, copies = rules.traffic()
        done = s3.complete_multipart_upload(Bucket="asm", Key="big.bin", UploadId=up,
                                            MultipartUpload={"Parts": parts})
        sent, received, copies = [b - a for a, b in zip((sent, received, copies),
                                                        rules.traffic())]
        # The last part (3 MiB) is read and sent; of the others only the first bytes that
        # opening a part reads (256 KiB each), and records.
        tail, n = sizes[-1], len(sizes)
        assert tail <= received < tail + n * 256 * 1024 + 64 * 1024, received
        assert tail <= sent < tail + 64 * 1024, sent
        assert copies >= n, copies  # ten parts, then the assembled upload onto its key
        assert done["ETag"].strip('"').endswith(f"-{n}"), done
        got = s3.get_object(Bucket="asm", Key="big.bin")
        assert got["Body"].read() == body and got["ETag"] == done["ETag"]

        def copied_on_the_origin(bucket):
            before = rules.traffic()
            s3.copy_object(Bucket=bucket, Key="copy.bin",
                           CopySource={"Bucket": "asm", "Key": "big.bin"})
            sent, received, copies = [b - a for a, b in zip(before, rules.traffic())]
            # The source's first bytes and the copy's, read as each is opened.
            assert sent < 64 * 1024 and received < 2 * 256 * 1024 + 64 * 1024, (sent, received)
            assert copies >= 2, copies
            got = s3.get_object(Bucket=bucket, Key="copy.bin")
            assert got["Body"].read() == body and got["ETag"] == done["ETag"]

        copied_on_the_origin("asm")
        # Onto a bucket of the other volume: the origin copies across them too.
        r = d.mgr("POST", "/s3/buckets", json={"name": "elsewhere", "volume": "remote2",
                                               "vfid": d.create_vfolder(volume="remote2"),
                                               "owner": user})
        assert r.status_code == 201, r.text
        copied_on_the_origin("elsewhere")
        # Every copy made its part numbers as AWS takes them: each Complete named the parts'
        # checksums, and none is left in progress on the origin.
        assert rules.refused == []
        assert not origin.boto.list_multipart_uploads(Bucket=BUCKET).get("Uploads")


def test_an_origin_without_delete_objects_or_upload_part_copy(tmp_path, origin):
    """An origin that answers NotImplemented to DeleteObjects and UploadPartCopy (GCS's XML API
    has no DeleteObjects; some gateways no UploadPartCopy; staged by AwsRulesProxy): the volume
    learns each from its first refusal, says so once in the log, and does the work another way.
    A Complete, a CopyObject and a rename past max-copy-size read the bytes and write them
    again; a vfolder's keys are deleted one DELETE each. So does `sluice s3 rm -r`. Every
    answer and every byte is as on an origin that has both."""
    port = int(origin.s3_url().rsplit(":", 1)[1])
    with AwsRulesProxy("127.0.0.1", port, lacks={"DeleteObjects", "UploadPartCopy"}) as rules, \
            running_daemon(tmp_path / "proxy", s3={}, extra_toml=s3_volume(
                origin, endpoint=rules.url, **{"part-size": "5m", "max-copy-size": "5m"})) as d:
        user = d.s3_user(volume="remote")["id"]
        s3 = d.s3_client(*d.s3_key(user))
        s3.create_bucket(Bucket="plain")
        vfid = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"]
                    if b["name"] == "plain")["vfid"]
        body = os.urandom(13 * MiB)
        multipart_put(s3, "plain", "m.bin", body, 6 * MiB, ContentType="x-model/w",
                      Metadata={"epoch": "7"})
        # The Complete's first part asked the origin to copy it once; every byte then went
        # through the node (and the assembled upload onto its key, past max-copy-size, too).
        assert rules.not_implemented == {"UploadPartCopy": 1}, rules.not_implemented
        got = s3.get_object(Bucket="plain", Key="m.bin")
        assert got["Body"].read() == body and got["ETag"].strip('"').endswith("-3"), got

        def not_copied_on_the_origin(fn):
            copies = rules.traffic()[2]
            fn()
            assert rules.traffic()[2] == copies  # nothing more was asked of the origin's copy

        not_copied_on_the_origin(lambda: s3.copy_object(
            Bucket="plain", Key="copy.bin", CopySource={"Bucket": "plain", "Key": "m.bin"}))
        assert s3.get_object(Bucket="plain", Key="copy.bin")["Body"].read() == body

        def rename():
            r = d.file_op("remote", "rename", vfid=vfid, relpath="m.bin", new_name="n.bin")
            assert r.status_code in (200, 204), r.text

        not_copied_on_the_origin(rename)
        got = s3.get_object(Bucket="plain", Key="n.bin")
        assert got["Body"].read() == body
        assert got["ContentType"] == "x-model/w" and got["Metadata"] == {"epoch": "7"}, got
        # The rename's delete of its source was a first DeleteObjects, refused.
        assert rules.not_implemented == {"UploadPartCopy": 1, "DeleteObjects": 1}
        with pytest.raises(botocore.exceptions.ClientError):
            s3.head_object(Bucket="plain", Key="m.bin")
        # A vfolder's deletion: a DELETE per key.
        gone = d.create_vfolder(volume="remote")
        for i in range(40):
            origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(gone) + f"d/{i}", Body=b"x")
        d.delete_vfolder(gone, volume="remote")
        assert "Contents" not in origin.boto.list_objects_v2(Bucket=BUCKET,
                                                             Prefix=vfolder_prefix(gone))
        assert rules.not_implemented == {"UploadPartCopy": 1, "DeleteObjects": 1}
        log = d.log_path.read_text(errors="replace")
        for op in ("DeleteObjects", "UploadPartCopy"):
            assert log.count(f"the origin has no {op}") == 1, log[-3000:]
        # Every upload the node made named its parts' checksums; none is left in progress.
        assert rules.refused == []
        assert not origin.boto.list_multipart_uploads(Bucket=BUCKET).get("Uploads")

        # The CLI against such a server.
        def rm(*args, sk=origin.sk):
            return subprocess.run(
                [str(BIN_DIR / "sluice"), "s3", "rm", *args, "--s3-endpoint", rules.url],
                env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                     "AWS_ACCESS_KEY_ID": origin.ak, "AWS_SECRET_ACCESS_KEY": sk},
                capture_output=True, text=True, timeout=120)

        for i in range(30):
            origin.boto.put_object(Bucket=BUCKET, Key=f"cli/{i}", Body=b"y")
        p = rm("-r", "-j", "2", f"s3://{BUCKET}/cli/")
        assert p.returncode == 0, p.stdout + p.stderr
        assert "has no DeleteObjects" in p.stdout + p.stderr, p.stdout + p.stderr
        assert "Contents" not in origin.boto.list_objects_v2(Bucket=BUCKET, Prefix="cli/")
        assert rules.not_implemented["DeleteObjects"] == 2, rules.not_implemented
        # Credentials refused on the DELETEs: the whole delete failed, by that cause (exit 5,
        # as with DeleteObjects), not one key's failure (exit 1).
        origin.boto.put_object(Bucket=BUCKET, Key="cli/kept", Body=b"y")
        p = rm(f"s3://{BUCKET}/cli/kept", sk="wrong")
        assert p.returncode == 5 and "failed: delete of 1 key" in p.stderr, (p.returncode,
                                                                             p.stderr)
        origin.boto.head_object(Bucket=BUCKET, Key="cli/kept")


def test_a_complete_whose_part_changed_on_the_origin_leaves_nothing(proxy, origin):
    """A staged part replaced on the origin behind the proxy (after parts before it were
    queued for copying): the Complete is refused, nothing appears at the key, the upload is
    given back (its parts listed as before), and no multipart upload of the failed assembly is
    left in progress on the origin; the Abort then removes the rest."""
    d = proxy
    s3 = d.s3_client(*d.s3_key(d.s3_user(volume="remote")["id"]))
    s3.create_bucket(Bucket="changed")
    vfid = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"]
                if b["name"] == "changed")["vfid"]
    body = os.urandom(16 * MiB)
    up = s3.create_multipart_upload(Bucket="changed", Key="m.bin")["UploadId"]
    parts = []
    for i, at in enumerate(range(0, len(body), 8 * MiB)):
        r = s3.upload_part(Bucket="changed", Key="m.bin", UploadId=up, PartNumber=i + 1,
                           Body=body[at:at + 8 * MiB])
        parts.append({"PartNumber": i + 1, "ETag": r["ETag"]})
    staged = vfolder_prefix(vfid) + f".upload/mp-{up}/p00002"
    origin.boto.head_object(Bucket=BUCKET, Key=staged)  # where the proxy staged part 2
    origin.boto.put_object(Bucket=BUCKET, Key=staged, Body=os.urandom(8 * MiB))
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket="changed", Key="m.bin", UploadId=up,
                                     MultipartUpload={"Parts": parts})
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] in (400, 409), e.value.response
    with pytest.raises(botocore.exceptions.ClientError):
        s3.head_object(Bucket="changed", Key="m.bin")
    listed = s3.list_parts(Bucket="changed", Key="m.bin", UploadId=up)["Parts"]
    assert [p["PartNumber"] for p in listed] == [1], listed  # part 2 is no longer Sluice's
    assert not origin.boto.list_multipart_uploads(Bucket=BUCKET).get("Uploads")
    s3.abort_multipart_upload(Bucket="changed", Key="m.bin", UploadId=up)
    left = origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=vfolder_prefix(vfid) + ".upload/")
    assert not left.get("Contents"), left


def test_s3_api_over_an_s3_volume(proxy, origin):
    d = proxy
    user = d.s3_user(volume="remote")["id"]
    s3 = d.s3_client(*d.s3_key(user))
    s3.create_bucket(Bucket="on-remote")
    s3.put_object(Bucket="on-remote", Key="k/one.txt", Body=b"one")
    assert s3.get_object(Bucket="on-remote", Key="k/one.txt")["Body"].read() == b"one"
    big = os.urandom(11 * MiB)
    multipart_put(s3, "on-remote", "k/big.bin", big, 5 * MiB)
    got = s3.get_object(Bucket="on-remote", Key="k/big.bin", Range="bytes=6291456-6291555")
    assert got["Body"].read() == big[6291456:6291556]
    listed = s3.list_objects_v2(Bucket="on-remote", Prefix="k/")
    assert [o["Key"] for o in listed["Contents"]] == ["k/big.bin", "k/one.txt"]
    assert listed["Contents"][0]["Size"] == len(big)
    s3.delete_object(Bucket="on-remote", Key="k/one.txt")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="on-remote")["Contents"]] == ["k/big.bin"]


def test_names_with_control_bytes_on_an_s3_volume(proxy, origin):
    """Names holding CR and other control bytes (a POSIX name may hold any byte but NUL and
    '/'): listed as they are (the origin asked with encoding-type=url: a raw CR in XML reads
    back as LF), read by the name listed, and deleted with the directory, leaving nothing on
    the origin (a control byte other than tab, LF and CR is no XML 1.0: such keys are deleted
    one by one). Before, "a\rb" listed as "a\nb", whose open was a 404, and the recursive
    delete reported success and left the key."""
    d = proxy
    user = d.s3_user(volume="remote")["id"]
    s3 = d.s3_client(*d.s3_key(user))
    s3.create_bucket(Bucket="ctl-names")
    names = ["d/a\rb", "d/x\x01y", "d/t\tab", "d/plus+ sp%ce"]
    for n in names:
        s3.put_object(Bucket="ctl-names", Key=n, Body=n.encode())
    b = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"] if b["name"] == "ctl-names")
    vfid = b["vfid"]
    r = d.file_op("remote", "list", vfid=vfid, relpath="d")
    assert r.status_code == 200, r.text
    listed = sorted(i["name"] for i in r.json()["items"])
    assert listed == sorted(n[2:] for n in names), listed
    for n in names:
        assert s3.get_object(Bucket="ctl-names", Key=n)["Body"].read() == n.encode()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="ctl-names", Prefix="d/")["Contents"]]
    assert sorted(keys) == sorted(names)
    r = d.file_op("remote", "delete", vfid=vfid, relpaths=["d"], recursive=True)
    assert r.status_code in (200, 202, 204), r.text
    if r.status_code == 202:
        assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"
    base = vfolder_prefix(vfid)
    left = [o["Key"] for o in origin.boto.list_objects_v2(
        Bucket=BUCKET, Prefix=base + "d").get("Contents", [])]
    assert left == [], left


def origin_listings(origin):
    """ListObjects requests the origin has answered so far."""
    text = requests.get(origin.internal_url("/metrics"), timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith('sluice_http_requests_total{listener="s3",method="GET",'
                                  'route="/{bucket}"'))


def list_a_large_flat_directory(d, origin):
    """Lists a flat directory of 3,004 keys written on the origin through `d`'s volume
    "remote", a page of 100 keys at a time, and checks what comes back: the origin listings
    asked for all of it, the pages, and those asked for the first page."""
    vfid = d.create_vfolder(volume="remote")
    # Written straight into the origin's bucket (its objects are files): fast to make.
    b = next(b for b in origin.mgr("GET", "/s3/buckets").json()["buckets"]
             if b["name"] == BUCKET)
    root = pathlib.Path(origin.mgr("GET", "/folder/mount", json={
        "volume": b["volume"], "vfid": b["vfid"]}).json()["path"]) / vfolder_prefix(vfid)
    names = [f"n{i:04d}" for i in range(3000)] + ["n-a", "n.b", "n0/x", "n/y"]
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_bytes(b"k")
    user = d.s3_user()["id"]
    s3 = d.s3_client(*d.s3_key(user))
    bucket = f"flat-{uuid.uuid4().hex[:8]}"
    sluice_admin(d, "s3", "bucket", "bind", bucket, "remote", vfid, "--owner", user)
    before = origin_listings(origin)
    keys, pages, first = [], 0, None
    for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, PaginationConfig={"PageSize": 100}):
        keys += [o["Key"] for o in page.get("Contents", [])]
        pages += 1
        if first is None:
            first = origin_listings(origin) - before
    asked = origin_listings(origin) - before
    assert keys == sorted(names)  # "n-a", "n.b", "n/y", "n0/x", "n0000", ...
    assert pages == 31
    top = s3.list_objects_v2(Bucket=bucket, Delimiter="/", MaxKeys=3)
    assert [o["Key"] for o in top["Contents"]] == ["n-a", "n.b"]
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["n/"]
    # After a directory's key: what it holds comes next.
    after = s3.list_objects_v2(Bucket=bucket, StartAfter="n/", MaxKeys=2)
    assert [o["Key"] for o in after["Contents"]] == ["n/y", "n0/x"]
    top = s3.list_objects_v2(Bucket=bucket, Delimiter="/", StartAfter="n/", MaxKeys=2)
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["n0/"]
    assert [o["Key"] for o in top["Contents"]] == ["n0000"]
    # Its files are read as usual.
    assert s3.get_object(Bucket=bucket, Key="n0/x")["Body"].read() == b"k"
    sluice_admin(d, "s3", "bucket", "unbind", bucket)
    return asked, pages, first


def test_a_large_flat_directory_lists_page_by_page(proxy, origin):
    """S3 listings through an s3 volume resume on the origin where their page starts (a
    delimiter listing is in key order there too): each page of a flat directory of thousands
    of keys costs an origin page, not a listing of the whole directory."""
    asked, pages, _ = list_a_large_flat_directory(proxy, origin)
    # One origin page per page (a thousand keys from where it resumes), and the lookup of
    # the directory; the whole directory each time would be four listings a page.
    assert asked <= 2 * pages, (asked, pages)


def test_a_directory_too_large_for_the_cache_lists_page_by_page(tmp_path, origin):
    """Behind the SSD cache, a directory of more than `max-listing` entries is not kept as
    one listing (held in memory for the TTL, fetched whole before the first page): it is
    listed from the origin a page at a time, as without the cache."""
    cache = toml_section("volume.remote.cache", {
        "path": str(tmp_path / "cache"), "block-size": "1m", "ttl": "10m", "max-size": "64m",
        "max-listing": 500})
    with running_daemon(tmp_path / "proxy", s3={},
                        extra_toml=s3_volume(origin) + cache) as d:
        asked, pages, first = list_a_large_flat_directory(d, origin)
        # The first page: the origin's first page of the directory (enough to find it too
        # large), the page itself, and the lookups; the whole level would be four pages more.
        assert first <= 4, (first, asked)
        assert asked <= 2 * pages + 2, (asked, pages)
        stats = d.mgr("GET", "/volume/cache", json={"volume": "remote"}).json()
        assert stats["max_listing"] == 500
        assert stats["listings_passed"] >= pages, stats
        assert stats["listing_entries"] < 500, stats


def test_a_virtual_hosted_origin(tmp_path):
    """addressing = "virtual": the volume names its bucket in the host (origin.localhost:port,
    which libcurl resolves to the loopback address), as AWS and GCS prefer; the origin, a Sluice
    with [api.s3] domain, checks each signature over that host."""
    with running_daemon(tmp_path / "origin", s3={"domain": "localhost"}) as o:
        o.ak, o.sk = o.s3_key(o.s3_user()["id"])
        o.boto = o.s3_client(o.ak, o.sk)
        o.boto.create_bucket(Bucket=BUCKET)
        volume = s3_volume(o, addressing="virtual",
                           endpoint=f"http://localhost:{o.s3_port}")
        with running_daemon(tmp_path / "proxy", s3={}, extra_toml=volume) as d:
            s3 = d.s3_client(*d.s3_key(d.s3_user(volume="remote")["id"]))
            s3.create_bucket(Bucket="vh-remote")
            body = os.urandom(300 * KiB)
            s3.put_object(Bucket="vh-remote", Key="a/b.bin", Body=body)
            assert s3.get_object(Bucket="vh-remote", Key="a/b.bin")["Body"].read() == body
            assert [o["Key"] for o in s3.list_objects_v2(Bucket="vh-remote")["Contents"]] == [
                "a/b.bin"]
            b = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"]
                     if b["name"] == "vh-remote")
            key = vfolder_prefix(b["vfid"]) + "a/b.bin"
            assert o.boto.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body


def test_clones_are_server_side_copies(proxy, origin):
    d = proxy
    src = d.create_vfolder(volume="remote")
    files = {f"d{i % 4}/f{i:03}.bin": os.urandom(1000 + i) for i in range(60)}
    for rel, body in files.items():
        origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(src) + rel, Body=body)
    # An S3 API multipart upload in progress stays behind, as on a posix volume (before, the
    # copy listed and counted the source's parts under .upload/).
    origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(src) + ".upload/mp-x/p00001",
                           Body=b"part")
    dst = clone_vfolder(d, "remote", src, "remote")
    keys = {}
    token = None
    while True:
        kw = {"Bucket": BUCKET, "Prefix": vfolder_prefix(dst)}
        if token:
            kw["ContinuationToken"] = token
        page = origin.boto.list_objects_v2(**kw)
        keys.update({o["Key"][len(vfolder_prefix(dst)):]: o["Size"]
                     for o in page.get("Contents", [])})
        if not page.get("IsTruncated"):
            break
        token = page["NextContinuationToken"]
    assert keys == {rel: len(body) for rel, body in files.items()}
    some = "d3/f059.bin"
    got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(dst) + some)["Body"].read()
    assert got == files[some]


def test_a_detached_vfolder_is_gone_and_deleted(proxy, origin):
    d = proxy
    vfid = d.create_vfolder(volume="remote")
    base = vfolder_prefix(vfid)
    origin.boto.put_object(Bucket=BUCKET, Key=base + "f", Body=b"x")
    d.delete_vfolder(vfid, volume="remote")
    assert "Contents" not in origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=base)
    r = d.file_op("remote", "list", vfid=vfid, relpath="")
    assert r.status_code == 404, r.text


def test_a_write_landing_after_a_vfolder_delete_goes_with_the_second_pass(tmp_path, origin):
    """A write that passed its vfolder check before the delete may land after the delete
    listed the vfolder's keys (here put on the origin once the delete is done, as a write in
    flight would land): its key goes with the second pass, `trash-grace` after the first, with
    the trash record. Before, the record went with the first pass and the key stayed on the
    origin, counted in the scope, for good. The same id created again meanwhile starts empty."""
    pre = f"grace{uuid.uuid4().hex[:8]}"
    trash = f"{pre}/.sluice/trash/"
    # session-expire 4 s: a janitor round every second.
    with running_daemon(tmp_path / "proxy", storage_proxy={"session-expire": "4s"},
                        extra_toml=s3_volume(origin, prefix=pre, **{"trash-grace": "5s"})) as d:
        def trash_records():
            return origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=trash).get("KeyCount", 0)

        def keys(base):
            page = origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=base)
            return [o["Key"] for o in page.get("Contents", [])]

        vfid = d.create_vfolder(volume="remote")
        base = vfolder_prefix(vfid, pre)
        origin.boto.put_object(Bucket=BUCKET, Key=base + "f", Body=b"x")
        d.delete_vfolder(vfid, volume="remote")
        assert keys(base) == [] and trash_records() == 1  # kept for the second pass
        origin.boto.put_object(Bucket=BUCKET, Key=base + "late", Body=b"landed late")
        time.sleep(1.5)
        assert keys(base) == [base + "late"]  # within the grace
        wait_for(lambda: keys(base) == [] and trash_records() == 0, timeout=20,
                 what="the second pass")

        # Created again within the grace: the second pass is done first.
        again = d.create_vfolder(volume="remote")
        base = vfolder_prefix(again, pre)
        d.delete_vfolder(again, volume="remote")
        [record] = keys(trash)
        swept = origin.boto.get_object(Bucket=BUCKET, Key=record)["Body"].read()
        origin.boto.put_object(Bucket=BUCKET, Key=base + "late", Body=b"landed late")
        d.create_vfolder(again, volume="remote")
        assert keys(base) == [] and trash_records() == 0
        listed = d.file_op("remote", "list", vfid=again, relpath="")
        assert listed.status_code == 200 and "late" not in listed.text, listed.text

        # A first pass that marks the record after that creation removed it (it read the
        # record before): the second pass finds the vfolder there again and takes only the
        # record, not the new vfolder's keys.
        origin.boto.put_object(Bucket=BUCKET, Key=base + "mine", Body=b"the new vfolder's")
        origin.boto.put_object(Bucket=BUCKET, Key=record, Body=swept)
        wait_for(lambda: trash_records() == 0, timeout=20, what="the second pass")
        assert keys(base) == [base + "mine"]


def test_origin_down_and_wrong_credentials(tmp_path):
    ctx, o = start_origin(tmp_path / "origin")
    try:
        # Wrong credentials stop the start with a message that names the origin.
        cfg = tmp_path / "bad.toml"
        with running_daemon(tmp_path / "good", extra_toml=s3_volume(o)) as good:
            text = good.config_path.read_text().replace(o.sk, "not-the-secret")
        cfg.write_text(text)
        p = run_sluiced("--config", cfg, timeout=30)
        assert p.returncode == 2, p.stderr
        assert "remote" in p.stderr and o.s3_url() in p.stderr, p.stderr

        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(o)) as d:
            vfid = d.create_vfolder(volume="remote")
            o.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "f", Body=b"x" * 10)
            token = download_token(d, vfid, "f", volume="remote")
            ctx.__exit__(None, None, None)  # the origin stops
            ctx = None
            r = requests.get(d.client_url("/download"), params={"token": token}, timeout=120)
            assert r.status_code == 503, (r.status_code, r.text)
            # The volume says why; the node stays in service for its other volumes.
            hw = d.mgr("GET", "/volume/hwinfo", json={"volume": "remote"}).json()
            assert hw["status"] == "degraded" and "origin" in hw["status_info"], hw
            assert d.mgr("GET", "/volume/hwinfo", json={"volume": "local"}).json()["status"] \
                == "healthy"
    finally:
        if ctx:
            ctx.__exit__(None, None, None)


def test_the_origin_bucket_deleted_behind_the_volume(tmp_path):
    """The volume's bucket deleted on the origin while the node runs: its vfolders answer 503
    and the volume reads degraded, naming the missing bucket. Before, NoSuchBucket read as a
    missing vfolder (404), and the volume as healthy."""
    ctx, o = start_origin(tmp_path / "origin")
    try:
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(o)) as d:
            vfid = d.create_vfolder(volume="remote")
            o.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "f", Body=b"x" * 10)
            token = download_token(d, vfid, "f", volume="remote")
            while True:  # every key, then the bucket
                keys = [x["Key"] for x in o.boto.list_objects_v2(Bucket=BUCKET).get(
                    "Contents", [])]
                if not keys:
                    break
                o.boto.delete_objects(Bucket=BUCKET,
                                      Delete={"Objects": [{"Key": k} for k in keys]})
            o.boto.delete_bucket(Bucket=BUCKET)
            r = requests.get(d.client_url("/download"), params={"token": token}, timeout=60)
            assert r.status_code == 503, (r.status_code, r.text)
            r = d.file_op("remote", "list", vfid=vfid, relpath="")
            assert r.status_code == 503, r.text
            hw = d.mgr("GET", "/volume/hwinfo", json={"volume": "remote"}).json()
            assert hw["status"] == "degraded" and "no such bucket" in hw["status_info"], hw
    finally:
        ctx.__exit__(None, None, None)


@contextlib.contextmanager
def listings_of_a_stopped_origin(d, o, vfid, count, answered):
    """Stops the origin (SIGSTOP: it keeps its connections and answers nothing) and lists
    directories d0 .. d<count-1> of `vfid` on the s3 volume, each from a thread of its own,
    calling answered(i, response, seconds) as each returns; on leaving, the origin resumes and
    every listing is waited for."""
    def listing(i):
        started = time.monotonic()
        r = d.file_op("remote", "list", vfid=vfid, relpath=f"d{i}", timeout=120)
        answered(i, r, time.monotonic() - started)

    pause(o.proc.pid)
    threads = [threading.Thread(target=listing, args=(i,)) for i in range(count)]
    try:
        for t in threads:
            t.start()
        yield
    finally:
        os.kill(o.proc.pid, signal.SIGCONT)
        for t in threads:
            t.join()


def test_credentials_the_origin_stops_taking(tmp_path):
    """The volume's key revoked on the origin while the node runs: a request to the volume gets
    a 503 that says the origin refuses the volume's credentials (not a 403, which would tell
    the caller it lacks permission), the volume is degraded with that reason, and both heal
    once the origin takes the key again."""
    ctx, o = start_origin(tmp_path / "origin")
    try:
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(o)) as d:
            vfid = d.create_vfolder(volume="remote")
            o.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "f", Body=b"x" * 10)
            url = d.client_url("/download")
            token = {"token": download_token(d, vfid, "f", volume="remote")}
            assert requests.get(url, params=token, timeout=60).content == b"x" * 10
            assert o.mgr("DELETE", f"/s3/keys/{o.ak}").status_code == 204

            def answer():
                return requests.get(url, params=token, timeout=60)

            wait_for(lambda: answer().status_code != 200, timeout=10, what="the refusal")
            r = answer()
            assert r.status_code == 503 and "refuses volume remote's credentials" in r.text, \
                (r.status_code, r.text)
            assert r.headers.get("Retry-After")
            hw = d.mgr("GET", "/volume/hwinfo", json={"volume": "remote"}).json()
            assert hw["status"] == "degraded" and "credentials" in hw["status_info"], hw
            r = d.file_op("remote", "list", vfid=vfid, relpath="")
            assert r.status_code == 503 and "credentials" in r.text, (r.status_code, r.text)
            # A mkdir asks with HEADs first, whose 403 has no body to say why: the same refusal
            # (mkdir answers per item, as Backend.AI's does).
            r = d.file_op("remote", "mkdir", vfid=vfid, relpath="new/dir", parents=True)
            failed = r.json()["results"]["failed"]
            assert r.status_code == 422 and len(failed) == 1, (r.status_code, r.text)
            assert "refuses volume remote's credentials" in failed[0]["msg"], failed
            hw = d.mgr("GET", "/volume/hwinfo", json={"volume": "remote"}).json()
            assert hw["status"] == "degraded", hw
            # The same key pair imported again: served, and healthy.
            r = o.mgr("POST", "/s3/keys", json={"user": o.user, "access_key": o.ak,
                                                "secret_key": o.sk})
            assert r.status_code == 201, r.text
            wait_for(lambda: answer().status_code == 200, timeout=10, what="the key again")
            assert answer().content == b"x" * 10
            hw = d.mgr("GET", "/volume/hwinfo", json={"volume": "remote"}).json()
            assert hw["status"] == "healthy", hw
    finally:
        ctx.__exit__(None, None, None)


def test_an_origin_over_https(tmp_path):
    """An origin behind TLS: with its CA in `ca-file` files are read and written; a certificate
    that is not trusted stops the start at once with a message that says so and what to set
    (not a warning and a volume that fails every request); `insecure = true` skips the check."""
    from test_s3_sdks import self_signed

    cert, key = self_signed(tmp_path)
    ctx, o = start_origin(tmp_path / "origin", verify=str(cert), s3={
        "ssl-enabled": True, "ssl-cert": str(cert), "ssl-privkey": str(key)})
    try:
        assert o.s3_url().startswith("https://")
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(
                o, **{"ca-file": str(cert)})) as d:
            vfid = d.create_vfolder(volume="remote")
            data = os.urandom(300 * KiB)
            o.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "f.bin", Body=data)
            r = requests.get(d.client_url("/download"), timeout=60,
                             params={"token": download_token(d, vfid, "f.bin", volume="remote")})
            assert r.status_code == 200 and r.content == data
            r = d.file_op("remote", "mkdir", vfid=vfid, relpath="made/over/tls", parents=True)
            assert r.status_code < 300, r.text
            listed = o.boto.list_objects_v2(Bucket=BUCKET, Prefix=vfolder_prefix(vfid) + "made/")
            assert listed["KeyCount"] >= 1, listed
            text = d.config_path.read_text()
        untrusted = tmp_path / "untrusted.toml"
        untrusted.write_text(text.replace(f'ca-file = "{cert}"', 'ca-file = ""'))
        assert str(cert) not in untrusted.read_text()
        started = time.monotonic()
        p = run_sluiced("--config", untrusted, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "certificate" in p.stderr and "not trusted" in p.stderr and "ca-file" in \
            p.stderr, p.stderr
        assert time.monotonic() - started < 20  # refused at once, not retried
        with running_daemon(tmp_path / "insecure", extra_toml=s3_volume(
                o, insecure=True)) as d:
            r = requests.get(d.client_url("/download"), timeout=60,
                             params={"token": download_token(d, vfid, "f.bin", volume="remote")})
            assert r.status_code == 200 and r.content == data
    finally:
        ctx.__exit__(None, None, None)


def test_a_stalled_origin_does_not_hold_up_the_other_volumes(tmp_path):
    """An origin that accepts connections and then answers nothing (SIGSTOP) holds every
    request to its volume until the stall timeout; those requests hold I/O threads, and the
    pool adds threads beside them, so that the node's other volumes and its own routes answer
    at once. (With a fixed pool of 8, a listing of a local directory waited behind them past
    30 s.)"""
    ctx, o = start_origin(tmp_path / "origin")
    try:
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(
                o, **{"stall-timeout": "30s", "retry-deadline": "30s"})) as d:
            rv = d.create_vfolder(volume="remote")
            base = vfolder_prefix(rv)
            for i in range(32):
                o.boto.put_object(Bucket=BUCKET, Key=f"{base}d{i}/f", Body=b"x")
            lv = d.create_vfolder()
            (d.vfolder_path(lv) / "a").mkdir()
            (d.vfolder_path(lv) / "a" / "f.txt").write_bytes(b"local bytes")
            assert metric(d, "sluice_io_pool_threads") == 8
            results = []
            with listings_of_a_stopped_origin(
                    d, o, rv, 32, lambda i, r, took: results.append(r.status_code)):
                # All 32 are waiting on the origin, each on a thread of its own.
                deadline = time.monotonic() + 30
                while metric(d, "sluice_io_pool_busy") < 32 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert metric(d, "sluice_io_pool_busy") >= 32
                assert metric(d, "sluice_io_pool_threads") >= 32
                assert not results  # still waiting: the origin has answered nothing
                # The local volume answers meanwhile: a listing, a download, a vfolder made.
                r = d.file_op("local", "list", vfid=lv, relpath="a", timeout=10)
                assert r.status_code == 200 and [i["name"] for i in r.json()["items"]] == \
                    ["f.txt"], r.text
                r = requests.get(d.client_url("/download"), timeout=10, params={
                    "token": download_token(d, lv, "a/f.txt")})
                assert r.status_code == 200 and r.content == b"local bytes"
                d.create_vfolder()
                assert d.mgr("GET", "/volumes", timeout=10).status_code == 200
                assert not results
            # The origin answers again: every stuck listing completes.
            assert results == [200] * 32, results
    finally:
        ctx.__exit__(None, None, None)


def test_an_origin_that_stops_answering_holds_at_most_max_connections(tmp_path):
    """Requests to an s3 volume's origin share its connections (max-connections of them). When
    the origin stops answering, that many requests wait for it; the others wait for a connection
    at most queue-timeout and fail with a 503 that says why, instead of each holding a thread
    for the stall timeout. The ones that waited complete once the origin is back."""
    ctx, o = start_origin(tmp_path / "origin")
    try:
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(
                o, **{"stall-timeout": "30s", "retry-deadline": "30s",
                      "max-connections": 4, "queue-timeout": "1s"})) as d:
            rv = d.create_vfolder(volume="remote")
            base = vfolder_prefix(rv)
            for i in range(12):
                o.boto.put_object(Bucket=BUCKET, Key=f"{base}d{i}/f", Body=b"x")
            # Listings from 8 threads at once reuse the connections: at most 4 are ever opened.
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                codes = list(pool.map(lambda i: d.file_op(
                    "remote", "list", vfid=rv, relpath=f"d{i % 12}", timeout=60).status_code,
                    range(48)))
            assert codes == [200] * 48
            sent = metric(d, "sluice_origin_requests_total", volume="remote")
            opened = metric(d, "sluice_origin_connections_total", volume="remote")
            assert sent >= 48 and 1 <= opened <= 4, (sent, opened)

            results = {}

            def answered(i, r, took):
                results[i] = (r.status_code, took, r.text)

            with listings_of_a_stopped_origin(d, o, rv, 12, answered):
                # Four wait on the origin; the other eight are refused after about a second.
                deadline = time.monotonic() + 20
                while len(results) < 8 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert len(results) == 8, results
                for code, took, text in results.values():
                    assert code == 503 and took < 10, (code, took, text)
                    assert "no connection to the origin came free" in text, text
                assert metric(d, "sluice_origin_requests_running", volume="remote") == 4
                assert metric(d, "sluice_origin_queue_timeouts_total", volume="remote") == 8
                meta = d.mgr("GET", "/volume/hwinfo", json={"volume": "remote"}).json()["metadata"]
                assert meta["origin-requests-running"] == "4" and \
                    meta["origin-max-connections"] == "4", meta
                assert metric(d, "sluice_io_pool_busy") <= 5
            waited = [results[i][0] for i in results if results[i][0] != 503]
            assert waited == [200] * 4, results
            assert metric(d, "sluice_origin_requests_running", volume="remote") == 0
    finally:
        ctx.__exit__(None, None, None)


def test_the_ssd_cache_serves_reads_while_the_origin_is_down(tmp_path):
    """An s3 volume behind the SSD read cache: a file read once is served again from the
    cache's blocks, also once the origin has stopped; a file never read gets 503."""
    ctx, o = start_origin(tmp_path / "origin")
    try:
        cache = toml_section("volume.remote.cache", {
            "path": str(tmp_path / "cache"), "block-size": "1m", "ttl": "1s", "max-size": "64m"})
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(o) + cache) as d:
            vfid = d.create_vfolder(volume="remote")
            data = os.urandom(5 * MiB + 3)
            for name in ("hot.bin", "cold.bin"):
                o.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + name, Body=data)
            url = d.client_url("/download")
            hot = {"token": download_token(d, vfid, "hot.bin", volume="remote")}
            cold = {"token": download_token(d, vfid, "cold.bin", volume="remote")}
            assert requests.get(url, params=hot, timeout=60).content == data
            ctx.__exit__(None, None, None)  # the origin stops
            ctx = None
            r = requests.get(url, params=hot, timeout=60)
            assert r.status_code == 200 and r.content == data
            r = requests.get(url, params=hot, headers={"Range": "bytes=4194304-4194403"},
                             timeout=60)
            assert r.status_code == 206 and r.content == data[4194304:4194404]
            r = requests.get(url, params=cold, timeout=120)
            assert r.status_code == 503, (r.status_code, r.text[:200])
            metrics = requests.get(d.internal_url("/metrics"), timeout=30).text
            hits = [l for l in metrics.splitlines()
                    if l.startswith('sluice_cache_hits_total{volume="remote"}')]
            assert hits and float(hits[0].split()[-1]) >= 6, hits
        # The blocks stay on disk for the next start: 6 of 1 MiB for the file read, made durable
        # at the clean stop and recorded as checked (sent from disk at once next time).
        blocks = [p for p in (tmp_path / "cache").glob("??/*") if p.is_file()]
        assert len(blocks) == 6
        record = (tmp_path / "cache" / "clean").read_bytes()
        assert record[:4] == b"SLCC" and int.from_bytes(record[4:12], "little") == 6
    finally:
        if ctx:
            ctx.__exit__(None, None, None)


def test_the_ssd_cache_answers_when_the_origin_answers_nothing(tmp_path):
    """An origin that accepts connections and then says nothing (SIGSTOP: a partition looks
    the same) would hold each request until its stall timeout (30 s here). Behind the cache, a
    file and a directory listing whose TTL has passed are served from what the cache holds
    once the origin has not answered within `revalidate-timeout`; a file never read waits for
    the origin, and answers once the origin is back."""
    ctx, o = start_origin(tmp_path / "origin")
    try:
        cache = toml_section("volume.remote.cache", {
            "path": str(tmp_path / "cache"), "block-size": "1m", "ttl": "1s",
            "max-size": "64m", "revalidate-timeout": "300ms"})
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(
                o, **{"stall-timeout": "30s", "retry-deadline": "30s"}) + cache) as d:
            vfid = d.create_vfolder(volume="remote")
            data = os.urandom(3 * MiB + 1)
            o.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "ds/a.bin", Body=data)
            url = d.client_url("/download")
            token = {"token": download_token(d, vfid, "ds/a.bin", volume="remote")}
            assert requests.get(url, params=token, timeout=60).content == data
            assert d.file_op("remote", "list", vfid=vfid, relpath="ds").status_code == 200
            time.sleep(1.2)  # past the TTL: each read asks the origin first
            def stale_opens():
                r = d.mgr("GET", "/volume/cache", json={"volume": "remote"}, timeout=15)
                assert r.status_code == 200, r.text
                return r.json()["stale_opens"], r.json()

            before, _ = stale_opens()
            pause(o.proc.pid)
            try:
                # Answered well before the origin's 30 s stall timeout (the client gives 15).
                r = requests.get(url, params=token, timeout=15)
                assert r.status_code == 200 and r.content == data
                after_get, stats = stale_opens()
                assert after_get > before, (before, stats, tail(d.log_path))
                r = d.file_op("remote", "list", vfid=vfid, relpath="ds", timeout=15)
                assert r.status_code == 200, r.text
                assert [i["name"] for i in r.json()["items"]] == ["a.bin"]
                after_list, stats = stale_opens()
                assert after_list > after_get, (after_get, stats, tail(d.log_path))
                assert stats["origin_silent"] is True, stats
                assert metric(d, "sluice_cache_origin_silent", volume="remote") == 1
            finally:
                os.kill(o.proc.pid, signal.SIGCONT)
            r = requests.get(url, params=token, timeout=60)
            assert r.status_code == 200 and r.content == data
            # The round trips held meanwhile answered: the origin is heard again.
            deadline = time.monotonic() + 30
            while d.mgr("GET", "/volume/cache", json={"volume": "remote"}).json()[
                    "origin_silent"] and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not d.mgr("GET", "/volume/cache", json={"volume": "remote"}).json()[
                "origin_silent"]
    finally:
        ctx.__exit__(None, None, None)


def test_a_prefix_on_the_origin_bound_read_only(proxy, origin):
    """A dataset another client uploaded outside Sluice's layout, served as a vfolder without a
    copy (`sluice vfolder bind`): listed, read and archived; never written, and never deleted
    with the vfolder; a clone copies it into a writable vfolder."""
    def sluice(*args, rc=0):
        return sluice_admin(d, *args, rc=rc)

    d = proxy
    base = f"datasets/{uuid.uuid4().hex[:8]}/"
    files = {"train/a.bin": os.urandom(300 * KiB), "train/deep/b.txt": b"beta",
             "README": b"read me"}
    for rel, body in files.items():
        origin.boto.put_object(Bucket=BUCKET, Key=base + rel, Body=body)
    vfid = new_vfid()
    assert "read-only" in sluice("vfolder", "bind", "remote", vfid, base).stdout

    items = d.file_op("remote", "list", vfid=vfid, relpath="train").json()["items"]
    assert sorted((i["name"], i["type"]) for i in items) == [("a.bin", "FILE"),
                                                            ("deep", "DIRECTORY")]
    for rel, body in files.items():
        r = requests.get(d.client_url("/download"),
                         params={"token": download_token(d, vfid, rel, volume="remote")},
                         timeout=60)
        assert r.status_code == 200 and r.content == body, rel
    r = requests.get(d.client_url("/download-archive"),
                     params={"token": archive_token(d, vfid, ["train"], volume="remote")},
                     timeout=60)
    assert zipfile.ZipFile(io.BytesIO(r.content)).read("train/deep/b.txt") == b"beta"
    usage = d.mgr("GET", "/folder/usage", json={"volume": "remote", "vfid": vfid}).json()
    assert usage["used_bytes"] == sum(map(len, files.values()))

    # Read-only: every write is refused, and the dataset is as it was.
    # (Filesystem errors inside a vfolder are 400 with errno, as Backend.AI's storage proxy
    # answers them; mkdir reports per path, 422 when all failed.)
    r = d.file_op("remote", "mkdir", vfid=vfid, relpath="new")
    assert r.status_code == 422 and "bound read-only" in r.text, r.text
    r = d.file_op("remote", "rename", vfid=vfid, relpath="README", new_name="x")
    assert r.status_code == 400 and r.json()["errno"] == errno.EROFS, r.text
    r = d.file_op("remote", "delete", vfid=vfid, relpaths=["train"], recursive=True)
    assert r.status_code == 400 and "bound read-only" in r.json()["msg"], r.text
    r = d.mgr("POST", "/folder/file/upload",
              json={"volume": "remote", "vfid": vfid, "relpath": "up.bin", "size": 3})
    assert r.status_code in (400, 403) and "bound read-only" in r.text, r.text

    # A clone is a writable copy.
    dst = clone_vfolder(d, "remote", vfid, "remote")
    got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(dst) + "train/a.bin")
    assert got["Body"].read() == files["train/a.bin"]
    assert d.file_op("remote", "mkdir", vfid=dst, relpath="mine").status_code == 200

    # Deleting the vfolder deletes the binding; the dataset stays.
    d.delete_vfolder(vfid, volume="remote")
    keys = {o["Key"] for o in
            origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=base).get("Contents", [])}
    assert keys == {base + rel for rel in files}
    assert d.file_op("remote", "list", vfid=vfid, relpath="").status_code == 404

    # An empty vfolder (one the manager made) can be bound; one with files cannot.
    empty = d.create_vfolder(volume="remote")
    sluice("vfolder", "bind", "remote", empty, base + "train/")
    names = [i["name"] for i in d.file_op("remote", "list", vfid=empty, relpath="").json()["items"]]
    assert sorted(names) == ["a.bin", "deep"]
    full = d.create_vfolder(volume="remote")
    origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(full) + "f", Body=b"x")
    assert "holds files" in sluice("vfolder", "bind", "remote", full, base, rc=4).stderr
    # Clear refusals: nothing there, Sluice's own records, not a prefix, not an s3 volume.
    assert "nothing under" in sluice("vfolder", "bind", "remote", new_vfid(), "nope/",
                                     rc=3).stderr
    assert "records" in sluice("vfolder", "bind", "remote", new_vfid(), "ds/", rc=1).stderr
    vf_dir = vfolder_prefix(full)  # another vfolder's keys are never bound
    assert "overlaps this volume's vfolders" in sluice("vfolder", "bind", "remote", new_vfid(),
                                                       vf_dir, rc=1).stderr
    uploading = d.create_vfolder(volume="remote")  # an upload open in it: not bound
    r = d.mgr("POST", "/folder/file/upload",
              json={"volume": "remote", "vfid": uploading, "relpath": "up.bin", "size": 3})
    assert r.status_code == 200, r.text
    assert "uploads" in sluice("vfolder", "bind", "remote", uploading, base, rc=4).stderr
    assert "ending in '/'" in sluice("vfolder", "bind", "remote", new_vfid(), "datasets",
                                     rc=1).stderr
    assert "not an s3 volume" in sluice("vfolder", "bind", "local", new_vfid(), base,
                                        rc=1).stderr


def test_another_bucket_bound_read_only(proxy, origin):
    """A dataset in another bucket of the origin, bound whole (s3://BUCKET/) or in part
    (s3://BUCKET/PREFIX/): read, listed, measured and cloned; nothing is ever written to that
    bucket (the binding is a record in the volume's own), so read access is all it needs."""
    def sluice(*args, rc=0):
        return sluice_admin(d, *args, rc=rc)

    d = proxy
    other = f"ds-{uuid.uuid4().hex[:8]}"
    origin.boto.create_bucket(Bucket=other)
    files = {"train/a.bin": os.urandom(300 * KiB), "train/deep/b.txt": b"beta",
             "README": b"read me"}
    for rel, body in files.items():
        origin.boto.put_object(Bucket=other, Key=rel, Body=body)

    def keys_of(bucket):
        return {o["Key"]: o["ETag"] for o in
                origin.boto.list_objects_v2(Bucket=bucket).get("Contents", [])}

    before = keys_of(other)
    whole, part = new_vfid(), new_vfid()
    out = sluice("vfolder", "bind", "remote", whole, f"s3://{other}/").stdout
    assert "read-only" in out and f"s3://{other}" in out, out
    sluice("vfolder", "bind", "remote", part, f"s3://{other}/train/")
    # The binding is a record in the volume's own bucket; the bound bucket is named in it the
    # way no node reads as a prefix of its own bucket.
    scope, vf = split_vfid(part)
    record = json.loads(origin.boto.get_object(
        Bucket=BUCKET, Key=f"ds/.sluice/vfolders/{scope}/{vf}")["Body"].read())
    assert record["bound"] == f"s3://{other}/train/" and record["mode"] == 0o555, record
    names = sorted(i["name"] for i in d.file_op("remote", "list", vfid=whole,
                                                relpath="").json()["items"])
    assert names == ["README", "train"]
    names = sorted(i["name"] for i in d.file_op("remote", "list", vfid=part,
                                                relpath="").json()["items"])
    assert names == ["a.bin", "deep"]
    for vfid, strip in ((whole, ""), (part, "train/")):
        for rel, body in files.items():
            if not rel.startswith(strip):
                continue
            r = requests.get(d.client_url("/download"), params={
                "token": download_token(d, vfid, rel[len(strip):], volume="remote")},
                timeout=60)
            assert r.status_code == 200 and r.content == body, rel
    usage = d.mgr("GET", "/folder/usage", json={"volume": "remote", "vfid": whole}).json()
    assert usage["used_bytes"] == sum(map(len, files.values()))
    r = d.file_op("remote", "rename", vfid=whole, relpath="README", new_name="x")
    assert r.status_code == 400 and r.json()["errno"] == errno.EROFS, r.text
    # A clone copies across buckets, server side, into the volume's own layout.
    dst = clone_vfolder(d, "remote", part, "remote")
    got = origin.boto.get_object(Bucket=BUCKET, Key=vfolder_prefix(dst) + "a.bin")
    assert got["Body"].read() == files["train/a.bin"]
    d.delete_vfolder(whole, volume="remote")
    d.delete_vfolder(part, volume="remote")
    assert keys_of(other) == before  # nothing written, nothing deleted
    # Refusals: no such bucket, nothing under a prefix, a name that is no bucket.
    assert "nothing under" in sluice("vfolder", "bind", "remote", new_vfid(),
                                     f"s3://{other}/none/", rc=3).stderr
    assert "names no bucket" in sluice("vfolder", "bind", "remote", new_vfid(), "s3://A_B/",
                                       rc=1).stderr
    sluice("vfolder", "bind", "remote", new_vfid(), "s3://no-such-bucket-x/", rc=3)


def test_clones_from_another_volume_are_uploaded(proxy, origin):
    """A vfolder of a local volume cloned onto the s3 volume: every file uploaded (one past the
    part size as a multipart upload), directories as markers (an empty one too), a symbolic
    link left out; read back through Sluice and straight from the origin."""
    d = proxy
    src = d.create_vfolder(volume="local")
    root = d.vfolder_path(src)
    files = {"a.txt": b"alpha", "deep/er/b.bin": os.urandom(300 * KiB),
             "big.bin": os.urandom(12 * MiB + 3)}  # past part-size 5m: three parts
    for rel, body in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(body)
    os.makedirs(os.path.join(root, "empty"))
    os.symlink("a.txt", os.path.join(root, "link"))
    dst = new_vfid()
    r = d.mgr("POST", "/folder/clone", json={"src_volume": "local", "src_vfid": src,
                                             "dst_volume": "remote", "dst_vfid": dst})
    assert r.status_code == 200, r.text
    t = d.wait_task(r.json()["bgtask_id"])
    assert t["status"] == "completed", t
    base = vfolder_prefix(dst)
    keys = {o["Key"][len(base):] for o in
            origin.boto.list_objects_v2(Bucket=BUCKET, Prefix=base).get("Contents", [])}
    assert {k for k in keys if not k.endswith("/")} == set(files)
    assert "empty/" in keys and "link" not in keys
    for rel, body in files.items():
        assert origin.boto.get_object(Bucket=BUCKET, Key=base + rel)["Body"].read() == body
        r = requests.get(d.client_url("/download"),
                         params={"token": download_token(d, dst, rel, volume="remote")},
                         timeout=60)
        assert r.status_code == 200 and r.content == body, rel
    items = d.file_op("remote", "list", vfid=dst, relpath="").json()["items"]
    assert sorted(i["name"] for i in items) == ["a.txt", "big.bin", "deep", "empty"]


def test_a_clone_onto_the_s3_volume_keeps_object_metadata(proxy, origin):
    """Objects put through Sluice's S3 API on a local bucket keep their content type and user
    metadata when their vfolder is cloned onto the s3 volume (a multipart-sized one too)."""
    d = proxy
    user = d.s3_user()["id"]
    s3 = d.s3_client(*d.s3_key(user))
    s3.create_bucket(Bucket="clone-src")
    big = os.urandom(6 * MiB)  # past part-size 5m
    s3.put_object(Bucket="clone-src", Key="m/big.bin", Body=big, ContentType="application/x-w",
                  Metadata={"shard": "7"})
    s3.put_object(Bucket="clone-src", Key="small.txt", Body=b"s", ContentType="text/x-s",
                  Metadata={"k": "v"})
    b = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"] if b["name"] == "clone-src")
    dst = clone_vfolder(d, b["volume"], b["vfid"], "remote")
    r = d.mgr("POST", "/s3/buckets", json={"name": "clone-dst", "volume": "remote", "vfid": dst,
                                           "owner": user})
    assert r.status_code == 201, r.text
    h = s3.head_object(Bucket="clone-dst", Key="m/big.bin")
    assert h["ContentType"] == "application/x-w" and h["Metadata"] == {"shard": "7"}, h
    assert s3.get_object(Bucket="clone-dst", Key="m/big.bin")["Body"].read() == big
    h = s3.head_object(Bucket="clone-dst", Key="small.txt")
    assert h["ContentType"] == "text/x-s" and h["Metadata"] == {"k": "v"}, h


def test_a_clone_from_the_s3_volume_onto_a_local_one(proxy, origin):
    """The other way: an s3 volume's vfolder cloned onto the local vfs volume is written there
    file by file, with its directories, mtimes and object metadata."""
    d = proxy
    user = d.s3_user(volume="remote")["id"]
    s3 = d.s3_client(*d.s3_key(user))
    s3.create_bucket(Bucket="from-remote")
    big = os.urandom(3 * MiB + 1)
    s3.put_object(Bucket="from-remote", Key="w/big.bin", Body=big, ContentType="application/x-w",
                  Metadata={"shard": "9"})
    s3.put_object(Bucket="from-remote", Key="a.txt", Body=b"alpha")
    b = next(b for b in d.mgr("GET", "/s3/buckets").json()["buckets"]
             if b["name"] == "from-remote")
    origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(b["vfid"]) + "empty/", Body=b"")
    dst = clone_vfolder(d, "remote", b["vfid"], "local")
    root = d.vfolder_path(dst)
    with open(os.path.join(root, "w/big.bin"), "rb") as f:
        assert f.read() == big
    with open(os.path.join(root, "a.txt"), "rb") as f:
        assert f.read() == b"alpha"
    assert os.path.isdir(os.path.join(root, "empty"))
    src_mtime = s3.head_object(Bucket="from-remote", Key="a.txt")["LastModified"].timestamp()
    assert abs(os.stat(os.path.join(root, "a.txt")).st_mtime - src_mtime) < 1.5
    r = d.mgr("POST", "/s3/buckets", json={"name": "onto-local", "volume": "local", "vfid": dst,
                                           "owner": user})
    assert r.status_code == 201, r.text
    h = s3.head_object(Bucket="onto-local", Key="w/big.bin")
    assert h["ContentType"] == "application/x-w" and h["Metadata"] == {"shard": "9"}, h
    usage = d.mgr("GET", "/folder/usage", json={"volume": "local", "vfid": dst}).json()
    assert usage["used_bytes"] == len(big) + 5


@contextlib.contextmanager
def etag_stripping_gateway(o):
    """A stand-in for an S3 gateway that sends no ETags (no real one runs here): forwards every
    request to origin `o` as it came (its Host header too, so signatures hold) and drops the
    ETag header and <ETag> elements from what comes back."""
    import http.client
    import http.server
    import re

    port = o.s3_port

    class Gateway(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def forward(self):
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else None
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            c.request(self.command, self.path, body=body,
                      headers={k: v for k, v in self.headers.items()})
            r = c.getresponse()
            data = r.read()
            if r.getheader("Content-Type", "").endswith("xml"):
                data = re.sub(rb"<ETag>[^<]*</ETag>", b"", data)
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("etag", "content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            length = r.getheader("Content-Length") if self.command == "HEAD" else len(data)
            self.send_header("Content-Length", str(length or 0))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            c.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_origin_without_etags_is_validated_by_size_and_mtime(tmp_path, origin):
    """An origin that sends no ETag: an object replaced by one of the same size is read anew
    once the cache's TTL has passed. Before, every version had the validator "" and the cache
    served the old version's blocks."""
    with etag_stripping_gateway(origin) as gateway:
        cache = toml_section("volume.remote.cache", {
            "path": str(tmp_path / "cache"), "block-size": "1m", "ttl": "1s", "max-size": "64m"})
        volume = s3_volume(origin, prefix="no-etags").replace(origin.s3_url(), gateway)
        with running_daemon(tmp_path / "proxy", extra_toml=volume + cache) as d:
            vfid = d.create_vfolder(volume="remote")
            key = vfolder_prefix(vfid, prefix="no-etags") + "w.bin"
            one, two = os.urandom(2 * MiB + 5), os.urandom(2 * MiB + 5)
            origin.boto.put_object(Bucket=BUCKET, Key=key, Body=one)
            url = d.client_url("/download")
            token = {"token": download_token(d, vfid, "w.bin", volume="remote")}
            r = requests.get(url, params=token, timeout=60)
            assert r.status_code == 200 and r.content == one, r.status_code
            time.sleep(1.1)  # Last-Modified has whole seconds
            origin.boto.put_object(Bucket=BUCKET, Key=key, Body=two)
            time.sleep(1.2)  # past the TTL
            r = requests.get(url, params=token, timeout=60)
            assert r.status_code == 200 and r.content == two, "the old version's blocks"


def test_an_origin_without_etags_never_mixes_versions_in_one_read(tmp_path, origin):
    """No ETag to pin ranged reads with If-Match: an object replaced (by one of another size)
    while a download of it streams cuts the download short; before, the rest of the old
    object's length came from the new object, and the download ended as if whole."""
    with etag_stripping_gateway(origin) as gateway:
        volume = s3_volume(origin, prefix="no-etags-mix").replace(origin.s3_url(), gateway)
        with running_daemon(tmp_path / "proxy", extra_toml=volume) as d:
            vfid = d.create_vfolder(volume="remote")
            key = vfolder_prefix(vfid, prefix="no-etags-mix") + "m.bin"
            one, two = os.urandom(48 * MiB), os.urandom(48 * MiB + 1)
            origin.boto.put_object(Bucket=BUCKET, Key=key, Body=one)
            token = {"token": download_token(d, vfid, "m.bin", volume="remote")}
            r = requests.get(d.client_url("/download"), params=token, stream=True, timeout=60)
            assert r.status_code == 200 and int(r.headers["Content-Length"]) == len(one)
            got = bytearray(r.raw.read(MiB))
            origin.boto.put_object(Bucket=BUCKET, Key=key, Body=two)
            try:
                while chunk := r.raw.read(MiB):
                    got += chunk
            except Exception:  # the answer cut short: what it is
                pass
            assert len(got) < len(one), "the download ended whole, its tail from the new object"
            assert got == one[:len(got)]


@contextlib.contextmanager
def maintained_scope(tmp_path, rules):
    """A proxy on a faulty origin (`rules`) whose usage figures are maintained, not walked: the
    origin, the proxy, a vfolder in a new 64 MiB scope and the scope's used_bytes()."""
    options = {"max-attempts": 1, "usage-walk-budget": "0s", "usage-reconcile-interval": "10m"}
    with faulty_origin(tmp_path / "origin", rules) as o, running_daemon(
            tmp_path / "proxy", extra_toml=s3_volume(o, **options)) as d:
        qsid = new_qsid()
        r = d.mgr("POST", "/quota-scope",
                  json={"volume": "remote", "qsid": qsid, "options": {"limit_bytes": 64 * MiB}})
        assert r.status_code == 204, r.text

        def used():
            return d.mgr("GET", "/quota-scope", json={"volume": "remote", "qsid": qsid}
                         ).json()["used_bytes"]

        yield o, d, d.create_vfolder(vfid=new_vfid(qsid), volume="remote"), used


def test_deletes_take_only_what_they_name(tmp_path):
    """A non-recursive delete of an empty directory deletes its marker alone: before, it
    listed the directory again after finding it empty and deleted every key below, so an
    object written there in between was lost (here the origin holds that second listing for
    2 s while one is written). A delete naming a path twice, or a file below a directory it
    also deletes, takes it once: before, the maintained usage lost its size each time, and
    the child's delete brought the directory's marker back."""
    rules = [{"op": "list", "path": "*gate", "latency": "2s", "skip": 2, "times": 1}]
    with maintained_scope(tmp_path, rules) as (o, d, vfid, used):
        prefix = vfolder_prefix(vfid)

        def keys():
            return sorted(k["Key"][len(prefix):] for k in o.boto.list_objects_v2(
                Bucket=BUCKET, Prefix=prefix).get("Contents", []))

        assert d.file_op("remote", "mkdir", vfid=vfid, relpath="gate").status_code < 300
        assert "gate/" in keys()
        late = threading.Timer(0.5, lambda: o.boto.put_object(
            Bucket=BUCKET, Key=prefix + "gate/late.bin", Body=b"written meanwhile"))
        late.start()
        r = d.file_op("remote", "delete", vfid=vfid, relpaths=["gate"])
        late.join()
        assert r.status_code == 200, (r.status_code, r.text)
        got = o.boto.get_object(Bucket=BUCKET, Key=prefix + "gate/late.bin")["Body"].read()
        assert got == b"written meanwhile"

        base = used()  # late.bin, once the figure has seen it
        for name in ("keep.bin", "d2/f.bin"):
            token = new_session(d, vfid, name, 100 * KiB, volume="remote")
            assert patch(d, token, 0, b"k" * (100 * KiB)).status_code == 204
        assert used() == base + 200 * KiB
        r = d.file_op("remote", "delete", vfid=vfid, relpaths=["d2", "d2/f.bin", "d2"],
                      recursive=True)
        assert r.status_code == 200, (r.status_code, r.text)
        assert used() == base + 100 * KiB
        assert [k for k in keys() if k.startswith("d2")] == []


def test_a_move_whose_delete_fails_counts_both_copies(tmp_path):
    """A move on an s3 volume copies, then deletes the source: when the delete fails, both
    are on the origin and the scope's maintained usage counts both (before, it counted one
    until the next reconcile, so the quota let the scope past its limit). A directory moved in
    part is measured again."""
    rules = [{"op": "delete", "path": "*/mv-src.bin", "error": "EIO"},
             {"op": "delete", "path": "*/dir-src/*", "error": "EIO"}]
    with maintained_scope(tmp_path, rules) as (o, d, vfid, used):

        for name in ("mv-src.bin", "dir-src/a.bin", "dir-src/b.bin"):
            token = new_session(d, vfid, name, 100 * KiB, volume="remote")
            assert patch(d, token, 0, b"m" * (100 * KiB)).status_code == 204
        assert used() == 300 * KiB
        r = d.file_op("remote", "move", vfid=vfid, src_relpath="mv-src.bin",
                      dst_relpath="mv-dst.bin")
        assert r.status_code >= 500, (r.status_code, r.text)
        keys = {k["Key"][len(vfolder_prefix(vfid)):] for k in o.boto.list_objects_v2(
            Bucket=BUCKET, Prefix=vfolder_prefix(vfid))["Contents"]}
        assert {"mv-src.bin", "mv-dst.bin"} <= keys, keys
        assert used() == 400 * KiB
        r = d.file_op("remote", "move", vfid=vfid, src_relpath="dir-src",
                      dst_relpath="dir-dst")
        assert r.status_code >= 500, (r.status_code, r.text)
        deadline = time.monotonic() + 30
        while used() != 600 * KiB and time.monotonic() < deadline:
            time.sleep(0.2)
        assert used() == 600 * KiB
