#!/usr/bin/python3
"""Core control-plane benchmarks: Sluice against its peers on the same data, in the same run.

  usage   GET /folder/usage on a vfolder of N small files  vs  du -s --apparent-size
  clone   POST /folder/clone of S bytes in F files          vs  cp -a
  api     wrk on GET /folder/mount and GET /folder/usage     (requests/s, latency)
  memory  resident size of sluiced when idle and with K idle keep-alive connections

Prints one line per measurement and the ratio against the peer (> 1 means Sluice is faster).
Everything runs on loopback against a sluiced started here on free ports.

  /usr/bin/python3 bench/bench_core.py [--files 200000] [--clone-bytes 1g] [--clone-files 10000]
                                       [--conns 1000] [--only usage,clone,api,memory]
"""
import argparse
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from benchlib import TOKEN, Sluiced, parse_size


def best_of(n, fn):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def report(name, sluice_s, peer_name, peer_s):
    print(f"{name}: sluice {sluice_s * 1000:.1f} ms, {peer_name} {peer_s * 1000:.1f} ms, "
          f"ratio {peer_s / sluice_s:.2f}x ({'faster' if peer_s > sluice_s else 'slower'})")


def make_tree(path, files, size, per_dir=1000):
    data = os.urandom(size)
    for i in range(files):
        d = os.path.join(path, f"d{i // per_dir:05d}")
        if i % per_dir == 0:
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
            f.write(data)


def bench_usage(d, files):
    vfid, path = d.new_vfolder()
    t0 = time.perf_counter()
    make_tree(path, files, 100)
    print(f"usage: made {files} files in {time.perf_counter() - t0:.1f} s")
    subprocess.run(["du", "-s", "--apparent-size", path], check=True, capture_output=True)
    usage = d.call("GET", "/folder/usage", volume="local", vfid=vfid)
    assert usage["file_count"] >= files, usage
    s_best, _ = best_of(3, lambda: d.call("GET", "/folder/usage", volume="local", vfid=vfid))
    p_best, _ = best_of(3, lambda: subprocess.run(["du", "-s", "--apparent-size", path],
                                                   check=True, capture_output=True))
    report(f"usage of {files} files (warm cache, best of 3)", s_best, "du -s --apparent-size",
           p_best)
    return vfid


def bench_clone(d, total, files, scratch):
    vfid, path = d.new_vfolder()
    make_tree(path, files, max(1, total // files), per_dir=500)
    subprocess.run(["sync"], check=True)
    subprocess.run(["du", "-s", path], check=True, capture_output=True)

    def sluice_clone():
        dst = f"user:{uuid.uuid4().hex}/{uuid.uuid4().hex}"
        t = d.call("POST", "/folder/clone", src_volume="local", src_vfid=vfid,
                   dst_volume="local", dst_vfid=dst)
        d.wait_task(t["bgtask_id"])

    def cp_clone():
        dst = os.path.join(scratch, uuid.uuid4().hex)
        subprocess.run(["cp", "-a", path, dst], check=True)

    # Alternate the two and sync before each run, so that neither pays for the other's
    # writeback (dirty-page throttling dominates copies on a small machine).
    s_times, p_times = [], []
    for _ in range(3):
        for fn, times in ((sluice_clone, s_times), (cp_clone, p_times)):
            subprocess.run(["sync"], check=True)
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    report(f"clone of {total >> 20} MiB in {files} files (best of 3, alternating, synced)",
           min(s_times), "cp -a", min(p_times))


def bench_api(d, vfid):
    q = f"volume=local&vfid={vfid}"
    for route in ("/folder/mount", "/folder/usage"):
        out = subprocess.run(
            ["wrk", "-t2", "-c32", "-d5s", "--latency", "-H",
             f"X-BackendAI-Storage-Auth-Token: {TOKEN}", f"{d.mgr}{route}?{q}"],
            check=True, capture_output=True, text=True).stdout
        rps = re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)
        p50 = re.search(r"50%\s+(\S+)", out).group(1)
        p99 = re.search(r"99%\s+(\S+)", out).group(1)
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        print(f"api {route}: {rps} req/s, p50 {p50}, p99 {p99} (wrk -t2 -c32 -d5s)"
              + (f", {non2xx.group(1)} errors" if non2xx else ""))


def bench_memory(d, conns):
    time.sleep(0.5)
    idle = d.rss_kib()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, conns + 256)), hard))
    socks = []
    req = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(req)
        s.recv(4096)
        socks.append(s)
    time.sleep(0.5)
    held = d.rss_kib()
    for s in socks:
        s.close()
    print(f"memory: idle {idle / 1024:.1f} MiB (goal < 64), with {conns} idle keep-alive "
          f"connections {held / 1024:.1f} MiB (goal < 256)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200000)
    ap.add_argument("--clone-bytes", type=parse_size, default=parse_size("1g"))
    ap.add_argument("--clone-files", type=int, default=10000)
    ap.add_argument("--conns", type=int, default=1000)
    ap.add_argument("--only", default="usage,clone,api,memory")
    ap.add_argument("--workdir", default=None, help="where to put data (default: a temp dir)")
    ap.add_argument("--scan-threads", type=int, default=None,
                    help="sluiced's [sluice] scan-threads (default: its own default)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    root = tempfile.mkdtemp(prefix="sluice-bench-", dir=args.workdir)
    d = Sluiced(root, sluice=f"scan-threads = {args.scan_threads}" if args.scan_threads else "")
    try:
        if "memory" in only:
            bench_memory(d, args.conns)
        vfid = None
        if "usage" in only:
            vfid = bench_usage(d, args.files)
        if "api" in only:
            if vfid is None:
                vfid, path = d.new_vfolder()
                make_tree(path, 1000, 100)
            bench_api(d, vfid)
        if "clone" in only:
            scratch = os.path.join(root, "cp")
            os.makedirs(scratch)
            bench_clone(d, args.clone_bytes, args.clone_files, scratch)
    finally:
        d.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
