#!/usr/bin/python3
"""S3 API benchmarks: sluiced's S3 listener against its peers, in the same run, on the same data.

  get     N objects of S bytes fetched at random with SigV4 over C keep-alive connections (wrk
          + Lua over presigned URLs, so every request's signature is computed and checked) ->
          req/s against nginx serving the same files without any authentication
  batch   the same N objects fetched with batch gets (one signed request, one TAR stream; as
          many streams at once as there are cores, each of N/cores objects asked for
          --batch-repeat times over; client `sluice s3 get-batch -o -`) -> objects/s against
          nginx's per-object GETs of `get`; the client walks the stream and checks
          the counts (every item's status and size are checked in the warm-up)
  list    K keys (files on the volume, 1000 a directory; --flat: all in one) listed page
          after page (ListObjectsV2, 1000 a page) and
          split over W workers (?list-split, then ListObjectsV2 with start-after and end-key,
          a connection each), both by the same client, `sluice s3 ls -r -j 1|W` -> keys/s, and
          the split's speed-up over the sequential listing
  large   one object of B bytes fetched over one connection (wrk, presigned) against nginx, and
          uploaded as a multipart upload (parts of P bytes, 4 at once, presigned UploadPart URLs
          with unsigned payloads) against `dd bs=P conv=fsync` writing the same bytes to the
          same file system
  complete
          CompleteMultipartUpload alone (32 parts uploaded first) of B/4 and B bytes, on the
          bench's file system and on a loop-mounted btrfs (root): how its time grows with the
          object (O(metadata) where parts are reflinked)
  put     objects of S bytes PUT at random over C connections (wrk, presigned), durable (each
          fsync'ed before the answer) -> req/s

With --rgw, a Ceph RGW (tests/tools/ceph-cluster.sh up + rgw: memstore OSD, beast frontend)
joins get, list and put as a peer on the same data (uploaded to it first). Both servers and
wrk share this machine's cores and this script's session (see bench_download.py). Ratios > 1
mean Sluice is faster.

  /usr/bin/python3 bench/bench_s3.py [--only get,batch,list,large,complete,put] [--objects 10000]
      [--object-size 4k] [--conns 64] [--duration 10] [--rounds 3] [--keys 100000]
      [--workers 8] [--big 1g] [--part 8m] [--rgw]
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET

import boto3
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from bench_download import LUA, Nginx, alternating, make_small_tree, rounds_text, wrk
from benchlib import BIN, Sluiced, free_port, parse_size

NS = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
RGW = None  # --rgw: the Ceph RGW peer
PUT_LUA = """
local paths = {}
for line in io.lines(os.getenv("BENCH_PATHS")) do paths[#paths + 1] = line end
local n = #paths
local body = string.rep("x", tonumber(os.getenv("BENCH_SIZE")))
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
request = function()
  return wrk.format("PUT", paths[math.random(n)], nil, body)
end
"""


def s3_client(url, ak, sk, pool):
    """A boto3 client of `url` (path style, SigV4) with `pool` connections."""
    return boto3.client("s3", endpoint_url=url, aws_access_key_id=ak, aws_secret_access_key=sk,
                        region_name="us-east-1",
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                      max_pool_connections=pool))


class S3Sluiced(Sluiced):
    """sluiced with its S3 listener on, a user, a key and a boto3 client."""

    def __init__(self, root, volumes="", user_volume=None, sluice=""):
        self.s3_port = free_port()
        super().__init__(root, sluice=sluice, volumes=f"""
[api.s3]
service-addr = {{ host = "127.0.0.1", port = {self.s3_port} }}
seal-key = "bench-seal-key-0123456789"
durable = true
{volumes}""")
        self.s3_url = f"http://127.0.0.1:{self.s3_port}"
        user = f"bench-{uuid.uuid4().hex[:8]}"
        body = {"id": user, **({"volume": user_volume} if user_volume else {})}
        r = self.s.post(self.mgr + "/s3/users", json=body)
        r.raise_for_status()
        r = self.s.post(self.mgr + "/s3/keys", json={"user": user})
        r.raise_for_status()
        self.ak, self.sk = r.json()["access_key"], r.json()["secret_key"]
        self.client = s3_client(self.s3_url, self.ak, self.sk, 16)

    def bucket(self):
        """A new bucket: (name, its directory on the volume)."""
        name = f"bench-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        b = next(b for b in self.s.get(self.mgr + "/s3/buckets").json()["buckets"]
                 if b["name"] == name)
        path = self.s.get(self.mgr + "/folder/mount", json={"volume": b["volume"],
                                                             "vfid": b["vfid"]}).json()["path"]
        return name, path


class SluiceOrigin:
    """A second sluiced as an origin (the benchmarks' --origin sluice)."""

    def __init__(self, root):
        self.d = S3Sluiced(root)
        self.s3_url, self.ak, self.sk, self.client = (self.d.s3_url, self.d.ak, self.d.sk,
                                                       self.d.client)

    def stop(self):
        self.d.stop()


def remote_volume(origin, bucket, **options):
    """The TOML of s3 volume "remote" on `origin` (an Rgw or a SluiceOrigin), its keys below
    "ds/" of `bucket`, with more `options` (e.g. part_size="8m")."""
    more = "".join(f'{k.replace("_", "-")} = "{v}"\n' for k, v in options.items())
    return f"""
[volume.remote]
backend = "s3"
path = "s3://{bucket}/ds"
[volume.remote.options]
endpoint = "{origin.s3_url}"
bucket = "{bucket}"
prefix = "ds"
access-key = "{origin.ak}"
secret-key = "{origin.sk}"
{more}"""


class Rgw:
    """A throw-away single-node Ceph cluster with radosgw, and a boto3 client for it."""

    TOOL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                        "tools", "ceph-cluster.sh")

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sluice-ceph-bench-", dir="/tmp")
        env = dict(os.environ, SLUICE_CEPH_OWNER=str(os.getpid()))
        subprocess.run([self.TOOL, "up", self.dir, "4G"], check=True, env=env,
                       capture_output=True, text=True, timeout=300)
        out = subprocess.run([self.TOOL, "rgw", self.dir], check=True, capture_output=True,
                             text=True, timeout=300).stdout.split()
        self.s3_url, self.ak, self.sk = out[-3:]
        self.client = s3_client(self.s3_url, self.ak, self.sk, 32)

    def bucket(self):
        name = f"bench-{uuid.uuid4().hex[:12]}"
        self.client.create_bucket(Bucket=name)
        return name

    def upload(self, bucket, keys, body):
        with concurrent.futures.ThreadPoolExecutor(32) as ex:
            list(ex.map(lambda k: self.client.put_object(Bucket=bucket, Key=k, Body=body), keys))

    def stop(self):
        subprocess.run([self.TOOL, "down", self.dir], check=False, timeout=120)


def signed(server, method, path, body=b"", session=None):
    """A request signed with botocore's SigV4 (path and query already URL-encoded)."""
    req = AWSRequest(method=method, url=server.s3_url + path, data=body)
    req.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    SigV4Auth(Credentials(server.ak, server.sk), "s3", "us-east-1").add_auth(req)
    p = req.prepare()
    return (session or requests).request(method, p.url, headers=dict(p.headers), data=body,
                                         timeout=3600, stream=True)


def make_objects(path, n, size, prefix="obj"):
    """n objects of `size` bytes written on the volume (objects are files): their keys."""
    return make_small_tree(path, n, size, prefix + "/")


def write_paths(root, name, lines):
    p = os.path.join(root, f"{name}-paths.txt")
    with open(p, "w") as f:
        f.write("\n".join(lines) + "\n")
    return p


def presigned_paths(server, bucket, keys, op="get_object"):
    base = len(server.s3_url)
    return [server.client.generate_presigned_url(op, Params={"Bucket": bucket, "Key": k},
                                                 ExpiresIn=86400)[base:] for k in keys]


# ---------------------------------------------------------------------------------------- get

def bench_get(s, root, args, state):
    bucket, path = s.bucket()
    keys = make_objects(path, args.objects, args.object_size)
    state["objects"] = (bucket, path, keys)
    urls = presigned_paths(s, bucket, keys)
    probe = requests.get(s.s3_url + urls[0]).content
    ngx = Nginx(root, path)
    try:
        assert requests.get(f"{ngx.base}/{keys[0]}").content == probe
        lua = os.path.join(root, "random.lua")
        with open(lua, "w") as f:
            f.write(LUA)
        files = {"sluice": write_paths(root, "s3-get", urls),
                 "nginx": write_paths(root, "nginx-get", ["/" + k for k in keys])}
        bases = {"sluice": s.s3_url, "nginx": ngx.base}
        if RGW:
            rb = RGW.bucket()
            RGW.upload(rb, keys, probe)
            files["rgw"] = write_paths(root, "rgw-get", presigned_paths(RGW, rb, keys))
            bases["rgw"] = RGW.s3_url
        threads = min(os.cpu_count(), args.conns)
        rps = alternating(args.rounds, args.warmup, {
            name: (lambda d, name=name: wrk(bases[name], files[name], lua, args.conns, threads,
                                            d or args.duration)[0]) for name in bases})
    finally:
        ngx.stop()
    for name in rps:
        print(f"get: {name} rounds: {rounds_text(rps[name], 1, 'req/s')}")
    med = {n: statistics.median(r) for n, r in rps.items()}
    state["nginx_rps"] = med["nginx"]
    print(f"get: {args.objects} objects of {args.object_size} B at random, SigV4 (presigned), "
          f"{args.conns} connections: medians sluice {med['sluice']:,.0f} req/s, nginx (no auth) "
          f"{med['nginx']:,.0f} req/s, ratio {med['sluice'] / med['nginx']:.2f}x")
    if RGW:
        print(f"get: medians: ceph rgw {med['rgw']:,.0f} req/s, sluice/rgw "
              f"{med['sluice'] / med['rgw']:.2f}x")


# -------------------------------------------------------------------------------------- batch

def batch_stream_check(stream, keys, size):
    """Objects received from one batch get, checked without walking the stream entry by entry in
    Python (that costs more per entry than the server does: it would measure the client, where
    nginx's side is measured with wrk). Each entry of a batch of equal-sized objects with short
    names is a 512-byte header and the data padded to 512, so the manifest's header sits at a
    known offset: the stream's length, the first entry's name, the manifest's place and every
    item's status and size in it must all be what the request asked for."""
    entry = 512 + (size + 511) // 512 * 512
    at = len(keys) * entry  # the manifest's header
    total = 0
    head = b""
    tail = []  # the chunks that may hold the manifest
    for chunk in stream.iter_content(1 << 20):
        if len(head) < 512:
            head += chunk[:512 - len(head)]
        if total + len(chunk) > at:
            tail.append((total, chunk))
        total += len(chunk)
    if head[:100].split(b"\0")[0].decode() != keys[0]:
        raise RuntimeError(f"the first entry is {head[:100]!r}, not {keys[0]}")
    if not tail:
        raise RuntimeError(f"the stream ended at {total} bytes, before the manifest at {at}")
    data = b"".join(c for _, c in tail)[at - tail[0][0]:]
    if data[:100].split(b"\0")[0] != b"__manifest__.json":
        raise RuntimeError(f"no manifest at offset {at} (is there a PAX header?): {data[:100]!r}")
    msize = int(data[124:136].split(b"\0")[0].strip(), 8)
    manifest = json.loads(data[512:512 + msize])
    items = manifest["items"]
    if manifest["ok"] != len(keys) or [i["key"] for i in items] != [k.split("/", 1)[1]
                                                                    for k in keys]:
        raise RuntimeError(f"the manifest does not list the {len(keys)} items asked for")
    if any(i["status"] != 200 or i["size"] != size for i in items):
        raise RuntimeError("an item failed or has the wrong size")
    return len(items)


class PipeStream:
    """A process's stdout, read as batch_stream_check reads a response."""

    def __init__(self, proc):
        self.proc = proc

    def iter_content(self, n):
        while chunk := self.proc.stdout.read(n):
            yield chunk


def one_batch(s, bucket, keys, size, keys_file, deep):
    """Objects received from one batch get, read to its end and checked. The client is
    `sluice s3 get-batch` (C++, libcurl), as nginx's is wrk. It walks the TAR stream itself
    (libarchive) and reports the entries and the manifest's counts, which must be every key
    asked for. With `deep` the stream also comes through this script, which checks the
    first entry's name and every item's status and size in the manifest (done once, in the
    warm-up: piping every round through Python costs more per object than the server)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=s.ak, AWS_SECRET_ACCESS_KEY=s.sk,
               SLUICE_S3_ENDPOINT=s.s3_url)
    p = subprocess.Popen([os.path.join(BIN, "sluice"), "s3", "--json", "get-batch", "--keys-from",
                          keys_file, "-o", "-" if deep else "/dev/null", f"s3://{bucket}"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    failed = None
    try:
        got = (batch_stream_check(PipeStream(p), [f"{bucket}/{k}" for k in keys], size) if deep
               else None)
    except RuntimeError as e:
        failed = e  # an empty stream: the command's own error (a refused batch) says why
    finally:
        out, err = p.communicate()
    if failed and p.returncode == 0:
        raise failed
    if p.returncode != 0:
        raise RuntimeError(f"sluice s3 get-batch: {p.returncode}: {err.decode()[-500:]}")
    summary = json.loads((err if deep else out).decode().strip().splitlines()[-1])
    entry = 512 + (size + 511) // 512 * 512
    if (summary["entries"] != len(keys) or summary["ok"] != len(keys) or summary["errors"]
            or summary["bytes"] <= len(keys) * entry):
        raise RuntimeError(f"sluice s3 get-batch of {len(keys)} objects: {summary}")
    return got if deep else summary["entries"]


def bench_batch(s, root, args, state):
    if "objects" not in state:
        bucket, path = s.bucket()
        state["objects"] = (bucket, path, make_objects(path, args.objects, args.object_size))
    bucket, _, keys = state["objects"]
    streams = args.batch_streams or os.cpu_count()
    # Each stream asks for its share of the objects --batch-repeat times over (nginx's GETs
    # also fetch the same objects again and again for the whole --duration), so that a
    # measurement lasts long enough that the clients' start does not count.
    chunks = [keys[i::streams] * args.batch_repeat for i in range(streams)]
    files = [write_paths(root, f"batch-{i}", c) for i, c in enumerate(chunks)]
    total = sum(map(len, chunks))

    def run(deep=False):
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(streams) as ex:
            got = sum(ex.map(lambda i: one_batch(s, bucket, chunks[i], args.object_size,
                                                 files[i], deep), range(streams)))
        assert got == total, got
        return total / (time.perf_counter() - t0)

    run(deep=True)  # warm-up, every item checked here
    rates = [run() for _ in range(args.rounds)]
    print(f"batch: rounds: {rounds_text(rates, 1, 'objects/s')}")
    med = statistics.median(rates)
    ngx = state.get("nginx_rps")
    vs = f", ratio to nginx's per-object GETs {med / ngx:.2f}x" if ngx else ""
    print(f"batch: {len(keys)} objects of {args.object_size} B, each asked for "
          f"{args.batch_repeat} times, in {streams} batch gets at once: median {med:,.0f} "
          f"objects/s{vs}")


# --------------------------------------------------------------------------------------- list

def list_cli(url, ak, sk, bucket, jobs, keys):
    """keys/s of `sluice s3 ls -r -j JOBS` over the whole bucket (one client for every server:
    C++, pugixml, one connection a job; with jobs > 1 it splits the key space with list-split
    and lists the ranges in parallel, a server without list-split is listed sequentially)."""
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ak, AWS_SECRET_ACCESS_KEY=sk, SLUICE_S3_ENDPOINT=url)
    env.pop("AWS_CA_BUNDLE", None)
    t0 = time.perf_counter()
    out = subprocess.run([os.path.join(BIN, "sluice"), "s3", "ls", "-r", "-j", str(jobs),
                          f"s3://{bucket}/"], env=env, check=True, capture_output=True).stdout
    rate = keys / (time.perf_counter() - t0)
    got = out.count(b"\n")
    if got != keys:
        raise RuntimeError(f"listing {url}/{bucket} with {jobs} jobs gave {got} keys, not {keys}")
    return rate


def bench_list(s, root, args, state):
    bucket, path = s.bucket()
    t0 = time.perf_counter()
    if args.flat:  # one directory of them all, as many datasets are laid out
        os.makedirs(os.path.join(path, "k"))
        rgw_keys = [f"k/f{i:07d}" for i in range(args.keys)]
        for k in rgw_keys:
            with open(os.path.join(path, k), "wb") as f:
                f.write(b"k")
    else:
        make_objects(path, args.keys, 1, prefix="k")
        rgw_keys = [f"k/d{i // 1000:03d}/f{i:05d}" for i in range(args.keys)]
    shape = "in one directory" if args.flat else "1000 a directory"
    print(f"list: {args.keys} keys ({shape}) made in {time.perf_counter() - t0:.1f} s")
    listing = {"sequential": lambda d: list_cli(s.s3_url, s.ak, s.sk, bucket, 1, args.keys),
               "split": lambda d: list_cli(s.s3_url, s.ak, s.sk, bucket, args.workers,
                                           args.keys)}
    if RGW:
        rb = RGW.bucket()
        t0 = time.perf_counter()
        RGW.upload(rb, rgw_keys, b"k")
        print(f"list: {args.keys} keys uploaded to rgw in {time.perf_counter() - t0:.0f} s")
        listing["rgw"] = lambda d: list_cli(RGW.s3_url, RGW.ak, RGW.sk, rb, 1, args.keys)
    rates = alternating(args.rounds, 1, listing)  # a first listing of each warms it (dentries)
    for name in rates:
        print(f"list: {name} rounds: {rounds_text(rates[name], 1, 'keys/s')}")
    med = {n: statistics.median(r) for n, r in rates.items()}
    ms, mp = med["sequential"], med["split"]
    print(f"list: {args.keys} keys, 1000 a page, client `sluice s3 ls -r`: sequential median "
          f"{ms:,.0f} keys/s; split over {args.workers} workers {mp:,.0f} keys/s, "
          f"{mp / ms:.2f}x the sequential listing")
    if RGW:
        mr = med["rgw"]
        print(f"list: medians: ceph rgw sequential {mr:,.0f} keys/s; sluice sequential/rgw "
              f"{ms / mr:.2f}x, sluice split over {args.workers} workers/rgw {mp / mr:.2f}x")


# -------------------------------------------------------------------------------------- large

def upload_parts(s, bucket, key, data, part_size):
    """Begins a multipart upload of `data` and uploads its parts, 4 at once (presigned
    UploadPart URLs, unsigned payloads): (upload id, the parts for Complete)."""
    up = s.client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    nparts = (len(data) + part_size - 1) // part_size

    def part(i):
        u = s.client.generate_presigned_url("upload_part", Params={
            "Bucket": bucket, "Key": key, "UploadId": up, "PartNumber": i + 1})
        with requests.Session() as session:
            r = session.put(u, data=data[i * part_size:(i + 1) * part_size], timeout=600)
            r.raise_for_status()
            return {"PartNumber": i + 1, "ETag": r.headers["ETag"]}

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        return up, list(ex.map(part, range(nparts)))


def bench_large(s, root, args, state):
    bucket, path = s.bucket()
    src = os.path.join(root, "big.src")
    chunk = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for _ in range(args.big >> 20):
            f.write(chunk)
    shutil.copy(src, os.path.join(path, "big.bin"))
    subprocess.run(["cat", os.path.join(path, "big.bin")], stdout=subprocess.DEVNULL, check=True)
    url = presigned_paths(s, bucket, ["big.bin"])[0]
    ngx = Nginx(root, path)
    try:
        bps = alternating(args.rounds, args.warmup, {
            "nginx": lambda d: wrk(ngx.base, None, None, 1, 1, d or args.duration,
                                   "/big.bin")[1],
            "sluice": lambda d: wrk(s.s3_url, None, None, 1, 1, d or args.duration, url)[1]})
    finally:
        ngx.stop()
    for name in bps:
        print(f"large: GET {name} rounds: {rounds_text(bps[name], 1e-9, 'GB/s')}")
    med = {n: statistics.median(r) for n, r in bps.items()}
    print(f"large: GET of {args.big >> 20} MiB over one connection: medians sluice "
          f"{med['sluice'] / 1e9:.2f} GB/s, nginx {med['nginx'] / 1e9:.2f} GB/s, ratio "
          f"{med['sluice'] / med['nginx']:.2f}x")

    # Multipart upload from the page cache, against dd writing the same bytes durably.
    subprocess.run(["cat", src], stdout=subprocess.DEVNULL, check=True)
    with open(src, "rb") as f:
        data = memoryview(f.read())

    def upload():
        key = f"up-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        up, parts = upload_parts(s, bucket, key, data, args.part)
        s.client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                           MultipartUpload={"Parts": parts})
        took = time.perf_counter() - t0
        os.unlink(os.path.join(path, key))
        return len(data) / took

    def dd():
        dst = os.path.join(path, f"dd-{uuid.uuid4().hex[:8]}")
        t0 = time.perf_counter()
        subprocess.run(["dd", f"if={src}", f"of={dst}", f"bs={args.part}", "conv=fsync",
                        "status=none"], check=True)
        took = time.perf_counter() - t0
        os.unlink(dst)
        return len(data) / took

    up = alternating(args.rounds, 0, {"sluice": lambda d: upload(), "dd": lambda d: dd()})
    for name in up:
        print(f"large: upload {name} rounds: {rounds_text(up[name], 1e-9, 'GB/s')}")
    med = {n: statistics.median(r) for n, r in up.items()}
    print(f"large: multipart upload of {args.big >> 20} MiB in {args.part >> 20} MiB parts, 4 at "
          f"once, durable: median sluice {med['sluice'] / 1e9:.2f} GB/s, dd conv=fsync "
          f"{med['dd'] / 1e9:.2f} GB/s, ratio {med['sluice'] / med['dd']:.2f}x")


# ----------------------------------------------------------------------------------- complete

def bench_complete(s, root, args, state):
    """CompleteMultipartUpload alone, of a quarter of --big and of --big in the same number of
    parts (32), on the bench's file system (ext4 here: the parts are copied) and on a
    loop-mounted btrfs (tests/tools/btrfs-loop.sh; copy_file_range reflinks the parts): a
    Complete that is O(metadata) takes about as long for 4x the bytes."""
    data = memoryview(b"".join([os.urandom(1 << 20)] * (args.big >> 20)))
    sizes = [args.big // 4, args.big]
    servers = [("the bench's file system", s)]
    bt_dir, bt = None, None
    tool = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                        "tools", "btrfs-loop.sh")
    if os.geteuid() == 0 and shutil.which("mkfs.btrfs"):
        bt_dir = tempfile.mkdtemp(prefix="sluice-btrfs-bench-", dir="/tmp")
        os.rmdir(bt_dir)
        mnt = subprocess.run([tool, "up", bt_dir, str(3 * args.big + (1 << 30))], check=True,
                             capture_output=True, text=True,
                             env=dict(os.environ, SLUICE_BTRFS_OWNER=str(os.getpid())))
        mnt = mnt.stdout.strip().splitlines()[-1]
        os.makedirs(os.path.join(mnt, "vol"))
        bt_root = os.path.join(root, "btrfs-sluiced")
        os.makedirs(bt_root)
        bt = S3Sluiced(bt_root, volumes=f"""
[volume.bt]
backend = "vfs"
path = "{mnt}/vol"
""", user_volume="bt")
        servers.append(("btrfs (loop-mounted)", bt))
    else:
        print("complete: btrfs skipped (needs root and mkfs.btrfs)")
    try:
        for label, srv in servers:
            bucket, _ = srv.bucket()
            took = {}
            for size in sizes:
                runs = []
                for _ in range(args.rounds):
                    key = f"complete-{uuid.uuid4().hex[:8]}"
                    up, parts = upload_parts(srv, bucket, key, data[:size], size // 32)
                    t0 = time.perf_counter()
                    srv.client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=up,
                                                         MultipartUpload={"Parts": parts})
                    runs.append(time.perf_counter() - t0)
                    srv.client.delete_object(Bucket=bucket, Key=key)
                took[size] = statistics.median(runs)
                print(f"complete: {label}: {size >> 20} MiB in {len(parts)} parts: rounds "
                      f"{', '.join(f'{r * 1e3:.0f}' for r in runs)} ms")
            small, big = took[sizes[0]], took[sizes[1]]
            print(f"complete: {label}: median {small * 1e3:.0f} ms for {sizes[0] >> 20} MiB, "
                  f"{big * 1e3:.0f} ms for {sizes[1] >> 20} MiB: {big / small:.2f}x the time for "
                  f"4x the bytes")
    finally:
        if bt:
            bt.stop()
        if bt_dir:
            subprocess.run([tool, "down", bt_dir], check=False)


# ---------------------------------------------------------------------------------------- put

def bench_put(s, root, args, state):
    bucket, _ = s.bucket()
    keys = [f"put/o{i:05d}" for i in range(min(args.objects, 5000))]
    urls = presigned_paths(s, bucket, keys, "put_object")
    lua = os.path.join(root, "put.lua")
    with open(lua, "w") as f:
        f.write(PUT_LUA)
    os.environ["BENCH_SIZE"] = str(args.object_size)
    paths = write_paths(root, "s3-put", urls)
    threads = min(os.cpu_count(), args.conns)
    runs = {"sluice": lambda d: wrk(s.s3_url, paths, lua, args.conns, threads,
                                    d or args.duration)[0]}
    if RGW:
        rpaths = write_paths(root, "rgw-put", presigned_paths(RGW, RGW.bucket(), keys,
                                                              "put_object"))
        runs["rgw"] = lambda d: wrk(RGW.s3_url, rpaths, lua, args.conns, threads,
                                    d or args.duration)[0]
    rps = alternating(args.rounds, args.warmup, runs)
    for name in rps:
        print(f"put: {name} rounds: {rounds_text(rps[name], 1, 'req/s')}")
    med = {n: statistics.median(r) for n, r in rps.items()}
    print(f"put: {args.object_size} B objects, durable, {args.conns} connections: median sluice "
          f"{med['sluice']:,.0f} req/s" + (f", ceph rgw {med['rgw']:,.0f} req/s, ratio "
                                           f"{med['sluice'] / med['rgw']:.2f}x" if RGW else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="get,batch,list,large,complete,put")
    ap.add_argument("--objects", type=int, default=10000)
    ap.add_argument("--object-size", type=parse_size, default=parse_size("4k"))
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--keys", type=int, default=100000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--flat", action="store_true", help="list: every key in one directory")
    ap.add_argument("--batch-streams", type=int, default=0,
                    help="batch: batch gets at once (default: one per core)")
    ap.add_argument("--batch-repeat", type=int, default=10,
                    help="batch: each object asked for this many times over")
    ap.add_argument("--big", type=parse_size, default=parse_size("1g"))
    ap.add_argument("--part", type=parse_size, default=parse_size("8m"))
    ap.add_argument("--workdir", default=None, help="where to put data (default: a temp dir)")
    ap.add_argument("--sluice", default="",
                    help="extra TOML lines for sluiced's [sluice] section (io-threads = 64, ...)")
    ap.add_argument("--rgw", action="store_true",
                    help="also measure a Ceph RGW started with tests/tools/ceph-cluster.sh")
    args = ap.parse_args()
    global RGW
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (scripts/install-deps.sh installs it)")
    root = tempfile.mkdtemp(prefix="sluice-bench-s3-", dir=args.workdir)
    os.chmod(root, 0o755)
    s = S3Sluiced(root, sluice=args.sluice.replace(";", "\n"))
    state = {}
    try:
        if args.rgw:
            RGW = Rgw()
        print(f"machine: {os.cpu_count()} cores shared by the servers and their clients")
        for name in args.only.split(","):
            {"get": bench_get, "batch": bench_batch, "list": bench_list, "large": bench_large,
             "complete": bench_complete, "put": bench_put}[name](s, root, args, state)
    finally:
        if RGW:
            RGW.stop()
        s.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
