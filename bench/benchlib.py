"""Shared pieces of the benchmarks: a sluiced started on free loopback ports over a fresh vfs
volume, sizes, and the manager API calls every benchmark makes."""
import argparse
import os
import re
import signal
import socket
import subprocess
import time
import uuid

import requests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("SLUICE_BIN_DIR", os.path.join(REPO, "build", "release", "bin"))
TOKEN = "bench-manager-secret"


def free_port():
    """A free port on 127.0.0.1 below the kernel's ephemeral range, so that no outgoing
    connection (the benchmark's clients) can take it before the server binds it."""
    import random
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    while True:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", random.randint(10000, max(10001, lo - 1))))
            except OSError:
                continue
            return s.getsockname()[1]


def parse_size(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgt]?)", s.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


class Sluiced:
    """sluiced with a vfs volume `local` under `root`. `storage_proxy` and `sluice` are extra
    TOML lines for those sections; `volumes` is TOML appended at the end (more `[volume.NAME]`
    sections). `mgr` and `client` are the two listeners' base URLs. `bin_dir`: where sluiced
    is (default: this build); `vol`: an existing volume directory to serve (another sluiced's,
    to compare two builds on the same files with the same tokens)."""

    def __init__(self, root, storage_proxy="", sluice="", volumes="", bin_dir=None, vol=None):
        self.root = root
        self.vol = vol or os.path.join(root, "vol")
        os.makedirs(self.vol, exist_ok=vol is not None)
        self.port = free_port()
        self.client_port = free_port()
        cfg = os.path.join(root, "sluice.toml")
        with open(cfg, "w") as f:
            f.write(f"""
[storage-proxy]
secret = "bench-token-secret"
{storage_proxy}
[api.client]
service-addr = {{ host = "127.0.0.1", port = {self.client_port} }}
[api.manager]
service-addr = {{ host = "127.0.0.1", port = {self.port} }}
internal-addr = {{ host = "127.0.0.1", port = {free_port()} }}
secret = "{TOKEN}"
[sluice]
state-dir = "{root}/state"
log-level = "warning"
{sluice}
[volume.local]
backend = "vfs"
path = "{self.vol}"
{volumes}
""")
        self.log = os.path.join(root, "sluiced.log")
        self.cmd = [os.path.join(bin_dir or BIN, "sluiced"), "--config", cfg]
        self.mgr = f"http://127.0.0.1:{self.port}"
        self.client = f"http://127.0.0.1:{self.client_port}"
        self.s = requests.Session()
        self.s.headers["X-BackendAI-Storage-Auth-Token"] = TOKEN
        self._start()

    def restart(self):
        """Stops (SIGTERM) and starts again with the same configuration and state."""
        self.stop()
        self._start()

    def _start(self):
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        for _ in range(400):
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluiced exited with {self.proc.returncode}; see {self.log}")
            try:
                if self.s.get(self.mgr + "/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.025)
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("sluiced did not start; see " + self.log)

    def call(self, method, path, session=None, **body):
        """A manager API call; `session` (a requests.Session) for use from several threads."""
        s = session or self.s
        r = s.request(method, self.mgr + path, json=body, timeout=3600,
                      headers={"X-BackendAI-Storage-Auth-Token": TOKEN})
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text}")
        return r.json() if r.content else None

    def new_vfolder(self, volume="local", qsid=None):
        """A new vfolder (in quota scope `qsid`, else a new one): (vfid, its path)."""
        vfid = f"{qsid or 'user:' + uuid.uuid4().hex}/{uuid.uuid4().hex}"
        self.call("POST", "/folder/create", volume=volume, vfid=vfid)
        return vfid, self.call("GET", "/folder/mount", volume=volume, vfid=vfid)["path"]

    def wait_task(self, task_id, poll=0.005):
        while True:
            t = self.call("GET", "/bgtask", task_id=task_id)
            if t["status"] in ("completed", "failed"):
                if t["status"] == "failed":
                    raise RuntimeError(f"task failed: {t['error']}")
                return
            time.sleep(poll)

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
