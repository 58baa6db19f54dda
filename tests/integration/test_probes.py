"""Health probes answer from state kept current in the background: never behind file work, and
with the reason when a volume is full or failing."""

import os
import subprocess
import threading
import time

import pytest
import requests

from conftest import running_daemon, toml_section

MiB = 1 << 20


def health(d):
    r = requests.get(d.internal_url("/health"), timeout=10)
    return r.status_code, r.json()


def wait_health(d, pred, what, timeout=20):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = health(d)
        if pred(*last):
            return last
        time.sleep(0.2)
    pytest.fail(f"/health never showed {what}: {last}")


def test_probes_do_not_queue_behind_listings(make_daemon):
    """Probes used to run on the worker pool that lists directories: p90 7.7 s during 16
    listings of a 200k-entry directory. With one worker, listings queue behind each other, and
    every probe must still be answered before they are through."""
    d = make_daemon(sluice={"io-threads": 1, "io-threads-max": 1}, storage_proxy={"scandir-limit": 0})
    vfid = d.create_vfolder()
    big = d.vfolder_path(vfid) / "big"
    big.mkdir()
    for i in range(60000):
        os.close(os.open(big / f"f{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644))
    finished = []
    lock = threading.Lock()

    def listing():
        r = d.mgr("POST", "/folder/file/list", json={"volume": "local", "vfid": vfid,
                                                        "relpath": "big"}, timeout=300)
        assert r.status_code == 200
        assert len(r.json()["items"]) == 60000
        with lock:
            finished.append(("listing", time.monotonic()))

    threads = [threading.Thread(target=listing) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)  # the listings are queued on the one worker
    for path in ("/health", "/readyz", "/livez") * 4:
        for url in (d.internal_url(path), d.url(path)):
            r = requests.get(url, timeout=60)
            assert r.status_code == 200
            with lock:
                finished.append(("probe", time.monotonic()))
    for t in threads:
        t.join()
    last_probe = max(t for kind, t in finished if kind == "probe")
    listings = sorted(t for kind, t in finished if kind == "listing")
    assert len(listings) == 8
    assert last_probe < listings[-1], "a probe waited for the listings to finish"


def test_full_and_missing_volumes_are_reported_with_the_reason(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        with running_daemon(
            tmp_path / "d",
            volumes={"small": small},
            extra_toml=toml_section("volume.small", {"backend": "vfs", "path": str(small)}),
        ) as d:
            status, body = health(d)
            assert status == 200 and body["status"] == "healthy", body
            assert body["volumes"]["small"]["fs"]["capacity_bytes"] == 8 * MiB

            filler = small / "filler"
            fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o644)
            try:
                while os.write(fd, b"\0" * MiB) > 0:
                    pass
            except OSError:
                pass  # ENOSPC: full
            finally:
                os.close(fd)
            status, body = wait_health(
                d, lambda s, b: b["volumes"]["small"]["status"] == "degraded", "a full volume")
            assert status == 200 and body["status"] == "degraded"
            assert "full" in body["volumes"]["small"]["status_info"]
            assert body["volumes"]["local"]["status"] == "healthy"
            filler.unlink()
            wait_health(d, lambda s, b: b["status"] == "healthy", "recovery after freeing space")

            # A volume whose path is gone: unavailable, the node unhealthy (503).
            subprocess.run(["umount", str(small)], check=True)
            small.rename(tmp_path / "small-away")
            try:
                status, body = wait_health(d, lambda s, b: s == 503, "an unreachable volume")
                assert body["status"] == "unhealthy"
                assert body["volumes"]["small"]["status"] == "unavailable"
                assert "not reachable" in body["volumes"]["small"]["status_info"]
                r = requests.get(d.url("/readyz"), timeout=10)
                assert r.status_code == 503
            finally:
                (tmp_path / "small-away").rename(small)
            wait_health(d, lambda s, b: b["status"] == "healthy", "recovery of the volume")
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False, capture_output=True)
