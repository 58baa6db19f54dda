"""Integration-test harness: real `sluiced` processes on free ports in temporary directories.

Tests talk to the daemon through `Daemon.mgr(...)` (manager API, token added) and inspect the
volume directly on disk. Helpers shared by the test modules live here so the tests stay short.
"""

import contextlib
import hashlib
import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest
import requests
import urllib3

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("SLUICE_BIN_DIR") or REPO / "build" / "release" / "bin")
SLUICED = BIN_DIR / "sluiced"

AUTH_HEADER = "X-BackendAI-Storage-Auth-Token"
MANAGER_SECRET = "manager-secret-for-tests"
TOKEN_SECRET = "token-secret-for-tests"
LOG_NAME = "sluiced.log"

START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
TASK_TIMEOUT = 30.0
REQUEST_TIMEOUT = 30.0


# --------------------------------------------------------------------------- identifiers


def new_qsid(kind="user"):
    return f"{kind}:{uuid.uuid4().hex}"


def new_vfid(qsid=None):
    return f"{qsid or new_qsid()}/{uuid.uuid4().hex}"


def split_vfid(vfid):
    """(scope hex, vfolder hex) of "<type>:<uuid>/<hex>"."""
    qsid, vf = vfid.rsplit("/", 1)
    return uuid.UUID(qsid.split(":", 1)[1]).hex, uuid.UUID(vf).hex


# --------------------------------------------------------------------------- processes


def _listen_port_range():
    """Ports to listen on: those below the kernel's ephemeral range (or above it when that
    leaves more room). A port from bind(0) lies inside that range, where every outgoing
    connection (the tests' own HTTP clients, curl, Ceph) also takes its local port, and one of
    them could hold it by the time sluiced binds."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    if lo - 10000 >= 65535 - hi:
        return 10000, lo - 1
    return hi + 1, 65535


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1, free now and outside the ephemeral range, chosen at
    random (all bound at once to check, then released)."""
    import random

    first, last = _listen_port_range()
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", random.randint(first, last)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ports_free(ports):
    for p in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            return False
        finally:
            s.close()
    return True


def tail(path, n=60):
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<no log: {e}>"
    return "\n".join(lines[-n:])


def wait_http_ok(url, proc, log_path, timeout=START_TIMEOUT):
    """Polls url until it answers 200; fails with the log tail if the process exits or hangs."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"sluiced exited with {proc.returncode} before becoming healthy\n"
                f"--- log tail ---\n{tail(log_path)}"
            )
        try:
            r = requests.get(url, timeout=2, verify=False)
            if r.status_code == 200:
                return r
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except requests.RequestException as e:
            last = repr(e)
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    pytest.fail(
        f"sluiced did not answer {url} within {timeout}s (last: {last})\n"
        f"--- log tail ---\n{tail(log_path)}"
    )


def pause(pid, timeout=30):
    """SIGSTOP `pid`, and return once every thread of it has stopped. The signal goes to one
    thread, which stops the others when it next runs: on a loaded machine the rest of the
    process can go on answering requests for a while after kill() returns (a test that pauses
    an origin then saw it answer)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            raise AssertionError(f"process {pid} exited instead of stopping") from None
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
        if states and all(st in ("T", "t", "Z") for st in states):  # (Z: a thread gone)
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop: thread states {states}")
        time.sleep(0.005)


def terminate(proc, log_path=None, timeout=STOP_TIMEOUT):
    """SIGTERM, wait; kill -9 and fail if it hangs. Returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(
            f"sluiced did not exit within {timeout}s of SIGTERM\n"
            f"--- log tail ---\n{tail(log_path) if log_path else ''}"
        )


def rss_kib(pid):
    """The resident set size of process `pid`, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def run_sluiced(*args, cwd=None, timeout=15):
    """Runs sluiced to completion (for --help, --check-config, failing starts)."""
    return subprocess.run(
        [str(SLUICED), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --------------------------------------------------------------------------- TOML


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def toml_section(name, items):
    return f"[{name}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in items.items())


# --------------------------------------------------------------------------- on-disk trees


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def through_fifo(fifo, run, timeout=120):
    """Makes the FIFO `fifo`, calls `run()` (a command told to write there) in a thread while
    this one reads the FIFO: (what `run` returned, the bytes that came through). The FIFO is
    opened first without blocking, so a command that never opens it cannot hang the test."""
    os.mkfifo(fifo)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    out, data = {}, bytearray()
    t = threading.Thread(target=lambda: out.setdefault("r", run()))
    t.start()
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                chunk = os.read(rfd, 1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk:
                data += chunk
            elif not t.is_alive():
                break
            elif time.monotonic() > deadline:
                raise TimeoutError(f"{fifo}: the command did not end within {timeout} s")
            else:
                time.sleep(0.002)
    finally:
        os.close(rfd)
        t.join()
    return out.get("r"), bytes(data)


def tree_state(root, exclude=()):
    """{relpath: entry} for everything below root, symlinks not followed.

    Entries: ("dir", mode) / ("file", mode, sha256) / ("link", target) / ("other", mode).
    """
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if rel in exclude:
                continue
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode)
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", mode, sha256_file(p))
            else:
                out[rel] = ("other", mode)
    return out


def content_manifest(root):
    """Like tree_state, but content only (types, file hashes, link targets; no modes)."""
    m = {}
    for rel, e in tree_state(root).items():
        if e[0] == "file":
            m[rel] = ("file", e[2])
        elif e[0] == "dir":
            m[rel] = ("dir",)
        else:
            m[rel] = e
    return m


def write_tree(root, spec):
    """Creates files/dirs/symlinks below root.

    spec: {relpath: bytes | str (file content) | None (empty dir) | ("link", target)}.
    """
    root = Path(root)
    for rel, v in spec.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if v is None:
            p.mkdir(parents=True, exist_ok=True)
        elif isinstance(v, tuple) and v[0] == "link":
            os.symlink(v[1], p)
        else:
            p.write_bytes(v.encode() if isinstance(v, str) else v)


# --------------------------------------------------------------------------- the daemon


class Daemon:
    """One sluiced process with its own config, state dir and vfs volume(s) under `root`."""

    def __init__(
        self,
        root,
        *,
        storage_proxy=None,
        manager=None,
        client=None,
        sluice=None,
        extra_volumes=(),
        extra_toml="",
        config_text=None,  # the whole file, or a function of the Daemon returning it
        secret=MANAGER_SECRET,
        s3=None,  # options of an [api.s3] section (the S3 listener), or None: no S3
    ):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # Port 0: the kernel picks; sluiced records what it bound in <state>/listeners.json,
        # read at start (no race for a port that looked free).
        self.client_port = self.manager_port = self.internal_port = self.s3_port = 0
        self.s3_opts = None if s3 is None else dict(s3)
        self.state = self.root / "state"
        self.volumes = {"local": self.root / "vol"}
        for name in extra_volumes:
            self.volumes[name] = self.root / f"vol-{name}"
        for p in self.volumes.values():
            p.mkdir(parents=True, exist_ok=True)
        self.vol = self.volumes["local"]
        self.secret = secret
        self.manager_opts = dict(manager or {})
        self.client_opts = dict(client or {})
        self.client_scheme = "https" if self.client_opts.get("ssl-enabled") else "http"
        self.scheme = "https" if self.manager_opts.get("ssl-enabled") else "http"
        self.config_path = self.root / "storage-proxy.toml"
        self.log_path = self.root / LOG_NAME
        self.proc = None
        if config_text is None:
            config_text = self._config(storage_proxy or {}, sluice or {}, extra_toml)
        elif callable(config_text):  # built from this daemon's ports
            config_text = config_text(self)
        self.config_path.write_text(config_text)

    def _config(self, storage_proxy, sluice, extra_toml):
        sp = {
            "node-id": "it-node",
            "num-proc": 2,
            "secret": TOKEN_SECRET,
            "scandir-limit": 1000,
            "allow-auto-quota-scope-creation": True,
        }
        sp.update(storage_proxy)
        mgr = {
            "service-addr": {"host": "127.0.0.1", "port": self.manager_port},
            "internal-addr": {"host": "127.0.0.1", "port": self.internal_port},
            "secret": self.secret,
        }
        mgr.update(self.manager_opts)
        parts = [
            toml_section("storage-proxy", sp),
            toml_section(
                "api.client",
                {
                    "service-addr": {"host": "127.0.0.1", "port": self.client_port},
                    **self.client_opts,
                },
            ),
            toml_section("api.manager", mgr),
            toml_section("sluice", {"state-dir": str(self.state), **sluice}),
        ]
        if self.s3_opts is not None:
            parts.append(toml_section("api.s3", {
                "service-addr": {"host": "127.0.0.1", "port": 0},
                "seal-key": "seal-key-for-tests-0123456789",
                "durable": False,
                **self.s3_opts}))
        for name, path in self.volumes.items():
            parts.append(toml_section(f"volume.{name}", {"backend": "vfs", "path": str(path)}))
        parts.append(extra_toml)
        return "\n".join(parts)

    # ---- lifecycle

    def start(self, args=(), cwd=None, preexec_fn=None):
        """preexec_fn runs in the child before sluiced starts (resource limits, say)."""
        m = re.search(r'^state-dir\s*=\s*"([^"]+)"', self.config_path.read_text(), re.M)
        state = Path(m.group(1) if m else "var")  # sluiced's default: ./var
        bound = (state if state.is_absolute() else Path(cwd or self.root) / state) / "listeners.json"
        bound.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(SLUICED), "--config", str(self.config_path), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd or self.root,
                preexec_fn=preexec_fn,
            )
        self._read_bound(bound)
        wait_http_ok(self.url("/health"), self.proc, self.log_path)
        return self

    def _read_bound(self, bound):
        """Waits for sluiced to record its listeners' addresses and takes their ports."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"sluiced exited with {self.proc.returncode} before listening\n"
                            f"--- log tail ---\n{tail(self.log_path)}")
            try:
                urls = json.loads(bound.read_text())
                break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"sluiced did not write {bound}\n--- log tail ---\n{tail(self.log_path)}")
            time.sleep(0.02)
        port = lambda name: int(urls[name].rsplit(":", 1)[1])  # noqa: E731
        self.manager_port, self.client_port, self.internal_port = (
            port("manager"), port("client"), port("internal"))
        if "s3" in urls:
            self.s3_port = port("s3")

    def stop(self):
        """SIGTERM; asserts a clean exit (code 0) within STOP_TIMEOUT."""
        if self.proc is None:
            return
        rc = terminate(self.proc, self.log_path)
        self.proc = None
        assert rc == 0, f"sluiced exited with {rc}\n--- log tail ---\n{tail(self.log_path)}"

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self):
        return self.log_path.read_text(errors="replace")

    # ---- HTTP

    def url(self, path):
        return f"{self.scheme}://127.0.0.1:{self.manager_port}{path}"

    def client_url(self, path):
        return f"{self.client_scheme}://127.0.0.1:{self.client_port}{path}"

    def internal_url(self, path):
        return f"http://127.0.0.1:{self.internal_port}{path}"

    def s3_url(self, path=""):
        scheme = "https" if (self.s3_opts or {}).get("ssl-enabled") else "http"
        return f"{scheme}://127.0.0.1:{self.s3_port}{path}"

    # ---- S3

    def s3_user(self, user_id=None, **body):
        """Creates an S3 user through the manager API; returns its record."""
        body = {"id": user_id or f"u-{uuid.uuid4().hex[:8]}", **body}
        r = self.mgr("POST", "/s3/users", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def s3_key(self, user, **body):
        """A new access key of `user`: (access key, secret key)."""
        r = self.mgr("POST", "/s3/keys", json={"user": user, **body})
        assert r.status_code == 201, r.text
        return r.json()["access_key"], r.json()["secret_key"]

    def s3_client(self, access_key, secret_key, verify=None, **config):
        """A boto3 S3 client for this daemon (path-style, SigV4); `verify`: the CA to trust
        over https."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.s3_url(),
            verify=verify,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                          retries={"max_attempts": 1}, **config),
        )

    def mgr(self, method, path, json=None, params=None, token=True, **kw):
        """A manager-API request. token: True (right secret), False (no header) or a string."""
        headers = dict(kw.pop("headers", {}) or {})
        if token is True:
            headers[AUTH_HEADER] = self.secret
        elif token:
            headers[AUTH_HEADER] = token
        kw.setdefault("timeout", REQUEST_TIMEOUT)
        kw.setdefault("verify", False)
        return requests.request(
            method, self.url(path), json=json, params=params, headers=headers, **kw
        )

    def file_op(self, volume, route, **body):
        """POST /folder/file/<route> on `volume`."""
        return self.mgr("POST", f"/folder/file/{route}", json={"volume": volume, **body})

    def task(self, task_id):
        return self.mgr("GET", "/bgtask", json={"task_id": task_id})

    def wait_task(self, task_id, timeout=TASK_TIMEOUT):
        """Polls GET /bgtask until the task is completed or failed; returns its JSON."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            r = self.task(task_id)
            assert r.status_code == 200, f"GET /bgtask {task_id}: {r.status_code} {r.text}"
            last = r.json()
            if last.get("status") in ("completed", "failed"):
                return last
            time.sleep(0.05)
        pytest.fail(f"task {task_id} did not finish within {timeout}s: {last}")

    # ---- vfolders

    def vfolder_path(self, vfid, volume="local"):
        scope, vf = split_vfid(vfid)
        return self.volumes[volume] / scope / vf[0:2] / vf[2:4] / vf[4:]

    def scope_path(self, qsid, volume="local"):
        return self.volumes[volume] / uuid.UUID(qsid.split(":", 1)[1]).hex

    def create_vfolder(self, vfid=None, volume="local", **body):
        vfid = vfid or new_vfid()
        r = self.mgr("POST", "/folder/create", json={"volume": volume, "vfid": vfid, **body})
        assert r.status_code == 204, f"create {vfid}: {r.status_code} {r.text}"
        return vfid

    def delete_vfolder(self, vfid, volume="local"):
        r = self.mgr("POST", "/folder/delete", json={"volume": volume, "vfid": vfid})
        assert r.status_code == 202, f"delete {vfid}: {r.status_code} {r.text}"
        return self.wait_task(r.json()["bgtask_id"])

    def snapshot(self):
        """The whole temporary tree (config, state, volumes), minus the daemon's log."""
        return tree_state(self.root, exclude=(LOG_NAME,))


def start_daemon(root, start_kw=None, **kw):
    """A started Daemon(root, **kw); start_kw goes to Daemon.start."""
    d = Daemon(root, **kw)
    try:
        d.start(**(start_kw or {}))
    except BaseException:
        d.kill()
        raise
    return d


@contextlib.contextmanager
def running_daemon(root, volumes=None, **kw):
    """A started daemon for a `with` block (or a fixture's yield): stopped at the end with its
    clean exit asserted, and killed whatever happens. `volumes` maps extra volume names to the
    paths their [volume.*] sections in `extra_toml` name, for vfolder_path()."""
    d = start_daemon(root, **kw)
    d.volumes.update(volumes or {})
    try:
        yield d
    finally:
        try:
            d.stop()
        finally:
            d.kill()


def problem(r):
    """Asserts an RFC 7807 error body and returns it."""
    assert r.headers.get("Content-Type", "").startswith("application/problem+json"), (
        f"{r.status_code} with Content-Type {r.headers.get('Content-Type')!r}: {r.text[:300]}"
    )
    return r.json()


# --------------------------------------------------------------------------- loop file systems


class LoopMount:
    """A file system on a loop device: `mnt` its mount point, `dev` the device (/dev/loopN)."""

    def __init__(self, mnt, dev):
        self.mnt = Path(mnt)
        self.dev = dev


@contextlib.contextmanager
def loop_mount(kind, size=None):
    """A throw-away loop-mounted file system made by tests/tools/<kind>-loop.sh (btrfs, xfs,
    ext4), always unmounted and detached at the end; leftovers of crashed runs are swept first."""
    tool = REPO / "tests" / "tools" / f"{kind}-loop.sh"
    subprocess.run([str(tool), "sweep"], capture_output=True, check=False)
    d = tempfile.mkdtemp(prefix=f"sluice-{kind}-{os.getpid()}-", dir="/tmp")
    try:
        r = subprocess.run(
            [str(tool), "up", d, *([size] if size else [])],
            capture_output=True,
            text=True,
            env={**os.environ, f"SLUICE_{kind.upper()}_OWNER": str(os.getpid())},
        )
        if r.returncode != 0:
            pytest.fail(f"{kind}-loop.sh up failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        yield LoopMount(r.stdout.strip().splitlines()[-1], Path(d, "loopdev").read_text().strip())
    finally:
        subprocess.run([str(tool), "down", d], check=False)


@contextlib.contextmanager
def read_throttle(dev, bytes_per_second):
    """A cgroup whose processes read block device `dev` (/dev/loopN) at most this fast: cgroup
    v2's io.max where the io controller is enabled, else v1's blkio throttle. Yields the file a
    process writes its pid to to join (see join_cgroup); removes the cgroup at the end."""
    st = os.stat(dev)
    majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    name = f"sluice-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    v2 = Path("/sys/fs/cgroup")
    v1 = Path("/sys/fs/cgroup/blkio")
    if (v2 / "cgroup.controllers").exists() and "io" in (v2 / "cgroup.subtree_control").read_text():
        cg = v2 / name
        cg.mkdir()
        (cg / "io.max").write_text(f"{majmin} rbps={bytes_per_second}\n")
    elif (v1 / "blkio.throttle.read_bps_device").exists():
        cg = v1 / name
        cg.mkdir()
        (cg / "blkio.throttle.read_bps_device").write_text(f"{majmin} {bytes_per_second}\n")
    else:
        pytest.fail("no cgroup I/O throttle here (neither v2 io.max nor v1 blkio)")
    try:
        yield cg / "cgroup.procs"
    finally:
        # Processes that joined must be gone before the group can go.
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            warnings.warn(f"cgroup {cg} could not be removed (a process still in it?)")


def join_cgroup(procs_file):
    """A preexec_fn: the child process joins the cgroup before it runs."""
    def join():
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))
    return join


# --------------------------------------------------------------------------- CephFS


CEPH_TOOL = REPO / "tests" / "tools" / "ceph-cluster.sh"
CEPH_UP_TIMEOUT = 180  # the tool starts a cluster in ~10-15 s; each of its steps has a timeout
CEPH_DOWN_TIMEOUT = 120


class CephCluster:
    """A throw-away single-node Ceph cluster made by tests/tools/ceph-cluster.sh: `dir` holds
    everything, `conf` is its ceph.conf (auth none: any client id, no keyring), `mnt` the
    ceph-fuse mount of its one file system ("cephfs")."""

    def __init__(self, dir, mnt):
        self.dir = Path(dir)
        self.conf = self.dir / "ceph.conf"
        self.mnt = Path(mnt)

    def ceph(self, *args, timeout=30):
        """`ceph ARGS` against this cluster; returns the CompletedProcess (text, not checked)."""
        return subprocess.run(
            ["ceph", "-c", str(self.conf), "--connect-timeout", "5", *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@contextlib.contextmanager
def ceph_cluster(size=None, extra_conf=None):
    """Context manager: brings up a cluster (memstore OSD of `size`, e.g. "2G"; `extra_conf`
    lines appended to ceph.conf) and always tears it down. Leftovers of a crashed run are swept
    first; the cluster's owner is this process, so a later sweep removes it if we die."""
    subprocess.run([str(CEPH_TOOL), "sweep"], capture_output=True, check=False,
                   timeout=CEPH_DOWN_TIMEOUT)
    d = tempfile.mkdtemp(prefix=f"sluice-ceph-{os.getpid()}-", dir="/tmp")
    env = {**os.environ, "SLUICE_CEPH_OWNER": str(os.getpid())}
    if extra_conf:
        env["SLUICE_CEPH_CONF"] = extra_conf
    try:
        try:
            r = subprocess.run(
                [str(CEPH_TOOL), "up", d, *([str(size)] if size else [])],
                capture_output=True,
                text=True,
                env=env,
                timeout=CEPH_UP_TIMEOUT,
            )
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
            pytest.fail(f"ceph-cluster.sh up did not finish within {CEPH_UP_TIMEOUT}s:\n"
                        f"{err or ''}")
        if r.returncode != 0:
            pytest.fail(f"ceph-cluster.sh up failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        yield CephCluster(d, r.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run([str(CEPH_TOOL), "down", d], check=False, timeout=CEPH_DOWN_TIMEOUT)


@pytest.fixture(scope="session")
def cephfs_cluster():
    """One CephFS cluster for the whole test session (~10-15 s to start): tests share it, so
    each works in its own fresh directory below `cephfs_mount`."""
    with ceph_cluster(size="2G") as c:
        yield c


@pytest.fixture(scope="session")
def cephfs_mount(cephfs_cluster):
    """The session cluster's ceph-fuse mount point (a Path)."""
    return cephfs_cluster.mnt


# --------------------------------------------------------------------------- fixtures


def pytest_configure(config):
    # Tests talk HTTPS to a self-signed certificate on purpose.
    config.addinivalue_line("filterwarnings", "ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(scope="session", autouse=True)
def sluiced_binary():
    if not os.access(SLUICED, os.X_OK):
        pytest.fail(f"no sluiced executable at {SLUICED}: build it, or set SLUICE_BIN_DIR")
    return SLUICED


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One default daemon per test module; tests use fresh vfids."""
    with running_daemon(tmp_path_factory.mktemp("sluiced")) as d:
        yield d


@pytest.fixture
def make_daemon(tmp_path):
    """Factory for daemons with custom config; each is stopped (exit code checked) afterwards."""
    started = []

    def make(**kw):
        d = start_daemon(tmp_path / f"d{len(started)}", **kw)
        started.append(d)
        return d

    yield make
    errors = []
    for d in started:
        try:
            d.stop()
        except BaseException as e:  # stop all, report the first failure
            errors.append(e)
        finally:
            d.kill()
    if errors:
        raise errors[0]


@pytest.fixture
def vfid(daemon):
    """A fresh, created vfolder on the module daemon's `local` volume."""
    return daemon.create_vfolder()


def fd_limit(n):
    """A preexec_fn for a daemon started with `ulimit -n n`."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
