"""The SSD read cache in front of an s3 volume whose origin is a second sluiced, as an operator
meets it: `sluice cache warm | stats | evict` (and their manager routes), `kill -9` in the middle
of a fill followed by a restart (everything read afterwards has the origin's SHA-256), and a
cache disk that fills up (a small tmpfs: reads go on, the free-space floor holds)."""

import hashlib
import json
import os
import subprocess
import threading
import time

import pytest
import requests

from conftest import BIN_DIR, MANAGER_SECRET, running_daemon, toml_section
from test_download import download_token
from test_s3_volume import BUCKET, s3_volume, start_origin, vfolder_prefix

MiB = 1 << 20


@pytest.fixture
def origin(tmp_path):
    """A second sluiced with a bucket; origin.stop() and origin.start() take it down and
    bring it back on the same ports and data."""
    ctx, o = start_origin(tmp_path / "origin")
    yield o
    ctx.__exit__(None, None, None)


def cache_section(path, **options):
    return toml_section("volume.remote.cache", {"path": str(path), "block-size": "1m",
                                                "ttl": "1s", **options})


def sluice(d, *args, rc=0):
    p = subprocess.run([str(BIN_DIR / "sluice"), "--endpoint", d.url(""), "--token",
                        MANAGER_SECRET, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == rc, f"sluice {args}: {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def block_files(cache):
    """The cache's block files: <cache>/<id[0:2]>/<id> (not tmp/ or the attributes in meta/)."""
    return [p for p in cache.glob("??/*") if p.is_file()]


def stats(d):
    return json.loads(sluice(d, "--json", "cache", "stats", "remote").stdout)


def get(d, vfid, name, **kw):
    return requests.get(d.client_url("/download"),
                        params={"token": download_token(d, vfid, name, volume="remote")},
                        timeout=120, **kw)


def test_warm_stats_and_evict(tmp_path, origin):
    files = {"train/a.bin": os.urandom(3 * MiB + 1), "train/deep/b.bin": os.urandom(100),
             "train/deep/c.bin": os.urandom(MiB), "val/d.bin": os.urandom(2 * MiB)}
    with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(origin) +
                        cache_section(tmp_path / "cache", admission="second-miss")) as d:
        vfid = d.create_vfolder(volume="remote")
        for name, data in files.items():
            origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + name, Body=data)
        s = stats(d)
        assert s["blocks"] == 0 and s["admission"] == "second-miss" and s["eviction"] == "s3-fifo"

        # Warm one directory: every block kept although the admission policy is second-miss.
        out = sluice(d, "cache", "warm", "remote", vfid, "train").stdout
        assert "warmed 3/3 files" in out, out
        s = stats(d)
        assert s["blocks"] == 4 + 1 + 1, s  # 4 + 1 + 1 blocks of 1 MiB at most
        assert s["bytes"] == s["fill_bytes"] == 4 * MiB + 101, s
        assert s["origin_bytes"] == 4 * MiB + 101, s

        # The task reports its progress, and a warm of what is cached reads nothing new.
        r = d.mgr("POST", "/volume/cache/warm", json={"volume": "remote", "vfid": vfid})
        assert r.status_code == 202, r.text
        t = d.wait_task(r.json()["bgtask_id"])
        assert t["status"] == "completed" and t["kind"] == "cache-warm", t
        p = t["progress"]
        assert p["files_found"] == p["files_done"] == 4 and p["errors"] == 0 and p["listed"], p
        assert p["bytes_done"] == p["bytes_found"] == sum(map(len, files.values())), p
        assert stats(d)["origin_bytes"] == 6 * MiB + 101
        # The warm's walk kept the listings it read (each directory's entries), as shown.
        s = stats(d)
        assert s["listings"] >= 3 and s["listing_entries"] >= 5 and s["listings_passed"] == 0, s
        out = sluice(d, "cache", "stats", "remote").stdout
        assert f"{s['listings']} kept, {s['listing_entries']} entries" in out, out
        assert "over 100000 is listed from the origin" in out, out

        # Evict a directory: its files' blocks go, the others stay.
        out = json.loads(sluice(d, "--json", "cache", "evict", "remote", vfid, "train/deep")
                         .stdout)
        assert out == {"files": 2, "blocks": 2}, out
        assert stats(d)["blocks"] == 6

        # With the origin gone, every file still cached is served; an evicted one is 503 with
        # Retry-After.
        origin.stop()
        time.sleep(1.1)  # past the TTL: opens ask the origin, which does not answer
        for name in ("train/a.bin", "val/d.bin"):
            r = get(d, vfid, name)
            assert r.status_code == 200 and r.content == files[name], (name, r.status_code)
        r = get(d, vfid, "train/deep/c.bin")
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", r.status_code
        assert stats(d)["stale_opens"] > 0

        # Evict everything: nothing is left on disk, and nothing can be served.
        out = sluice(d, "cache", "evict", "remote", "--all").stdout
        assert "evicted 6 blocks" in out, out
        assert stats(d)["blocks"] == 0
        assert not block_files(tmp_path / "cache")
        r = d.mgr("POST", "/folder/file/download",
                  json={"volume": "remote", "vfid": vfid, "relpath": "val/d.bin"})
        assert r.status_code == 503 and r.headers.get("Retry-After") == "1", r.text
        assert "Couldn't connect" in r.json()["msg"], r.text

        # Metrics for operators.
        m = requests.get(d.internal_url("/metrics"), timeout=30).text
        for name in ("sluice_cache_evictions_total", "sluice_cache_fill_bytes_total",
                     "sluice_cache_bytes", "sluice_cache_blocks"):
            assert f'{name}{{volume="remote"}}' in m, name
        assert 'sluice_cache_evictions_total{volume="remote"} 8' in m

        # Clear errors: a volume without a cache, a path that is not there, usage mistakes.
        p = sluice(d, "cache", "stats", "local", rc=1)
        assert "has no SSD cache" in p.stderr and "[volume.local.cache]" in p.stderr, p.stderr
        p = sluice(d, "cache", "evict", "remote", rc=2)
        assert "--all" in p.stderr
        sluice(d, "cache", "evict", "remote", vfid, "--all", rc=2)
        r = d.mgr("POST", "/volume/cache/warm",
                  json={"volume": "remote", "vfid": vfid, "path": "../etc"})
        assert r.status_code == 400, r.text


def test_one_cache_per_directory_and_a_check_beside_it(tmp_path, origin):
    """A second daemon given a running one's cache path refuses to start, naming it, and leaves
    the cache alone; `sluiced --check-config` of the running config passes without touching it
    (before, the check opened the cache: it emptied tmp/ and compacted the daemon's journal)."""
    cache = tmp_path / "cache"
    with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(origin) +
                        cache_section(cache)) as d:
        vfid = d.create_vfolder(volume="remote")
        data = os.urandom(MiB + 7)
        origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "a.bin", Body=data)
        assert get(d, vfid, "a.bin").content == data
        planted = cache / "tmp" / "being-written"
        planted.write_bytes(b"x")
        journal = (cache / "attributes.log").read_bytes()
        assert journal

        r = subprocess.run([str(BIN_DIR / "sluiced"), "--check-config", "--config",
                            str(d.config_path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "configuration OK" in r.stdout, (r.stdout, r.stderr)
        r = subprocess.run([str(BIN_DIR / "sluiced"), "--config", str(d.config_path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert f"cache directory '{cache}' is in use by another cache" in r.stdout + r.stderr, \
            (r.stdout, r.stderr)
        assert planted.exists()
        assert (cache / "attributes.log").read_bytes().startswith(journal)
        assert get(d, vfid, "a.bin").content == data
        assert stats(d)["hits"] >= 1


def test_kill_9_during_a_fill_then_restart(tmp_path, origin):
    """A fill cut short by SIGKILL leaves nothing that is served wrong: after a restart every
    read of the file has the origin's SHA-256, and blocks already filled are used."""
    data = os.urandom(48 * MiB + 7)
    cache = cache_section(tmp_path / "cache", ttl="1h")
    with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(origin) + cache) as d:
        vfid = d.create_vfolder(volume="remote")
        origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "model.bin", Body=data)
        r = get(d, vfid, "model.bin", stream=True)
        assert r.status_code == 200
        got = 0
        for chunk in r.iter_content(1 << 16):
            got += len(chunk)
            if got >= 20 * MiB:
                break
        d.kill()  # SIGKILL in the middle of the fill
        r.close()
        blocks_before = block_files(tmp_path / "cache")
        assert 10 <= len(blocks_before) < 49, len(blocks_before)
        d.start()
        s = stats(d)
        assert s["blocks"] == len(blocks_before), s  # indexed again at start
        want = hashlib.sha256(data).hexdigest()
        assert hashlib.sha256(get(d, vfid, "model.bin").content).hexdigest() == want
        s = stats(d)
        assert s["hits"] >= len(blocks_before) and s["torn_blocks"] == 0, s
        # Ranged reads across block boundaries agree with the origin too.
        for start in (MiB - 3, 17 * MiB + 5, 48 * MiB):
            r = get(d, vfid, "model.bin", headers={"Range": f"bytes={start}-{start + 9}"})
            assert r.status_code == 206 and r.content == data[start:start + 10]


def test_a_full_cache_disk(tmp_path, origin):
    """The cache's disk is a 16 MiB tmpfs with min-free 6m: reads of 40 MiB (read ahead, so
    several blocks are written at once) go on, correct, and the disk never has less than the
    floor free."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], check=True)
    try:
        cache = cache_section(mnt / "c", **{"min-free": "6m", "max-size": "1g"})
        with running_daemon(tmp_path / "proxy", extra_toml=s3_volume(origin) + cache) as d:
            vfid = d.create_vfolder(volume="remote")
            files = {f"f{i}": os.urandom(4 * MiB) for i in range(10)}
            for name, body in files.items():
                origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + name, Body=body)
            low = [1 << 62]

            def watch(stop):
                while not stop.is_set():
                    st = os.statvfs(mnt)
                    low[0] = min(low[0], st.f_bavail * st.f_frsize)
                    time.sleep(0.005)
            stop = threading.Event()
            w = threading.Thread(target=watch, args=(stop,))
            w.start()
            try:
                for _ in range(2):
                    for name, body in files.items():
                        r = get(d, vfid, name)
                        assert r.status_code == 200 and r.content == body, name
            finally:
                stop.set()
                w.join()
            s = stats(d)
            assert s["evictions"] > 0 and 0 < s["bytes"] <= 10 * MiB, s
            # The floor holds with read-ahead writing several blocks at once (each is reserved
            # before it is written), less what a few files of attributes take.
            assert low[0] >= 6 * MiB - 64 * 1024, low[0]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_the_origin_killed_during_a_read(tmp_path, origin):
    """SIGKILL of the origin in the middle of a cold read through the cache: the download is cut
    short (never padded, never wrong), and every block the cache kept has the origin's bytes
    and is served while the origin stays dead; the rest is 503."""
    data = os.urandom(40 * MiB)
    cache = cache_section(tmp_path / "cache", ttl="1h", **{"read-ahead": "2"})
    # A dead origin is given up on after two attempts (the default retries for 30 s).
    volume = s3_volume(origin, **{"max-attempts": "2", "retry-deadline": "2s",
                                  "connect-timeout": "2s"})
    with running_daemon(tmp_path / "proxy", extra_toml=volume + cache) as d:
        vfid = d.create_vfolder(volume="remote")
        origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "model.bin", Body=data)
        r = get(d, vfid, "model.bin", stream=True)
        assert r.status_code == 200
        got = bytearray()
        chunks = r.iter_content(1 << 16)
        for chunk in chunks:
            got += chunk
            if len(got) >= 8 * MiB:
                break
        origin.kill()  # SIGKILL, mid-read
        origin.proc = None
        try:
            for chunk in chunks:
                got += chunk
        except requests.exceptions.RequestException:
            pass  # the body cut short: what the client must see
        r.close()
        assert 8 * MiB <= len(got) < len(data)
        assert bytes(got) == data[:len(got)]
        served = 0
        for i in range(40):
            r = get(d, vfid, "model.bin", headers={"Range": f"bytes={i * MiB}-{(i + 1) * MiB - 1}"})
            assert r.status_code in (206, 503), r.status_code
            if r.status_code == 206:
                assert r.content == data[i * MiB:(i + 1) * MiB], i
                served += 1
        assert served >= 8 and served == stats(d)["blocks"], (served, stats(d))


def test_what_is_written_through_the_node_is_read_from_the_cache(tmp_path, origin):
    """Ingest on write: objects put through the proxy's S3 API (one PUT, a multipart upload)
    and a tus upload over several PATCHes are kept as written, under the version the origin
    made, so they are read back with the origin stopped (before, every new version was
    fetched back from the origin at its first read: 503 here). The multipart upload is
    assembled on the origin (its parts copied there, never read back through here), so it is
    fetched back into the cache in the background once it landed: the one file whose bytes
    come from the origin, counted as origin bytes but not as misses. One written by another
    client at the origin is not in the cache."""
    from test_s3_volume import multipart_put
    from test_upload import new_session, patch
    small, big, tus = b"one small object", os.urandom(11 * MiB), os.urandom(3 * MiB + 5)
    with running_daemon(tmp_path / "proxy", s3={}, extra_toml=s3_volume(origin) +
                        cache_section(tmp_path / "cache", ttl="1h")) as d:
        user = d.s3_user(volume="remote")["id"]
        s3 = d.s3_client(*d.s3_key(user))
        s3.create_bucket(Bucket="ingest")
        s3.put_object(Bucket="ingest", Key="small.txt", Body=small)
        multipart_put(s3, "ingest", "big.bin", big, 5 * MiB)
        vfid = d.create_vfolder(volume="remote")
        token = new_session(d, vfid, "up/tus.bin", len(tus), volume="remote")
        for at in range(0, len(tus), MiB + 1):
            assert patch(d, token, at, tus[at:at + MiB + 1]).status_code == 204
        origin.boto.put_object(Bucket=BUCKET, Key=vfolder_prefix(vfid) + "elsewhere.txt",
                               Body=b"written at the origin")
        want = 1 + 11 + 4  # blocks of 1 MiB
        deadline = time.time() + 30  # kept in the background, once the origin shows them
        while stats(d)["ingested_blocks"] < want and time.time() < deadline:
            time.sleep(0.1)
        s = stats(d)
        assert s["ingest"] and s["ingested_blocks"] == want, s
        assert s["ingested_bytes"] == len(small) + len(big) + len(tus), s
        assert s["misses"] == 0 and s["origin_bytes"] == len(big), s
        out = sluice(d, "cache", "stats", "remote").stdout
        assert f"in {want} blocks, as written through this node" in out, out
        # A copy of it through the cache is made on the origin too (the source read from
        # the cache would have been uploaded again), and fetched back the same way.
        s3.copy_object(Bucket="ingest", Key="copy.bin",
                       CopySource={"Bucket": "ingest", "Key": "big.bin"})
        want += 11
        while stats(d)["ingested_blocks"] < want and time.time() < deadline + 30:
            time.sleep(0.1)
        s = stats(d)
        assert s["ingested_blocks"] == want and s["origin_bytes"] == 2 * len(big), s

        origin.stop()
        assert s3.get_object(Bucket="ingest", Key="small.txt")["Body"].read() == small
        assert s3.get_object(Bucket="ingest", Key="big.bin")["Body"].read() == big
        assert s3.get_object(Bucket="ingest", Key="copy.bin")["Body"].read() == big
        r = get(d, vfid, "up/tus.bin")
        assert r.status_code == 200 and r.content == tus, r.status_code
        r = d.mgr("POST", "/folder/file/download",
                  json={"volume": "remote", "vfid": vfid, "relpath": "elsewhere.txt"})
        assert r.status_code == 503, r.text
        s = stats(d)
        assert s["hits"] >= want and s["origin_bytes"] == 2 * len(big), s
