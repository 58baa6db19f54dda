#!/usr/bin/python3
"""Dataset epochs through an s3 volume behind the SSD read cache, against its origin read
directly and against Sluice serving the same files from a local vfs volume, in the same run.

  epochs  N objects of S bytes, every one read once per epoch with `sluice s3 bench` (one
          listing, then C parallel GETs over keep-alive connections; the bytes are counted and
          dropped, as a data loader does):
            origin  the origin's S3 API read directly
            epoch1  Sluice's S3 API on a bucket of the s3 volume, the cache empty
            epoch2  the same again, the cache warm
            local   Sluice's S3 API on a bucket of a local vfs volume holding the same files
          -> objects/s and the ratios the issue asks for (epoch1/rgw, epoch2/rgw, epoch2/local)

  restart the proxy restarted after epoch 2, then epoch 3: the cache's hit ratio (from
          GET /volume/cache) in epoch 3 against epoch 2 (the issue: >= 95% of it)

  fuse    with --fuse (RGW origin): the same objects read twice through `rclone mount
          --vfs-cache-mode full` and `s3fs -o use_cache` on the same RGW bucket (C parallel
          readers), against Sluice's warm epoch -> epoch2 / the tool's warm re-read

  model   with --model SIZE: one file read by R parallel ranged GETs (curl) through the cache
          cold and warm, and from the local volume, against one plain GET from the origin
          -> GB/s and the ratios the issue asks for (cold/one origin GET, warm/local)

The origin is a Ceph RGW (tests/tools/ceph-cluster.sh: memstore OSD, beast frontend), or with
--origin sluice a second sluiced's S3 API (no Ceph: quicker, but not the issue's peer). The
client (libcurl, C++) shares the two cores with the servers; it costs per object what it costs
on every side.

  /usr/bin/python3 bench/bench_cache.py [--objects 10000] [--object-size 100k] [--conns 32]
      [--origin rgw|sluice] [--block 4m] [--io-threads 8] [--model 2g] [--readers 8] [--fuse]
      [--cache-disk xfs|dir]
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
import uuid

from bench_s3 import Rgw, S3Sluiced, SluiceOrigin, make_objects, remote_volume, s3_client
from benchlib import BIN, parse_size

SLUICE = os.path.join(BIN, "sluice")

BUCKET = "origin"


def cpu_seconds(pids):
    """CPU time (user + system) the processes `pids` have used so far, every thread counted;
    processes that are gone count nothing."""
    total = 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def pids_naming(text):
    """Pids of the processes whose command line contains `text` (the origin's daemons)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        out.append(int(pid))
            except OSError:
                continue
    return out


class CacheDisk:
    """A file system of its own for the cache, as a node's NVMe would be: XFS on a loop device
    over a sparse image, with direct I/O so that the image's pages are not cached twice.
    This machine's root file system (ext4 without a journal) spends about 600 us allocating
    each new inode (it reads the inode table to skip recently deleted ones), ten times what XFS
    or a journaled ext4 spends: a cache directory there measures that, not the cache."""

    def __init__(self, root, size):
        self.image = os.path.join(root, "cache.img")
        self.path = os.path.join(root, "cache-fs")
        self.dev = None
        os.makedirs(self.path)
        with open(self.image, "wb") as f:
            f.truncate(size)
        self.dev = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", self.image],
                                  check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["mkfs.xfs", "-q", "-f", self.dev], check=True)
        subprocess.run(["mount", self.dev, self.path], check=True)

    def close(self):
        if self.dev:
            subprocess.run(["umount", self.path], check=False)
            subprocess.run(["losetup", "-d", self.dev], check=False)
            self.dev = None


def epoch(url, ak, sk, bucket, conns, want):
    """Objects/s reading every object of `bucket` once with `sluice s3 bench` (one listing, then
    `conns` parallel GETs over kept-alive connections, libcurl; the bytes are counted and
    dropped, as a data loader does, so that the client's own disk is not what is measured)."""
    env = {"PATH": os.environ["PATH"], "AWS_ACCESS_KEY_ID": ak, "AWS_SECRET_ACCESS_KEY": sk}
    out = subprocess.run([SLUICE, "--json", "s3", "bench", f"s3://{bucket}/", "--s3-endpoint",
                          url, "-j", str(conns)],
                         env=env, check=True, timeout=3600, capture_output=True, text=True).stdout
    e = json.loads(out)[0]
    if (e["objects"], e["bytes"]) != want:
        raise RuntimeError(f"{bucket}: {e['objects']} objects, {e['bytes']} B; expected {want}")
    return e["objects_per_second"]


def read_tree(root, keys, conns, want):
    """Objects/s reading every file `keys` names under `root` (a FUSE mount) with `conns`
    threads; the bytes are counted and dropped."""
    def one(k):
        with open(os.path.join(root, k), "rb", buffering=0) as f:
            n = 0
            while True:
                b = f.read(1 << 20)
                if not b:
                    return n
                n += len(b)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(conns) as ex:
        got = sum(ex.map(one, keys))
    took = time.perf_counter() - t0
    if got != want[1]:
        raise RuntimeError(f"{root}: {got} bytes read; expected {want[1]}")
    return len(keys) / took


def fuse_epochs(kind, origin, bucket, keys, conns, want, root):
    """Two reads of every object through `rclone mount --vfs-cache-mode full` or `s3fs -o
    use_cache` of `bucket` on the origin: (cold, warm) objects/s."""
    mnt = tempfile.mkdtemp(prefix=f"sluice-{kind}-", dir="/tmp")
    cache = os.path.join(root, f"{kind}-cache")
    os.makedirs(cache)
    if kind == "rclone":
        conf = os.path.join(root, "rclone.conf")
        with open(conf, "w") as f:
            f.write(f"[o]\ntype = s3\nprovider = Ceph\nendpoint = {origin.s3_url}\n"
                    f"access_key_id = {origin.ak}\nsecret_access_key = {origin.sk}\n")
        cmd = ["rclone", "mount", f"o:{bucket}", mnt, "--config", conf, "--read-only",
               "--vfs-cache-mode", "full", "--cache-dir", cache, "--dir-cache-time", "1h",
               "--vfs-cache-max-age", "1h", "--vfs-cache-max-size", "8G"]
    else:
        pw = os.path.join(root, "s3fs.passwd")
        with open(pw, "w") as f:
            f.write(f"{origin.ak}:{origin.sk}\n")
        os.chmod(pw, 0o600)
        cmd = ["s3fs", bucket, mnt, "-f", "-o", f"url={origin.s3_url}", "-o",
               "use_path_request_style", "-o", f"passwd_file={pw}", "-o", f"use_cache={cache}",
               "-o", "stat_cache_expire=3600", "-o", "ro"]
    # rclone 1.60 refuses an AWS_CA_BUNDLE with a plain-http endpoint.
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    log = open(os.path.join(root, f"{kind}.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(600):
            if os.path.ismount(mnt):
                break
            if proc.poll() is not None:
                with open(log.name) as f:
                    raise RuntimeError(f"{kind} exited with {proc.returncode}: {f.read()[-2000:]}")
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{kind} did not mount {mnt}")
        return read_tree(mnt, keys, conns, want), read_tree(mnt, keys, conns, want)
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["fusermount", "-u", mnt], check=False)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        os.rmdir(mnt)


def curl_ranges(url, size, readers):
    """Bytes/s reading [0, size) of `url` as `readers` parallel ranged GETs (curl, to nowhere)."""
    step = (size + readers - 1) // readers
    t0 = time.perf_counter()
    ps = [subprocess.Popen(["curl", "-sf", "-o", "/dev/null", "-w", "%{size_download}",
                            "-r", f"{a}-{min(size, a + step) - 1}", url],
                           stdout=subprocess.PIPE, text=True)
          for a in range(0, size, step)]
    got = sum(int(p.communicate()[0] or 0) for p in ps)
    took = time.perf_counter() - t0
    if got != size or any(p.returncode for p in ps):
        raise RuntimeError(f"ranged reads of {url[:60]}...: {got} of {size} bytes")
    return size / took


def model(args, origin, proxy, on_remote, local_path, local_bucket, remote_bucket, rgw_bucket,
          prefix):
    """One model file read by 8 parallel ranged readers: through the cache cold and warm, from
    the local volume, and as one plain GET from the origin."""
    size = args.model
    path = os.path.join(local_path, "model.bin")
    with open(path, "wb") as f:
        for _ in range(0, size, 1 << 24):
            f.write(os.urandom(min(1 << 24, size - f.tell())))
    origin.client.upload_file(path, BUCKET, prefix + "model.bin")
    origin.client.upload_file(path, rgw_bucket, "model.bin")

    def url(server, bucket):
        return server.client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "model.bin"}, ExpiresIn=86400)

    one = curl_ranges(url(origin, rgw_bucket), size, 1)
    cold = curl_ranges(url(on_remote, remote_bucket), size, args.readers)
    warm = curl_ranges(url(on_remote, remote_bucket), size, args.readers)
    local = curl_ranges(url(proxy, local_bucket), size, args.readers)
    for name, v in (("one GET from the origin", one), ("cold, through the cache", cold),
                    ("warm", warm), ("local vfs volume", local)):
        print(f"model: {name}: {v / 1e9:.2f} GB/s", flush=True)
    print(f"model: {size >> 20} MiB, {args.readers} ranged readers: cold/one origin GET "
          f"{cold / one:.2f}x, warm/local {warm / local:.2f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=10000)
    ap.add_argument("--object-size", type=parse_size, default=parse_size("100k"))
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--origin", choices=("rgw", "sluice"), default="rgw")
    ap.add_argument("--block", default="4m")
    ap.add_argument("--model", type=parse_size, default=0,
                    help="also read one file of this size with --readers ranged readers")
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--fuse", action="store_true",
                    help="also read the objects through rclone mount and s3fs (RGW origin)")
    ap.add_argument("--perf", metavar="EPOCH", default="",
                    help="record a `perf record -g` profile of the proxy during this epoch "
                         "(epoch1, epoch2, local, epoch3) into perf-EPOCH.data here")
    ap.add_argument("--io-threads", type=int, default=8,
                    help="the proxy's [sluice] io-threads: origin fetches at once (default 8; "
                         "the pool adds threads only for requests that waited 100 ms)")
    ap.add_argument("--cache-disk", choices=("xfs", "dir"), default="xfs",
                    help="where the cache's blocks go: a file system of their own (XFS on a "
                         "loop device, as root; the default) or a directory of /var/tmp")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="sluice-bench-cache-", dir="/var/tmp")
    origin = proxy = disk = None
    try:
        if args.cache_disk == "xfs":
            disk = CacheDisk(root, 12 << 30)
            cache_path = os.path.join(disk.path, "cache")
        else:
            cache_path = os.path.join(root, "cache")
        print(f"cache: {cache_path} ({args.cache_disk})", flush=True)
        origin = Rgw() if args.origin == "rgw" else SluiceOrigin(os.path.join(root, "origin"))
        origin.client.create_bucket(Bucket=BUCKET)
        remote = remote_volume(origin, BUCKET) + f"""
[volume.remote.cache]
path = "{cache_path}"
block-size = "{args.block}"
max-size = "8g"
min-free = "1g"
ttl = "1h"
"""
        proxy = S3Sluiced(os.path.join(root, "proxy"), volumes=remote,
                          sluice=f"io-threads = {args.io_threads}")
        # The dataset: files of a local vfs bucket, and the same bytes as objects on the origin
        # under the remote bucket's vfolder prefix (as another client would have put them).
        local_bucket, local_path = proxy.bucket()
        keys = make_objects(local_path, args.objects, args.object_size)
        # A second user, whose buckets are on the s3 volume.
        user = f"remote-{uuid.uuid4().hex[:8]}"
        proxy.s.post(proxy.mgr + "/s3/users", json={"id": user, "volume": "remote"}).raise_for_status()
        k = proxy.s.post(proxy.mgr + "/s3/keys", json={"user": user}).json()
        on_remote = types.SimpleNamespace(
            s3_url=proxy.s3_url,
            client=s3_client(proxy.s3_url, k["access_key"], k["secret_key"], 16))
        remote_bucket = f"remote-{uuid.uuid4().hex[:8]}"
        on_remote.client.create_bucket(Bucket=remote_bucket)
        b = next(b for b in proxy.s.get(proxy.mgr + "/s3/buckets").json()["buckets"]
                 if b["name"] == remote_bucket)
        scope, vf = b["vfid"].rsplit("/", 1)
        scope = uuid.UUID(scope.split(":", 1)[1]).hex
        vf = uuid.UUID(vf).hex
        prefix = f"ds/{scope}/{vf[0:2]}/{vf[2:4]}/{vf[4:]}/"
        rgw_bucket = f"direct-{uuid.uuid4().hex[:8]}"
        origin.client.create_bucket(Bucket=rgw_bucket)

        def upload(k):
            with open(os.path.join(local_path, k), "rb") as f:
                body = f.read()
            origin.client.put_object(Bucket=BUCKET, Key=prefix + k, Body=body)
            origin.client.put_object(Bucket=rgw_bucket, Key=k, Body=body)

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            list(ex.map(upload, keys))
        print(f"setup: {len(keys)} objects of {args.object_size} B on the origin in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)

        want = (len(keys), len(keys) * args.object_size)
        rates, hit = {}, {}

        def cache_counts():
            c = proxy.call("GET", "/volume/cache", volume="remote")
            return c["hits"], c["misses"]

        # Where each epoch's CPU went, per object: the origin's daemons (RGW with its OSD and
        # monitor, or the origin sluiced), the proxy, the client. Everything shares two cores.
        origin_pids = (pids_naming(origin.dir) if args.origin == "rgw" else [origin.d.proc.pid])

        def run(name, url, ak, sk, bucket):
            before = cache_counts()
            perf = None
            if args.perf == name:
                perf = subprocess.Popen(["perf", "record", "-g", "-q", "-o", f"perf-{name}.data",
                                         "-p", str(proxy.proc.pid)])
                time.sleep(1)
            o0, p0, c0 = cpu_seconds(origin_pids), cpu_seconds([proxy.proc.pid]), os.times()
            rates[name] = epoch(url, ak, sk, bucket, args.conns, want)
            o1, p1, c1 = cpu_seconds(origin_pids), cpu_seconds([proxy.proc.pid]), os.times()
            if perf:
                perf.send_signal(2)
                perf.wait()
            h, m = (a - b for a, b in zip(cache_counts(), before))
            hit[name] = h / (h + m) if h + m else 0.0
            client = (c1.children_user - c0.children_user) + (c1.children_system -
                                                              c0.children_system)
            n = len(keys)
            print(f"epochs: {name}: {rates[name]:,.0f} objects/s, cache hit ratio "
                  f"{100 * hit[name]:.1f}%; CPU per object: origin {1e6 * (o1 - o0) / n:,.0f} us, "
                  f"proxy {1e6 * (p1 - p0) / n:,.0f} us, client {1e6 * client / n:,.0f} us",
                  flush=True)

        remote_key = (k["access_key"], k["secret_key"])
        run("origin", origin.s3_url, origin.ak, origin.sk, rgw_bucket)
        run("epoch1", proxy.s3_url, *remote_key, remote_bucket)
        run("epoch2", proxy.s3_url, *remote_key, remote_bucket)
        run("local", proxy.s3_url, proxy.ak, proxy.sk, local_bucket)
        proxy.restart()
        run("epoch3", proxy.s3_url, *remote_key, remote_bucket)
        fuse = {}
        if args.fuse and args.origin == "rgw":
            for kind in ("rclone", "s3fs"):
                fuse[kind] = fuse_epochs(kind, origin, rgw_bucket, keys, args.conns, want, root)
                print(f"fuse: {kind}: cold {fuse[kind][0]:,.0f} objects/s, warm re-read "
                      f"{fuse[kind][1]:,.0f} objects/s", flush=True)
        if args.model:
            model(args, origin, proxy, on_remote, local_path, local_bucket, remote_bucket,
                  rgw_bucket, prefix)
        peer = "ceph rgw" if args.origin == "rgw" else "sluice origin"
        print(f"epochs: {len(keys)} x {args.object_size} B, {args.conns} connections, origin "
              f"{peer}: epoch1/origin {rates['epoch1'] / rates['origin']:.2f}x, "
              f"epoch2/origin {rates['epoch2'] / rates['origin']:.2f}x, "
              f"epoch2/local vfs {rates['epoch2'] / rates['local']:.2f}x")
        print(f"restart: hit ratio epoch 3 (after a restart) {100 * hit['epoch3']:.1f}% / "
              f"epoch 2 {100 * hit['epoch2']:.1f}% = "
              f"{hit['epoch3'] / hit['epoch2'] if hit['epoch2'] else 0:.3f}")
        for kind, (cold, warm) in fuse.items():
            print(f"fuse: sluice epoch2 / {kind} warm re-read {rates['epoch2'] / warm:.2f}x "
                  f"(epoch1 / {kind} cold {rates['epoch1'] / cold:.2f}x)")
    finally:
        if proxy:
            proxy.stop()
        if origin:
            origin.stop()
        if disk:
            disk.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
