#!/usr/bin/python3
"""Memory benchmark: sluiced's resident size while many clients download and upload at once.

  64 clients download one file of --size (curl --output /dev/null, each its own connection)
  16 clients upload --upload-size each through tus (one curl PATCH each, from the page cache)

all at the same time, with sluiced's VmRSS sampled every 20 ms. The same mix runs twice: with
--small-size / --small-upload-size files first, then with the full sizes. Downloads are
zero-copy (sendfile) and uploads go through bounded buffers, so the peak must not grow with the
file size: the two peaks should be about the same, and far below the data moved. Prints the
idle size, both peaks and the time each mix took.

The downloaded file is real data (a 1 MiB random block, rotated per MiB, so that no two MiB are
alike), not a sparse file: a sparse file would be read from the zero page.

  /usr/bin/python3 bench/bench_memory.py [--size 1g] [--upload-size 256m] [--downloads 64]
                                         [--uploads 16] [--small-size 64m]
                                         [--small-upload-size 16m] [--workdir DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import Sluiced, parse_size
from bench_upload import RssSampler, curl_patch

MiB = 1 << 20


def make_file(path, size):
    """size bytes of random-looking data, written once (no sparse regions)."""
    block = os.urandom(MiB)
    with open(path, "wb") as f:
        for i in range(size // MiB):
            r = (i * 4099) % MiB
            f.write(block[r:] + block[:r])
        f.write(os.urandom(size % MiB))
    # Warm the page cache so that the mix measures the server, not the disk.
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def curl_get(url, size, errors):
    out = subprocess.run(
        ["curl", "-sS", "--output", "/dev/null", "-w", "%{http_code} %{size_download}", url],
        capture_output=True, text=True)
    if out.returncode != 0 or out.stdout.split() != ["200", str(size)]:
        errors.append(f"GET: rc {out.returncode}, {out.stdout!r} {out.stderr.strip()}")


def tus_put(url, src, size, errors):
    try:
        if curl_patch(url, src, 0, size) != size:
            errors.append("PATCH: upload not complete")
    except Exception as e:  # noqa: BLE001 - reported with the rest
        errors.append(f"PATCH: {e}")


def mix(d, root, size, upload_size, n_down, n_up):
    """Runs n_down downloads of a size-byte file and n_up uploads of upload_size bytes at once;
    returns (peak VmRSS KiB, seconds)."""
    vfid, path = d.new_vfolder()
    make_file(os.path.join(path, "big.bin"), size)
    src = os.path.join(root, "src.bin")
    make_file(src, upload_size)
    tok = d.call("POST", "/folder/file/download", volume="local", vfid=vfid,
                 relpath="big.bin")["token"]
    get_url = f"http://127.0.0.1:{d.client_port}/download?token={tok}"
    put_urls = []
    for i in range(n_up):
        t = d.call("POST", "/folder/file/upload", volume="local", vfid=vfid,
                   relpath=f"up/{i}.bin", size=upload_size)["token"]
        put_urls.append(f"http://127.0.0.1:{d.client_port}/upload?token={t}")
    errors = []
    threads = [threading.Thread(target=curl_get, args=(get_url, size, errors))
               for _ in range(n_down)]
    threads += [threading.Thread(target=tus_put, args=(u, src, upload_size, errors))
                for u in put_urls]
    with RssSampler(d) as s:
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} transfers failed, first: {errors[0]}")
    for i in range(n_up):
        if os.path.getsize(os.path.join(path, "up", f"{i}.bin")) != upload_size:
            raise RuntimeError(f"upload {i} has the wrong size")
    d.wait_task(d.call("POST", "/folder/delete", volume="local", vfid=vfid)["bgtask_id"])
    os.unlink(src)
    return s.peak, elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("1g"))
    ap.add_argument("--upload-size", type=parse_size, default=parse_size("256m"))
    ap.add_argument("--small-size", type=parse_size, default=parse_size("64m"))
    ap.add_argument("--small-upload-size", type=parse_size, default=parse_size("16m"))
    ap.add_argument("--downloads", type=int, default=64)
    ap.add_argument("--uploads", type=int, default=16)
    ap.add_argument("--workdir", default=None, help="where to put data (default: a temp dir)")
    args = ap.parse_args()
    if not shutil.which("curl") or not shutil.which("dd"):
        sys.exit("curl and dd are needed (scripts/install-deps.sh)")
    root = tempfile.mkdtemp(prefix="sluice-bench-memory-", dir=args.workdir)
    d = Sluiced(root, storage_proxy='max-upload-size = "1t"')
    try:
        time.sleep(0.5)
        idle = d.rss_kib()
        runs = {}
        for label, size, up in (("small", args.small_size, args.small_upload_size),
                                ("full", args.size, args.upload_size)):
            peak, secs = mix(d, root, size, up, args.downloads, args.uploads)
            runs[label] = {"size": size, "upload_size": up, "peak_kib": peak, "seconds": secs}
        after = d.rss_kib()
        print(f"sluiced VmRSS with {args.downloads} downloads and {args.uploads} tus uploads "
              f"at once (sampled every 20 ms):")
        print(f"  idle                                      {idle / 1024:8.1f} MiB")
        for label, r in runs.items():
            moved = (r["size"] * args.downloads + r["upload_size"] * args.uploads) / MiB
            print(f"  peak, {r['size'] / MiB:6.0f} MiB file, {r['upload_size'] / MiB:5.0f} MiB "
                  f"uploads  {r['peak_kib'] / 1024:8.1f} MiB   ({moved:.0f} MiB moved in "
                  f"{r['seconds']:.1f} s)")
        print(f"  after both mixes                          {after / 1024:8.1f} MiB")
        print(json.dumps({"idle_kib": idle, "after_kib": after, "runs": runs}))
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
