#!/usr/bin/python3
"""`sluice s3 cp` against the S3 copy tools people run, in the same run, on the same data, to the
same sluiced S3 listener: the AWS CLI (`aws s3 cp --recursive`) and rclone (`rclone copy`), all
with 8 parallel transfers and 16 MiB multipart parts.

  small   N files of S bytes uploaded (a directory to a prefix), then downloaded (the prefix to
          an empty directory) -> files/s
  large   one file of B bytes uploaded (multipart) and downloaded -> MB/s

Rounds alternate the tools; medians are printed with the ratio (> 1: sluice is faster). The
tools and sluiced share this machine's cores.

  /usr/bin/python3 bench/bench_s3_cli.py [--files 2000] [--file-size 64k] [--big 1g]
      [--rounds 3] [--only small,large]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from bench_s3 import S3Sluiced
from benchlib import BIN, parse_size

JOBS = 8
PART = 16 << 20


class Tools:
    def __init__(self, s, root):
        self.s = s
        cfg = os.path.join(root, "aws.cfg")
        with open(cfg, "w") as f:
            f.write(f"[default]\nregion = us-east-1\ns3 =\n  max_concurrent_requests = {JOBS}\n"
                    f"  multipart_chunksize = {PART >> 20}MB\n  multipart_threshold = 64MB\n")
        self.env = dict(os.environ, AWS_ACCESS_KEY_ID=s.ak, AWS_SECRET_ACCESS_KEY=s.sk,
                        AWS_CONFIG_FILE=cfg, AWS_SHARED_CREDENTIALS_FILE="/dev/null",
                        HOME=root)
        self.rclone_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.rclone_env["HOME"] = root
        rclone_s3 = ["--s3-provider", "Other", "--s3-endpoint", s.s3_url, "--s3-access-key-id",
                     s.ak, "--s3-secret-access-key", s.sk, "--s3-force-path-style",
                     "--s3-chunk-size", f"{PART >> 20}M", "--transfers", str(JOBS),
                     "--s3-upload-concurrency", str(JOBS), "--checkers", str(JOBS)]
        sluice = [os.path.join(BIN, "sluice"), "s3", "cp", "-q", "-j", str(JOBS),
                  "--s3-endpoint", s.s3_url]
        aws = ["aws", "--endpoint-url", s.s3_url, "s3", "cp", "--only-show-errors"]
        self.up = {
            "sluice": lambda src, b, p: sluice + ["-r", src, f"s3://{b}/{p}/"],
            "aws": lambda src, b, p: aws + ["--recursive", src, f"s3://{b}/{p}/"],
            "rclone": lambda src, b, p: ["rclone", "copy", "-q", src, f":s3:{b}/{p}"] + rclone_s3,
        }
        self.down = {
            "sluice": lambda b, p, dst: sluice + ["-r", f"s3://{b}/{p}/", dst],
            "aws": lambda b, p, dst: aws + ["--recursive", f"s3://{b}/{p}/", dst],
            "rclone": lambda b, p, dst: ["rclone", "copy", "-q", f":s3:{b}/{p}", dst] + rclone_s3,
        }

    def run(self, cmd):
        # rclone gets its credentials as flags; the AWS config of the CLI confuses its SDK.
        env = self.rclone_env if cmd[0] == "rclone" else self.env
        t0 = time.monotonic()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        dt = time.monotonic() - t0
        if p.returncode != 0:
            sys.exit(f"{' '.join(cmd[:4])}... failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return dt


def sizes_of(path):
    return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                  for d, _, fs in os.walk(path) for f in fs)


def measure(t, bucket, src, scratch, rounds, names):
    """Median upload and download seconds per tool."""
    up = {n: [] for n in names}
    down = {n: [] for n in names}
    want = sizes_of(src)
    for r in range(rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for n in order:
            prefix = f"{n}-{uuid.uuid4().hex[:8]}"
            subprocess.run(["sync"])
            up[n].append(t.run(t.up[n](src, bucket, prefix)))
            dst = os.path.join(scratch, prefix)
            subprocess.run(["sync"])
            down[n].append(t.run(t.down[n](bucket, prefix, dst)))
            if sizes_of(dst) != want:
                sys.exit(f"{n}: the download differs from the source")
            shutil.rmtree(dst)
    return ({n: statistics.median(v) for n, v in up.items()},
            {n: statistics.median(v) for n, v in down.items()})


def report(what, unit, amount, secs):
    base = secs["sluice"]
    line = [f"  {what:9s}"]
    for n, s in secs.items():
        line.append(f"{n} {amount / s:10.1f} {unit}")
    print("  ".join(line))
    print("  " + " " * 9 + "  ".join(f"sluice/{n} {s / base:.2f}x"
                                     for n, s in secs.items() if n != "sluice"))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--file-size", type=parse_size, default=parse_size("64k"))
    ap.add_argument("--big", type=parse_size, default=parse_size("1g"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="small,large")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    names = ["sluice"] + [n for n in ("aws", "rclone") if shutil.which(n)]
    root = tempfile.mkdtemp(prefix="sluice-bench-cli-", dir=args.workdir)
    s = S3Sluiced(root)
    try:
        t = Tools(s, root)
        bucket, _ = s.bucket()
        print(f"machine: {os.cpu_count()} cores shared by sluiced and the tools; "
              f"{JOBS} parallel transfers, {PART >> 20} MiB parts, medians of {args.rounds}")
        if "small" in args.only:
            src = os.path.join(root, "small")
            for i in range(args.files):
                d = os.path.join(src, f"d{i % 20:02d}")
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, f"f{i:06d}.bin"), "wb") as f:
                    f.write(os.urandom(args.file_size))
            up, down = measure(t, bucket, src, root, args.rounds, names)
            print(f"small files: {args.files} x {args.file_size} B")
            report("upload", "files/s", args.files, up)
            report("download", "files/s", args.files, down)
        if "large" in args.only:
            src = os.path.join(root, "large")
            os.makedirs(src)
            with open(os.path.join(src, "big.bin"), "wb") as f:
                left = args.big
                while left:
                    n = min(left, 64 << 20)
                    f.write(os.urandom(n))
                    left -= n
            up, down = measure(t, bucket, src, root, args.rounds, names)
            print(f"one large file: {args.big} B")
            report("upload", "MB/s", args.big / 1e6, up)
            report("download", "MB/s", args.big / 1e6, down)
    finally:
        s.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
