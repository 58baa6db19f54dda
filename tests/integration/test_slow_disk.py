"""Event loops never wait on a disk. One cold download from a throttled device used to stall
every connection on its event loop (sendfile of a 16 MiB chunk at the device's pace): /livez
p90 was 10 s. Cold file data is now read on the I/O pool while the loop keeps serving."""

import os
import threading
import time

import requests

from conftest import join_cgroup, loop_mount, read_throttle, running_daemon, toml_section
from test_download import download_token
from test_http_hardening import metric

MiB = 1 << 20


def test_cold_download_from_a_slow_disk_does_not_stall_the_loop(tmp_path):
    with loop_mount("ext4", "512M") as disk, read_throttle(disk.dev, 2 * MiB) as procs:
        with running_daemon(
            tmp_path / "d",
            storage_proxy={"num-proc": 1},  # one event loop: the download and probes share it
            volumes={"slow": disk.mnt},
            extra_toml=toml_section("volume.slow", {"backend": "vfs", "path": str(disk.mnt)}),
            start_kw={"preexec_fn": join_cgroup(procs)},
        ) as d:
            vfid = d.create_vfolder(volume="slow")
            big = d.vfolder_path(vfid, "slow") / "big.bin"
            with open(big, "wb") as f:
                block = os.urandom(MiB)
                for _ in range(300):
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
                # Out of the page cache: every read now goes to the throttled device.
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            small = d.vfolder_path(vfid, "slow") / "small.txt"
            small.write_bytes(b"hot")  # in the page cache

            got = [0]
            stop = threading.Event()

            def cold_download():
                url = f"http://127.0.0.1:{d.client_port}/download"
                with requests.get(url, params={"token": download_token(d, vfid, "big.bin", volume="slow")},
                                  stream=True, timeout=120) as r:
                    assert r.status_code == 200
                    for piece in r.iter_content(1 << 16):
                        got[0] += len(piece)
                        if stop.is_set():
                            break

            t = threading.Thread(target=cold_download)
            t.start()
            try:
                while got[0] == 0 and t.is_alive():
                    time.sleep(0.05)
                latencies = []
                small_url = f"http://127.0.0.1:{d.client_port}/download"
                small_tok = download_token(d, vfid, "small.txt", volume="slow")
                for _ in range(20):
                    t0 = time.monotonic()
                    assert requests.get(d.client_url("/livez"), timeout=30).status_code == 200
                    r = requests.get(small_url, params={"token": small_tok}, timeout=30)
                    assert r.content == b"hot"
                    latencies.append(time.monotonic() - t0)
                    time.sleep(0.1)
                moved = got[0]
            finally:
                stop.set()
                t.join()
            # The download was still crawling at the device's pace meanwhile (2 MiB/s against
            # 300 MiB), so the probes did share the loop with it.
            assert moved < 200 * MiB, f"{moved} bytes: the file was not cold"
            latencies.sort()
            # Before: ~8 s per probe (a 16 MiB sendfile at 2 MiB/s on the loop); the bound
            # leaves room for a loaded machine.
            assert latencies[-1] < 3.0, f"probe latencies {latencies}"
            assert metric(d, "sluice_http_cold_reads_total", listener="client") > 0
