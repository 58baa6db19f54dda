#!/usr/bin/python3
"""Upload benchmark: a file through Sluice's tus endpoint vs `dd conv=fsync` into the same
filesystem, and sluiced's resident size while clients upload.

  tus-1    one PATCH carrying the whole file (curl -T, streamed from the page cache)
  tus-64m  PATCHes of 64 MiB each, one after the other (what a chunked tus client does)
  dd       dd if=SRC of=DST bs=1M conv=fsync, DST inside the same volume directory

Both sides read the same source file from the page cache and end with every byte on disk
(Sluice fsyncs before it answers; dd's conv=fsync does the same), so the ratio compares the
write paths. Prints MiB/s for each, the ratio against dd (> 1 means Sluice is faster), and the
peak VmRSS of sluiced sampled every 20 ms during each tus run next to its idle size.

  /usr/bin/python3 bench/bench_upload.py [--size 1g] [--repeat 3] [--workdir DIR]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import Sluiced, parse_size

MiB = 1 << 20


class RssSampler:
    def __init__(self, d):
        self.d = d
        self.peak = 0
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.d.rss_kib())
            time.sleep(0.02)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()


def curl_patch(url, src, offset, length):
    """PATCHes [offset, offset + length) of src with curl; returns the new Upload-Offset."""
    whole = offset == 0 and length == os.path.getsize(src)
    # The whole file: curl reads it itself. A range: dd feeds it to curl's stdin, so that no
    # side holds it in memory.
    feeder = None
    if not whole:
        feeder = subprocess.Popen(
            ["dd", f"if={src}", "bs=1M", f"skip={offset}", f"count={length}",
             "iflag=skip_bytes,count_bytes", "status=none"], stdout=subprocess.PIPE)
    out = subprocess.run(
        ["curl", "-sS", "-X", "PATCH", "-T", src if whole else "-", "-D", "-", "-o", "/dev/null",
         "-H", "Tus-Resumable: 1.0.0", "-H", "Content-Type: application/offset+octet-stream",
         "-H", f"Upload-Offset: {offset}", "-H", f"Content-Length: {length}",
         "-H", "Transfer-Encoding:", "-H", "Expect:", url],
        stdin=feeder.stdout if feeder else None, capture_output=True, text=True, check=True)
    if feeder:
        feeder.wait()
    m = re.search(r"^HTTP/1.1 (\d+)", out.stdout, re.M)
    if not m or m.group(1) != "204":
        raise RuntimeError(f"PATCH at {offset}: {out.stdout} {out.stderr}")
    return int(re.search(r"^Upload-Offset: (\d+)", out.stdout, re.M | re.I).group(1))


def tus_upload(d, src, size, piece):
    vfid, path = d.new_vfolder()
    tok = d.call("POST", "/folder/file/upload", volume="local", vfid=vfid, relpath="up.bin",
                 size=size)["token"]
    url = f"http://127.0.0.1:{d.client_port}/upload?token={tok}"
    t0 = time.perf_counter()
    off = 0
    while off < size:
        off = curl_patch(url, src, off, min(piece, size - off))
    elapsed = time.perf_counter() - t0
    final = os.path.join(path, "up.bin")
    if os.path.getsize(final) != size:
        raise RuntimeError("the uploaded file has the wrong size")
    os.unlink(final)
    return elapsed


def dd_copy(src, dst):
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M", "conv=fsync", "status=none"],
                   check=True)
    elapsed = time.perf_counter() - t0
    os.unlink(dst)
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=parse_size("1g"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="where to put data (default: a temp dir)")
    args = ap.parse_args()
    for tool in ("curl", "dd"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (scripts/install-deps.sh)")
    root = tempfile.mkdtemp(prefix="sluice-bench-upload-", dir=args.workdir)
    d = Sluiced(root, storage_proxy='max-upload-size = "1t"')
    try:
        src = os.path.join(root, "src.bin")
        with open(src, "wb") as f:
            block = os.urandom(MiB)
            for i in range(args.size // MiB):
                f.write(block[i % 251:] + block[: i % 251])  # distinct blocks, cheap to make
            f.write(os.urandom(args.size % MiB))
        # Warm the page cache with the source for both sides.
        subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)
        idle = d.rss_kib()
        size_mib = args.size / MiB
        results = {"dd": [], "tus-1": [], "tus-64m": []}
        peaks = {"tus-1": 0, "tus-64m": 0}
        for _ in range(args.repeat):
            results["dd"].append(dd_copy(src, os.path.join(d.vol, "dd.bin")))
            for name, piece in (("tus-1", args.size), ("tus-64m", 64 * MiB)):
                with RssSampler(d) as s:
                    results[name].append(tus_upload(d, src, args.size, piece))
                peaks[name] = max(peaks[name], s.peak)
        best = {k: min(v) for k, v in results.items()}
        rate = {k: size_mib / v for k, v in best.items()}
        print(f"upload of {size_mib:.0f} MiB, best of {args.repeat} (every byte fsynced):")
        print(f"  dd conv=fsync             {rate['dd']:8.1f} MiB/s  ({best['dd']:.2f} s)")
        for name, label in (("tus-1", "tus, one PATCH"), ("tus-64m", "tus, 64 MiB PATCHes")):
            print(f"  {label:<25} {rate[name]:8.1f} MiB/s  ({best[name]:.2f} s)  "
                  f"ratio vs dd {rate[name] / rate['dd']:.2f}x")
        print(f"sluiced VmRSS: idle {idle / 1024:.1f} MiB; peak during tus, one PATCH "
              f"{peaks['tus-1'] / 1024:.1f} MiB; during 64 MiB PATCHes "
              f"{peaks['tus-64m'] / 1024:.1f} MiB (file {size_mib:.0f} MiB)")
        print(json.dumps({"size": args.size, "best_s": best, "mib_s": rate,
                          "rss_kib": {"idle": idle, **peaks}}))
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
