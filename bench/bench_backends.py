#!/usr/bin/python3
"""Backend benchmarks: Sluice's usage and clone on real file systems against the tools that do
the same job, on the same data in the same run.

  usage  GET /folder/usage of a vfolder of N files of 100 bytes (vfs, btrfs, cephfs)
         vs `du -s --apparent-size` and `du -s` over the same tree (warm caches; du runs with
         -B1 so that its figure can be compared, which does not change its work).
           vfs     the first request (no figure kept yet: it walks, 1 sample), the steady state
                   (the kept figure) and fresh=true (forces a walk)
           btrfs   qgroup counters read after a commit, inodes counted in the subvolume's B-tree
           cephfs  ceph.dir.rbytes / rentries, timed once they have settled; the tree is made
                   through ceph-fuse, within --ceph-make-budget seconds (fewer files if slower)
  clone  POST /folder/clone + polling GET /bgtask of S bytes in F files (btrfs, xfs)
         vs `cp -a --reflink=never` (a real copy, as Backend.AI's Python original does) and
         `cp -a` (reflinks where it can), same source tree, same file system.
           btrfs   into the source's quota scope (a snapshot) and into another scope (reflinks)
           xfs     into the source's quota scope (reflinks)
         Contenders alternate (the order rotates each round), `sync` before each run, every copy
         is deleted after its run; best and median of --runs.

Prints one line per measurement with the ratio peer time / Sluice time (> 1: Sluice is faster).
The file systems are made here and always torn down: btrfs (qgroups on) and XFS (reflink=1) on
sparse loop images (tests/tools/btrfs-loop.sh, xfs-loop.sh), CephFS as a single-node memstore
cluster mounted with ceph-fuse (tests/tools/ceph-cluster.sh); vfs on an ext4 loop image made with
the same loopfs.sh (removing 200,000 files from a disk mounted with `discard`, as this machine's
root is, takes minutes; an image goes at once). Needs root.

  /usr/bin/python3 bench/bench_backends.py [--only usage,clone] [--backends vfs,btrfs,cephfs,xfs]
      [--files 200000] [--clone-bytes 1g] [--clone-files 10000] [--runs 3]
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from benchlib import REPO, Sluiced, parse_size

TOOLS = os.path.join(REPO, "tests", "tools")
USAGE_BACKENDS = ("vfs", "btrfs", "cephfs")
CLONE_BACKENDS = ("btrfs", "xfs")
VOLUME = {"vfs": "vfs", "btrfs": "bt", "cephfs": "ceph", "xfs": "xf"}  # sluiced volume names
# An ext4 loop image for vfs: tests/tools' loopfs.sh with ext4 (one inode per 8 KiB; inode
# tables written at mkfs, not by a background thread during the measurements).
EXT4_LOOP = """set -euo pipefail
NAME=ext4 DEFAULT_SIZE=2G OWNER=${SLUICE_EXT4_OWNER:-$PPID}
source "$LOOPFS"
make_fs() { mkfs.ext4 -q -F -i 8192 -E lazy_itable_init=0,lazy_journal_init=0 "$1"; }
mount_fs() { mount -t ext4 "$1" "$2"; }
loopfs_main "$@"
"""
DU = (("du -s --apparent-size", ["--apparent-size"]), ("du -s", []))


def report(name, sluice, peer_name, peer):
    """One result line; `sluice` and `peer` are lists of seconds (best first, median after)."""
    s, p = min(sluice), min(peer)
    line = (f"{name}: sluice {s * 1000:.1f} ms, {peer_name} {p * 1000:.1f} ms, "
            f"ratio {p / s:.2f}x ({'faster' if p > s else 'slower'})")
    if len(sluice) > 1 and len(peer) > 1:
        sm, pm = statistics.median(sluice), statistics.median(peer)
        line += f"; medians {sm * 1000:.1f} / {pm * 1000:.1f} ms, ratio {pm / sm:.2f}x"
    print(line, flush=True)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def sync():
    # Twice: the loop images' writes land in the host file system's page cache on the first.
    subprocess.run(["sync"], check=True)
    subprocess.run(["sync"], check=True)


# --------------------------------------------------------------------------- file systems


class FileSystems:
    """File systems brought up for this run; down() removes all of them (idempotent)."""

    def __init__(self):
        self.made = []  # (tool command, env, dir)

    def up(self, name, size):
        kind = {"cephfs": "ceph", "vfs": "ext4"}.get(name, name)
        if name == "vfs":
            tool = ["bash", "-c", EXT4_LOOP, "ext4-loop"]
        elif name == "cephfs":
            tool = [os.path.join(TOOLS, "ceph-cluster.sh")]
        else:
            tool = [os.path.join(TOOLS, f"{name}-loop.sh")]
        env = {**os.environ, f"SLUICE_{kind.upper()}_OWNER": str(os.getpid()),
               "LOOPFS": os.path.join(TOOLS, "loopfs.sh")}
        subprocess.run(tool + ["sweep"], check=False, capture_output=True, env=env, timeout=300)
        # /tmp/sluice-<kind>-*: the tool's sweep removes it should this process die.
        d = tempfile.mkdtemp(prefix=f"sluice-{kind}-bench-{os.getpid()}-", dir="/tmp")
        self.made.append((tool, env, d))
        t, r = timed(lambda: subprocess.run(tool + ["up", d, size], capture_output=True,
                                            text=True, env=env, timeout=300))
        if r.returncode != 0:
            raise RuntimeError(f"{kind} up failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        mnt = r.stdout.strip().splitlines()[-1]
        print(f"setup: {name} ({size}) up in {t:.1f} s on {mnt}", flush=True)
        return mnt

    def down(self):
        while self.made:
            tool, env, d = self.made.pop()
            subprocess.run(tool + ["down", d], check=False, env=env, timeout=300)


# --------------------------------------------------------------------------- trees


def make_tree(path, files, size, per_dir, budget=None):
    """`files` files of `size` bytes in directories of `per_dir`; stops early once `budget`
    seconds have passed. Returns (files made, directories made)."""
    data = os.urandom(size)
    deadline = time.monotonic() + budget if budget else None
    dirs = 0
    for i in range(files):
        if i % per_dir == 0:
            if deadline and time.monotonic() > deadline:
                return i, dirs
            d = os.path.join(path, f"d{i // per_dir:05d}")
            os.mkdir(d)
            dirs += 1
        with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
            f.write(data)
    return files, dirs


def tree_size(path):
    """(files, bytes) below path (regular files only), without following symlinks."""
    n = b = 0
    stack = [path]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    n += 1
                    b += e.stat(follow_symlinks=False).st_size
    return n, b


def new_scope(d, vol):
    qsid = f"user:{uuid.uuid4().hex}"
    d.call("POST", "/quota-scope", volume=vol, qsid=qsid)  # no limit
    return qsid


def wait_rstats(path, want_bytes, want_entries, timeout=600):
    """Waits until CephFS's recursive statistics of `path` show the whole tree."""
    t0 = time.monotonic()
    while True:
        rb = int(os.getxattr(path, "ceph.dir.rbytes"))
        re_ = int(os.getxattr(path, "ceph.dir.rentries"))
        if rb == want_bytes and re_ == want_entries:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"rstats of {path} did not settle: rbytes {rb} (want {want_bytes}),"
                               f" rentries {re_} (want {want_entries})")
        time.sleep(0.5)


# --------------------------------------------------------------------------- usage


def bench_usage(d, backend, files, runs, budget):
    vol = VOLUME[backend]
    vfid, path = d.new_vfolder(vol, new_scope(d, vol))
    t, (n, dirs) = timed(lambda: make_tree(path, files, 100, 1000,
                                           budget if backend == "cephfs" else None))
    note = "" if n == files else f" (stopped at the {budget:.0f} s budget: fewer files)"
    print(f"usage {backend}: made {n} files of 100 bytes in {dirs} directories in {t:.1f} s"
          f"{note}", flush=True)
    if backend == "cephfs":
        t = wait_rstats(path, n * 100, n + dirs + 1)  # rentries counts the directory itself
        print(f"usage {backend}: ceph.dir.rbytes/rentries settled {t:.1f} s after the last file",
              flush=True)
    label = f"usage {backend} {n} files"

    def sluice(fresh=False):
        body = {"fresh": True} if fresh else {}
        return d.call("GET", "/folder/usage", volume=vol, vfid=vfid, **body)

    def du(args):
        out = subprocess.run(["du", "-s", "-B1", *args, path], check=True, capture_output=True,
                             text=True).stdout
        return int(out.split()[0])

    # Warm the caches for both sides alike (du walks first; vfs's first request must stay the
    # first, so Sluice's warm-up there is that timed request).
    du_figures = {name: du(args) for name, args in DU}
    if backend == "vfs":
        first, u = timed(sluice)
    else:
        u = sluice()
    print(f"usage {backend}: sluice file_count {u['file_count']} used_bytes {u['used_bytes']}"
          f" (tree: {n + dirs} entries, {n * 100} bytes in files); "
          + ", ".join(f"{k} {v}" for k, v in du_figures.items()), flush=True)
    if u["file_count"] != n + dirs:
        print(f"usage {backend}: WARNING: file_count {u['file_count']} != {n + dirs}", flush=True)

    # Alternate Sluice and du within each round (vfs: the walking fresh=true requests).
    cases = {"fresh": lambda: sluice(True)} if backend == "vfs" else {"sluice": sluice}
    cases.update({name: (lambda a=args: du(a)) for name, args in DU})
    times = {k: [] for k in cases}
    for _ in range(runs):
        for k, fn in cases.items():
            times[k].append(timed(fn)[0])
    if backend == "vfs":
        # The steady state answers the kept figure (fresh=true just replaced it): many samples.
        kept = sluice()["measured_at"]
        steady = [timed(sluice)[0] for _ in range(20)]
        if sluice()["measured_at"] != kept:
            print("usage vfs: WARNING: the steady-state requests re-measured the figure",
                  flush=True)
    for peer, _ in DU:
        if backend == "vfs":
            report(f"{label}, first request (walks, 1 sample)", [first], peer, times[peer])
            report(f"{label}, steady state (kept figure, 20 samples)", steady, peer, times[peer])
            report(f"{label}, fresh=true (walks, {runs} runs)", times["fresh"], peer, times[peer])
        else:
            report(f"{label} ({runs} runs, alternating)", times["sluice"], peer, times[peer])


# --------------------------------------------------------------------------- clone


def bench_clone(d, backend, mnt, total, files, runs):
    vol = VOLUME[backend]
    scope = new_scope(d, vol)
    src, path = d.new_vfolder(vol, scope)
    per_file = max(1, total // files)
    t, _ = timed(lambda: make_tree(path, files, per_file, 500))
    sync()
    want = (files, files * per_file)
    print(f"clone {backend}: made {files} files of {per_file} bytes in {t:.1f} s", flush=True)
    scratch = os.path.join(mnt, "cp-bench")
    os.mkdir(scratch)

    def settle():
        """After a delete: let the file system finish dropping the data before the next run."""
        if backend == "btrfs":
            # Deleted subvolumes are dropped by the cleaner in the background, and their root
            # items go at a commit: commit until none is left (else every 30 s).
            deadline = time.monotonic() + 120
            while subprocess.run(["btrfs", "subvolume", "list", "-d", mnt], check=True,
                                 capture_output=True).stdout.strip():
                if time.monotonic() > deadline:
                    raise RuntimeError("deleted subvolumes were not cleaned up in 120 s")
                subprocess.run(["btrfs", "filesystem", "sync", mnt], check=True)
                time.sleep(0.05)
        sync()

    def sluice(qsid):
        def run():
            dst = f"{qsid}/{uuid.uuid4().hex}"
            t = d.call("POST", "/folder/clone", src_volume=vol, src_vfid=src, dst_volume=vol,
                       dst_vfid=dst)
            d.wait_task(t["bgtask_id"], poll=0.002)
            dpath = d.call("GET", "/folder/mount", volume=vol, vfid=dst)["path"]
            return dpath, lambda: d.wait_task(
                d.call("POST", "/folder/delete", volume=vol, vfid=dst)["bgtask_id"])
        return run

    def cp(*flags):
        def run():
            dst = os.path.join(scratch, uuid.uuid4().hex)
            subprocess.run(["cp", "-a", *flags, path, dst], check=True)
            return dst, lambda: subprocess.run(["rm", "-rf", dst], check=True)
        return run

    ours = {"sluice same scope" + (" (snapshot)" if backend == "btrfs" else " (reflink)"):
            sluice(scope)}
    if backend == "btrfs":
        ours["sluice other scope (reflink)"] = sluice(new_scope(d, vol))
    peers = {"cp -a --reflink=never": cp("--reflink=never"), "cp -a": cp()}
    cases = {**ours, **peers}
    times = {k: [] for k in cases}
    space = {k: [] for k in cases}
    names = list(cases)
    for r in range(runs):
        for k in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
            settle()
            before = os.statvfs(mnt)
            t, (dst, remove) = timed(cases[k])
            times[k].append(t)
            sync()
            after = os.statvfs(mnt)
            space[k].append((before.f_bfree - after.f_bfree) * after.f_frsize)
            got = tree_size(dst)
            if got != want:
                raise RuntimeError(f"{k}: copy holds {got} (files, bytes), want {want}")
            remove()
    print(f"clone {backend}: space taken per copy (median, after sync): "
          + ", ".join(f"{k} {statistics.median(v) / 2**20:.1f} MiB" for k, v in space.items()),
          flush=True)
    label = f"clone {backend} {total >> 20} MiB in {files} files"
    for name in ours:
        for peer in peers:
            report(f"{label}, {name} ({runs} runs, alternating, synced)", times[name], peer,
                   times[peer])


# --------------------------------------------------------------------------- main


def interrupt(signum, frame):
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="usage,clone", help="usage,clone (default: both)")
    ap.add_argument("--backends", default="vfs,btrfs,cephfs,xfs",
                    help="vfs,btrfs,cephfs,xfs (default: all; usage runs on vfs, btrfs and "
                         "cephfs, clone on btrfs and xfs)")
    ap.add_argument("--files", type=int, default=200000, help="files for usage (default 200000)")
    ap.add_argument("--ceph-make-budget", type=float, default=300,
                    help="seconds to spend making the usage tree on CephFS; fewer files if it "
                         "takes longer (default 300)")
    ap.add_argument("--clone-bytes", type=parse_size, default=parse_size("1g"))
    ap.add_argument("--clone-files", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=3, help="timed runs per contender (default 3)")
    ap.add_argument("--loop-size", default="8G",
                    help="sparse ext4 (vfs), btrfs and XFS images (default 8G)")
    ap.add_argument("--ceph-size", default="4G", help="the memstore OSD's RAM (default 4G)")
    ap.add_argument("--workdir", default=None, help="sluiced's state (default /tmp)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    backends = args.backends.split(",")
    if not only <= {"usage", "clone"} or not set(backends) <= set(VOLUME):
        ap.error("unknown benchmark or backend")
    if os.geteuid() != 0 and set(backends) - {"vfs"}:
        ap.error("btrfs, xfs and cephfs need root (loop devices, mounts)")
    usage = [b for b in backends if b in USAGE_BACKENDS] if "usage" in only else []
    clone = [b for b in backends if b in CLONE_BACKENDS] if "clone" in only else []

    signal.signal(signal.SIGTERM, interrupt)  # tear down on TERM as on Ctrl-C
    fs = FileSystems()
    d = None
    root = tempfile.mkdtemp(prefix="sluice-bench-backends-", dir=args.workdir)
    try:
        mounts, toml = {}, ""
        for b in dict.fromkeys(usage + clone):
            mounts[b] = fs.up(b, args.ceph_size if b == "cephfs" else args.loop_size)
            path = mounts[b]
            if b in ("cephfs", "vfs"):  # a directory of the file system (ext4: lost+found)
                path = os.path.join(path, "vol")
                os.mkdir(path)
            toml += f'[volume.{VOLUME[b]}]\nbackend = "{b}"\npath = "{path}"\n'
        d = Sluiced(root, volumes=toml)
        for b in usage:
            bench_usage(d, b, args.files, args.runs, args.ceph_make_budget)
        for b in clone:
            bench_clone(d, b, mounts[b], args.clone_bytes, args.clone_files, args.runs)
    except KeyboardInterrupt:
        print("interrupted; tearing down", file=sys.stderr)
        return 130
    finally:
        # No second interrupt may leave mounts behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if d is not None:
            try:
                d.stop()
            except Exception:
                d.proc.kill()
                d.proc.wait()
            with open(d.log, errors="replace") as f:  # warnings and errors only
                lines = f.read().splitlines()
            if lines:
                print(f"sluiced log ({len(lines)} lines, last 20):", *lines[-20:], sep="\n  ",
                      file=sys.stderr)
        fs.down()
        subprocess.run(["rm", "-rf", "--one-file-system", root], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
