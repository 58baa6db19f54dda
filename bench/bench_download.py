#!/usr/bin/python3
"""Download benchmarks: sluiced's GET /download against nginx serving the same tree, same run.

  small   N files of S bytes fetched at random over C keep-alive connections (wrk + Lua)
          -> requests/s for both, and the ratio; also against a second nginx that exchanges as
          many bytes as Sluice does (Content-Disposition added, request paths padded to the
          length of Sluice's token URLs), which separates the servers' own work from the
          cost of the protocol's bigger messages to the client
  large   one big file fetched over and over on one connection -> GB/s for both, and the ratio

nginx runs with `sendfile on; access_log off; worker_processes N` (N = cores, as many as
sluiced's event loops) on a generated config (free port, logs in a temp dir), in the
foreground as a child of this script, like sluiced. sluiced serves the same files through
per-file download tokens minted ahead of time. Ratios > 1 mean Sluice is faster.

With --pin, each server gets CPU 0 alone (one nginx worker, one sluiced event loop; every
sluiced thread confined there) and wrk the other CPUs: the ratio then compares what each server
does with one core, without the luck of where the scheduler puts servers and client (steadier
from run to run; closer to a server whose clients are elsewhere).

Otherwise both servers, wrk and everything else share this machine's cores: on a small machine the
numbers are noisy and each server competes with wrk for CPU. So that they compete on equal
terms, the servers and wrk all run in this script's session: with the kernel's autogroup
scheduling, CPU is shared between sessions first, and a daemonised nginx (a session of its
own) would be scheduled differently from sluiced. Each server first gets a --warmup run that is
not counted (page cache, dentries, Sluice's token cache); then each measurement is run --rounds
times, alternating the servers, and every round is printed with the best of each.

With --baseline BIN_DIR, a second sluiced (another build, e.g. the last release's) serves the
same volume with the same secret, so the same token URLs; it runs in the same rounds as
"sluice-baseline", and the medians of this build over it are printed: a change's effect on
download speed, free of the drift between separate runs.

  /usr/bin/python3 bench/bench_download.py [--files 10000] [--file-size 4k] [--big 1g]
                                           [--conns 64] [--duration 10] [--rounds 3]
                                           [--warmup 3] [--only small,large] [--pin]
                                           [--baseline BIN_DIR]
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import requests

from benchlib import Sluiced, free_port, parse_size


def wait_port(port, proc, what, log):
    for _ in range(400):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.025)
    raise RuntimeError(f"{what} did not listen on {port}; see {log}")


def download_urls(s, vfid, relpaths):
    """Download URLs (path and query) for relpaths, minted in parallel."""
    def mint(chunk):
        with requests.Session() as session:
            return [s.call("POST", "/folder/file/download", session=session, volume="local",
                           vfid=vfid, relpath=rel)["token"] for rel in chunk]
    chunks = [relpaths[i::8] for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(mint, chunks))
    by_rel = {}
    for chunk, toks in zip(chunks, results):
        by_rel.update(zip(chunk, toks))
    return [f"/download?token={by_rel[rel]}" for rel in relpaths]


class Nginx:
    """nginx serving `docroot`; `location` replaces the default `location / { }` block."""

    def __init__(self, root, docroot, location="location / { }", workers=None, prefix=()):
        self.dir = tempfile.mkdtemp(prefix="nginx-", dir=root)
        os.makedirs(os.path.join(self.dir, "tmp"))
        self.port = free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        # vfolders are mode 0700: running as root, the workers must stay root to read them.
        user = "user root;" if os.geteuid() == 0 else ""
        with open(conf, "w") as f:
            f.write(f"""
{user}
daemon off;
worker_processes {workers or os.cpu_count()};
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  sendfile on;
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path {self.dir}/tmp/body;
  proxy_temp_path {self.dir}/tmp/proxy;
  fastcgi_temp_path {self.dir}/tmp/fastcgi;
  uwsgi_temp_path {self.dir}/tmp/uwsgi;
  scgi_temp_path {self.dir}/tmp/scgi;
  default_type application/octet-stream;
  server {{
    listen 127.0.0.1:{self.port};
    root {docroot};
    {location}
  }}
}}
""")
        self.log = os.path.join(self.dir, "error.log")
        # In the foreground, in this script's session (as sluiced is): see the module docstring.
        self.proc = subprocess.Popen([*prefix, "nginx", "-p", self.dir, "-e", self.log, "-c", conf])
        self.base = f"http://127.0.0.1:{self.port}"
        wait_port(self.port, self.proc, "nginx", self.log)

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)  # graceful shutdown of master and workers
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


LUA = """
local paths = {}
for line in io.lines(os.getenv("BENCH_PATHS")) do paths[#paths + 1] = line end
local n = #paths
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
request = function()
  return wrk.format("GET", paths[math.random(n)])
end
"""

UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


# --pin: (CPUs for the servers, CPUs for wrk), as taskset lists; None when not pinning.
PIN = None
# --baseline: the other build's sluiced, serving the same volume.
BASELINE = None


def pinned(cpus):
    return ["taskset", "-c", cpus] if cpus else []


def wrk(base, paths_file, lua, conns, threads, duration, path="/"):
    env = dict(os.environ, BENCH_PATHS=paths_file or "")
    cmd = [*pinned(PIN and PIN[1]), "wrk", f"-t{threads}", f"-c{conns}", f"-d{duration}s",
           "--timeout", "60s"]
    if lua:
        cmd += ["-s", lua]
    out = subprocess.run(cmd + [base + path], check=True, capture_output=True, text=True,
                         env=env).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    m = re.search(r"Transfer/sec:\s+([\d.]+)([KMGT]?B)", out)
    bps = float(m.group(1)) * UNITS[m.group(2)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    if errors or socket_errors:
        raise RuntimeError(f"wrk saw errors against {base}:\n{out}")
    return rps, bps


def make_small_tree(path, files, size, prefix=""):
    """`files` files of `size` bytes, 1000 a directory, below `prefix` ("" or "a/"): their
    paths."""
    rels = []
    data = os.urandom(size)
    for i in range(files):
        d = f"{prefix}d{i // 1000:03d}"
        if i % 1000 == 0:
            os.makedirs(os.path.join(path, d), exist_ok=True)
        rel = f"{d}/f{i:05d}"
        with open(os.path.join(path, rel), "wb") as f:
            f.write(data)
        rels.append(rel)
    return rels


def alternating(rounds, warmup, runs):
    """runs: {name: fn(duration)}; warms each up once (not counted), then calls them alternately
    `rounds` times. Returns {name: [result of each round]}."""
    for fn in runs.values():
        if warmup:
            fn(warmup)
    results = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            results[name].append(fn(None))
    return results


def rounds_text(results, scale, unit):
    return ", ".join(f"{r * scale:,.{0 if scale == 1 else 2}f}" for r in results) + f" {unit}"


# nginx answering with the header field Sluice's downloads carry on top of nginx's own
# (Content-Disposition with the file's name), so that both responses are about the same size.
# (CORS headers are sent only to requests with an Origin, and wrk sends none.)
SAME_BYTES_LOCATION = (
    "location ~ ^/.*/(?<name>[^/]+)$ {\n"
    "      add_header Content-Disposition "
    "\"attachment; filename=\\\"$name\\\"; filename*=UTF-8''$name\";\n"
    "    }")


def nginx_pin():
    return {"workers": 1, "prefix": pinned(PIN[0])} if PIN else {}


def bench_small(s, root, args):
    vfid, path = s.new_vfolder()
    t0 = time.perf_counter()
    rels = make_small_tree(path, args.files, args.file_size)
    urls = download_urls(s, vfid, rels)
    print(f"small: {args.files} files of {args.file_size} B made and tokens minted in "
          f"{time.perf_counter() - t0:.1f} s")
    # Both servers must give the same bytes for the same file.
    probe = requests.get(s.client + urls[0], timeout=30).content
    ngx = Nginx(root, path, **nginx_pin())
    ngx_same = Nginx(root, path, SAME_BYTES_LOCATION, **nginx_pin())
    try:
        assert requests.get(ngx.base + "/" + rels[0], timeout=30).content == probe
        r = requests.get(ngx_same.base + "/" + rels[0], timeout=30)
        assert r.content == probe and "Content-Disposition" in r.headers
        lua = os.path.join(root, "random.lua")
        with open(lua, "w") as f:
            f.write(LUA)
        paths = {"sluice": urls, "nginx": ["/" + r for r in rels],
                 # The query string pads each path to the length of the file's token URL.
                 "nginx-same-bytes": [f"/{r}?pad={'x' * max(0, len(u) - len(r) - 6)}"
                                      for r, u in zip(rels, urls)]}
        files = {}
        for name, lines in paths.items():
            files[name] = os.path.join(root, f"{name}-paths.txt")
            with open(files[name], "w") as f:
                f.write("\n".join(lines) + "\n")
        threads = min(os.cpu_count(), args.conns)
        bases = {"nginx": ngx.base, "nginx-same-bytes": ngx_same.base, "sluice": s.client}
        if BASELINE:
            files["sluice-baseline"] = files["sluice"]
            bases["sluice-baseline"] = BASELINE.client
        rps = alternating(args.rounds, args.warmup, {
            name: (lambda d, name=name: wrk(bases[name], files[name], lua, args.conns, threads,
                                            d or args.duration)[0])
            for name in bases
        })
    finally:
        ngx.stop()
        ngx_same.stop()
    for name in bases:
        print(f"small: {name} rounds: {rounds_text(rps[name], 1, 'req/s')}")
    sl, ng, same = max(rps["sluice"]), max(rps["nginx"]), max(rps["nginx-same-bytes"])
    print(f"small: {args.files} files of {args.file_size} B at random, {args.conns} connections "
          f"(wrk -t{threads}, {args.duration} s, best of {args.rounds}): sluice {sl:,.0f} req/s, "
          f"nginx {ng:,.0f} req/s, ratio {sl / ng:.2f}x; nginx with Sluice's message sizes "
          f"{same:,.0f} req/s, ratio {sl / same:.2f}x")
    med = {name: statistics.median(r) for name, r in rps.items()}
    print(f"small: medians: sluice/nginx {med['sluice'] / med['nginx']:.2f}x, "
          f"sluice/nginx-same-bytes {med['sluice'] / med['nginx-same-bytes']:.2f}x")
    if BASELINE:
        print(f"small: medians: sluice {med['sluice']:,.0f} req/s, baseline "
              f"{med['sluice-baseline']:,.0f} req/s, ratio "
              f"{med['sluice'] / med['sluice-baseline']:.2f}x")


def bench_large(s, root, args):
    vfid, path = s.new_vfolder()
    big = os.path.join(path, "big.bin")
    chunk = os.urandom(1 << 20)
    with open(big, "wb") as f:
        for _ in range(args.big // len(chunk)):
            f.write(chunk)
    subprocess.run(["cat", big], stdout=subprocess.DEVNULL, check=True)  # into the page cache
    url = download_urls(s, vfid, ["big.bin"])[0]
    ngx = Nginx(root, path, **nginx_pin())
    try:
        runs = {
            "nginx": lambda d: wrk(ngx.base, None, None, 1, 1, d or args.duration,
                                   "/big.bin")[1],
            "sluice": lambda d: wrk(s.client, None, None, 1, 1, d or args.duration, url)[1],
        }
        if BASELINE:
            runs["sluice-baseline"] = lambda d: wrk(BASELINE.client, None, None, 1, 1,
                                                    d or args.duration, url)[1]
        bps = alternating(args.rounds, args.warmup, runs)
    finally:
        ngx.stop()
    for name in bps:
        print(f"large: {name} rounds: {rounds_text(bps[name], 1e-9, 'GB/s')}")
    sl, ng = max(bps["sluice"]), max(bps["nginx"])
    print(f"large: one {args.big >> 20} MiB file over one connection (wrk -t1 -c1, "
          f"{args.duration} s, best of {args.rounds}): sluice {sl / 1e9:.2f} GB/s, "
          f"nginx {ng / 1e9:.2f} GB/s, ratio {sl / ng:.2f}x")
    med = {name: statistics.median(r) for name, r in bps.items()}
    print(f"large: medians: sluice/nginx {med['sluice'] / med['nginx']:.2f}x")
    if BASELINE:
        print(f"large: medians: sluice {med['sluice'] / 1e9:.2f} GB/s, baseline "
              f"{med['sluice-baseline'] / 1e9:.2f} GB/s, ratio "
              f"{med['sluice'] / med['sluice-baseline']:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--file-size", type=parse_size, default=parse_size("4k"))
    ap.add_argument("--big", type=parse_size, default=parse_size("1g"))
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="seconds of uncounted load first")
    ap.add_argument("--only", default="small,large")
    ap.add_argument("--workdir", default=None, help="where to put data (default: a temp dir)")
    ap.add_argument("--pin", action="store_true",
                    help="servers on CPU 0 with one event loop each, wrk on the other CPUs")
    ap.add_argument("--baseline", metavar="BIN_DIR",
                    help="also run the sluiced in BIN_DIR (another build) in the same rounds")
    args = ap.parse_args()
    global PIN, BASELINE
    if args.pin:
        if os.cpu_count() < 2:
            sys.exit("--pin needs at least 2 CPUs")
        PIN = ("0", f"1-{os.cpu_count() - 1}")
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (scripts/install-deps.sh installs it)")
    only = set(args.only.split(","))
    root = tempfile.mkdtemp(prefix="sluice-bench-dl-", dir=args.workdir)
    os.chmod(root, 0o755)
    if args.baseline and not os.access(os.path.join(args.baseline, "sluiced"), os.X_OK):
        sys.exit(f"no sluiced in {args.baseline}")
    s = Sluiced(root, storage_proxy="num-proc = 1" if PIN else "")
    try:
        if args.baseline:
            broot = os.path.join(root, "baseline")
            os.makedirs(broot)
            BASELINE = Sluiced(broot, storage_proxy="num-proc = 1" if PIN else "",
                               bin_dir=args.baseline, vol=s.vol)
        for server in (s, BASELINE):
            if PIN and server:
                # Every thread sluiced has started (loop, pools); later ones inherit the mask.
                subprocess.run(["taskset", "-a", "-p", "-c", PIN[0], str(server.proc.pid)],
                               check=True, capture_output=True)
        if PIN:
            print(f"machine: {os.cpu_count()} cores; servers on CPU {PIN[0]} (one event loop "
                  f"each), wrk on CPUs {PIN[1]}")
        else:
            print(f"machine: {os.cpu_count()} cores shared by sluiced/nginx and wrk")
        if "small" in only:
            bench_small(s, root, args)
        if "large" in only:
            bench_large(s, root, args)
    finally:
        if BASELINE:
            BASELINE.stop()
        s.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
