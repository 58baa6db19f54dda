#!/usr/bin/python3
"""How far writes made directly on a ceph-fuse mount overshoot a `ceph.quota.max_bytes` limit,
and how long `ceph.dir.rbytes` lags behind writes.

CephFS enforces quotas in the client, against the recursive byte count (rbytes) the MDS last
told it for the quota's directory plus the growth of the file being written; other files'
growth counts only once the MDS has propagated it. Each pattern gets a fresh directory with
the limit, writes into nested subdirectories below it (scope/vfolder/dNN/file, like a Sluice
volume) until EDQUOT, and reports:

  written   bytes the writers got acknowledged (write() returned them), summed
  over      written - limit (negative: stopped before the limit)
  t_edquot  time from the start to the first EDQUOT (and to the last writer's EDQUOT)
  past      time from the moment the acknowledged total crossed the limit to the first EDQUOT
  rbytes    the directory's ceph.dir.rbytes once settled (what CephFS counts in the end)

Patterns: files4k (one writer, 4 KiB files, open/write/close), files4k-fsync (the same with
fsync per file), append1m (one writer, 1 MiB appends to one file), parallel4 (4 writer
processes, 1 MiB appends, each its own file and subdirectory), two-mounts (2 writers, 1 MiB
appends, each on its own ceph-fuse mount = its own CephFS client).

Then the rbytes lag: a file of --lag-bytes is written three directories down and fsynced (or
only closed); the time until ceph.dir.rbytes of its parent, of the directory three levels up,
and of the file system root reflect it.

The cluster is brought up and torn down here with tests/tools/ceph-cluster.sh (about 10 s).

  /usr/bin/python3 bench/bench_ceph_overshoot.py [--limit 64m] [--cluster-size 2g]
      [--patterns files4k,files4k-fsync,append1m,parallel4,two-mounts] [--runs 1]
      [--lag-runs 5] [--lag-bytes 4m] [--timeout 150] [--ceph-conf TEXT]
"""
import argparse
import errno
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import REPO, parse_size

TOOL = os.path.join(REPO, "tests", "tools", "ceph-cluster.sh")
MiB = 1 << 20
PATTERNS = ("files4k", "files4k-fsync", "append1m", "parallel4", "two-mounts")


# --------------------------------------------------------------------------- the cluster


class Cluster:
    def __init__(self, size, extra_conf):
        subprocess.run([TOOL, "sweep"], check=False, capture_output=True, timeout=120)
        self.dir = tempfile.mkdtemp(prefix=f"sluice-ceph-bench-{os.getpid()}-", dir="/tmp")
        self.mounts = []
        env = {**os.environ, "SLUICE_CEPH_OWNER": str(os.getpid())}
        if extra_conf:
            env["SLUICE_CEPH_CONF"] = extra_conf
        t0 = time.monotonic()
        r = subprocess.run([TOOL, "up", self.dir, str(size)], capture_output=True, text=True,
                           env=env, timeout=180)
        if r.returncode != 0:
            subprocess.run([TOOL, "down", self.dir], check=False, timeout=120)
            raise RuntimeError(f"ceph-cluster.sh up failed ({r.returncode}):\n{r.stderr}")
        self.mnt = r.stdout.strip().splitlines()[-1]
        print(f"cluster: up in {time.monotonic() - t0:.1f} s, mounted on {self.mnt}")

    def second_mount(self):
        """Another ceph-fuse client of the same file system (down unmounts it with the rest)."""
        mnt = os.path.join(self.dir, "mnt2")
        os.mkdir(mnt)
        subprocess.run(["timeout", "60", "ceph-fuse", "-c", os.path.join(self.dir, "ceph.conf"),
                        "--id", "bench2", mnt], check=True, capture_output=True)
        self.mounts.append(mnt)
        return mnt

    def down(self):
        for m in self.mounts:
            subprocess.run(["timeout", "10", "umount", m], check=False, capture_output=True)
        subprocess.run([TOOL, "down", self.dir], check=False, timeout=120)


def rbytes(path):
    return int(os.getxattr(path, "ceph.dir.rbytes"))


# --------------------------------------------------------------------------- writers


def writer(kind, root, idx, cap, deadline, fsync, out):
    """Writes below root until EDQUOT, cap bytes or the deadline; sends (samples, error) on out.

    samples: [(monotonic time when a write returned, bytes it wrote)]; edquot: the time of the
    EDQUOT or None; other: any other error, as text."""
    samples = []
    err = other = None
    try:
        d = os.path.join(root, f"d{idx:02d}")
        os.makedirs(d, exist_ok=True)
        written = 0
        if kind == "files4k":
            buf = b"x" * 4096
            n = 0
            while written < cap and time.monotonic() < deadline:
                if n % 1000 == 0:
                    sub = os.path.join(d, f"s{n // 1000:04d}")
                    os.makedirs(sub, exist_ok=True)
                fd = os.open(os.path.join(sub, f"f{n:06d}"), os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    w = os.write(fd, buf)
                    samples.append((time.monotonic(), w))
                    written += w
                    if fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                n += 1
        else:  # 1 MiB appends to one file
            buf = b"y" * MiB
            fd = os.open(os.path.join(d, "big"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                while written < cap and time.monotonic() < deadline:
                    w = os.write(fd, buf)
                    samples.append((time.monotonic(), w))
                    written += w
                    if fsync:
                        os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as e:
        if e.errno == errno.EDQUOT:
            err = time.monotonic()
        else:
            other = repr(e)
    except Exception as e:  # noqa: BLE001  reported by the parent
        other = repr(e)
    out.send((samples, err, other))
    out.close()


def run_pattern(cluster, name, limit, timeout, run):
    base = os.path.join(cluster.mnt, f"{name}-{run}")
    os.mkdir(base)
    os.setxattr(base, "ceph.quota.max_bytes", str(limit).encode())
    vf = os.path.join(base, "vfolder")
    os.mkdir(vf)
    nwriters = {"parallel4": 4, "two-mounts": 2}.get(name, 1)
    kind = "files4k" if name.startswith("files4k") else "append"
    fsync = name.endswith("-fsync")
    roots = [vf] * nwriters
    if name == "two-mounts":
        m2 = cluster.mounts[0] if cluster.mounts else cluster.second_mount()
        roots[1] = os.path.join(m2, os.path.relpath(vf, cluster.mnt))
    # No writer stops by itself before EDQUOT unless the overshoot is absurd.
    cap = 4 * limit + 256 * MiB
    ctx = multiprocessing.get_context("fork")
    t0 = time.monotonic()
    deadline = t0 + timeout
    procs, pipes = [], []
    for i, root in enumerate(roots):
        rd, wr = ctx.Pipe(duplex=False)
        p = ctx.Process(target=writer, args=(kind, root, i, cap, deadline, fsync, wr))
        p.start()
        wr.close()
        procs.append(p)
        pipes.append(rd)
    results = [rd.recv() for rd in pipes]
    for p in procs:
        p.join(30)
    for r in results:
        if r[2]:
            raise RuntimeError(f"{name}: a writer failed: {r[2]}")
    samples = sorted(s for r in results for s in r[0])
    errs = [r[1] for r in results if r[1] is not None]
    written = sum(w for _, w in samples)
    crossed, total = None, 0
    for t, w in samples:
        total += w
        if total > limit:
            crossed = t
            break
    t_end = samples[-1][0] if samples else t0
    rate = written / max(t_end - t0, 1e-9)
    # Settle: until rbytes of the quota directory counts everything written (up to 30 s).
    t_done = time.monotonic()
    settled = None
    while time.monotonic() - t_done < 30:
        last = rbytes(base)
        if last == written:
            settled = time.monotonic() - t_done
            break
        time.sleep(0.1)
    r = {
        "name": name, "written": written, "over": written - limit, "rate": rate,
        "first": (min(errs) - t0) if errs else None,
        "last": (max(errs) - t0) if len(errs) == nwriters else None,
        "past": (min(errs) - crossed) if errs and crossed else None,
        "edquots": len(errs), "writers": nwriters, "rbytes": last, "settled": settled,
    }
    shutil.rmtree(base, ignore_errors=True)
    return r


def report_pattern(r, limit):
    mib = lambda b: f"{b / MiB:.1f} MiB"  # noqa: E731
    if not r["edquots"]:
        why = ("timed out below the limit (raise --timeout)" if r["written"] <= limit else
               f"NO EDQUOT at {r['written'] / limit:.1f}x the limit")
        print(f"  {r['name']:14s} {why}: wrote {mib(r['written'])} at {mib(r['rate'])}/s")
        return
    over = r["over"]
    past = f"{r['past']:.2f} s past the limit" if r["past"] is not None else "before the limit"
    last = f", last writer {r['last']:.2f} s" if r["last"] is not None and r["writers"] > 1 else ""
    over_s = f" = {over / r['rate']:.2f} s of writing" if over > 0 else ""
    print(f"  {r['name']:14s} over {'+' if over >= 0 else ''}{mib(over)} "
          f"({over / limit * 100:+.1f}%{over_s}); EDQUOT at {r['first']:.2f} s{last} "
          f"({past}); {mib(r['rate'])}/s; " + (
              f"rbytes = written {r['settled']:.1f} s after the writers stopped"
              if r["settled"] is not None else
              f"rbytes {mib(r['rbytes'])} != written 30 s after the writers stopped"))


# --------------------------------------------------------------------------- rbytes lag


def measure_lag(cluster, nbytes, fsync, run, timeout=60):
    """Seconds until rbytes of the file's parent, of the directory 3 levels up, and of the
    root reflect a file of nbytes written (and fsynced or only closed) 3 levels down."""
    top = os.path.join(cluster.mnt, f"lag-{'fsync' if fsync else 'close'}-{run}")
    parent = os.path.join(top, "a", "b", "c")
    os.makedirs(parent)
    time.sleep(2)  # let the mkdirs propagate first
    targets = {"parent": parent, "3 up": top, "root": cluster.mnt}
    before = {k: rbytes(p) for k, p in targets.items()}
    fd = os.open(os.path.join(parent, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    buf = b"z" * MiB
    for _ in range(nbytes // MiB):
        os.write(fd, buf)
    if fsync:
        os.fsync(fd)
    os.close(fd)
    t0 = time.monotonic()
    lag = {}
    while len(lag) < len(targets) and time.monotonic() - t0 < timeout:
        for k, p in targets.items():
            if k not in lag and rbytes(p) >= before[k] + nbytes:
                lag[k] = time.monotonic() - t0
        time.sleep(0.02)
    shutil.rmtree(top, ignore_errors=True)
    return lag


def report_lag(name, runs, keys=("parent", "3 up", "root")):
    parts = []
    for k in keys:
        v = [r[k] for r in runs if k in r]
        missing = len(runs) - len(v)
        if not v:
            parts.append(f"{k}: never (>{60} s)")
            continue
        parts.append(f"{k} median {statistics.median(v):.2f} s (min {min(v):.2f}, "
                     f"max {max(v):.2f})" + (f", {missing} never" if missing else ""))
    print(f"  {name}: " + "; ".join(parts))


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=parse_size, default=parse_size("64m"))
    ap.add_argument("--cluster-size", type=parse_size, default=parse_size("2g"),
                    help="memstore size of the OSD (RAM)")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--runs", type=int, default=1, help="runs of each pattern")
    ap.add_argument("--lag-runs", type=int, default=5)
    ap.add_argument("--lag-bytes", type=parse_size, default=parse_size("4m"))
    ap.add_argument("--timeout", type=float, default=150,
                    help="seconds per pattern run (4 KiB files go at ~200-600 files/s)")
    ap.add_argument("--ceph-conf", default="",
                    help="extra ceph.conf lines ($SLUICE_CEPH_CONF of the tool), e.g. "
                         "$'[mds]\\nmds scatter nudge interval = 5' for the Ceph default")
    args = ap.parse_args()
    patterns = [p for p in args.patterns.split(",") if p]
    for p in patterns:
        if p not in PATTERNS:
            ap.error(f"unknown pattern {p!r} (known: {', '.join(PATTERNS)})")
    if os.geteuid() != 0:
        ap.error("needs root (FUSE mounts)")

    cluster = Cluster(args.cluster_size, args.ceph_conf)
    try:
        print(f"quota overshoot, limit {args.limit / MiB:.0f} MiB (writes on the ceph-fuse mount):")
        for run in range(args.runs):
            for p in patterns:
                report_pattern(run_pattern(cluster, p, args.limit, args.timeout, run), args.limit)
        if args.lag_runs:
            print(f"ceph.dir.rbytes lag after writing {args.lag_bytes / MiB:.0f} MiB 3 directories "
                  f"down ({args.lag_runs} runs):")
            for fsync in (True, False):
                runs = [measure_lag(cluster, args.lag_bytes, fsync, i)
                        for i in range(args.lag_runs)]
                report_lag("after fsync+close" if fsync else "after close (no fsync)", runs)
    finally:
        cluster.down()


if __name__ == "__main__":
    sys.exit(main())
