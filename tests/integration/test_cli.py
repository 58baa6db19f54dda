"""The `sluice` command-line client, end to end against a real `sluiced`.

Self-contained: this module starts its own daemons (stdlib only) and runs the `sluice` binary as a
user would, checking its output, its exit statuses and the effect on disk.
"""

import hashlib
import json
import os
import pty
import re
import signal
import socket
import stat
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import free_ports, through_fifo

REPO = Path(__file__).resolve().parents[2]
BIN_DIR = Path(os.environ.get("SLUICE_BIN_DIR") or REPO / "build" / "release" / "bin")
SLUICE = BIN_DIR / "sluice"
SLUICED = BIN_DIR / "sluiced"

SECRET = "cli-test-manager-secret"
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ERROR_RE = re.compile(r"^sluice: .+ \(HTTP (\d{3})\)$", re.M)

LEAF_COMMANDS = [
    ["s3", "user", "create"],
    ["s3", "user", "list"],
    ["s3", "user", "delete"],
    ["s3", "key", "create"],
    ["s3", "key", "list"],
    ["s3", "key", "revoke"],
    ["s3", "bucket", "bind"],
    ["s3", "bucket", "list"],
    ["s3", "bucket", "unbind"],
    ["volumes"],
    ["volume", "info"],
    ["scope", "create"],
    ["scope", "show"],
    ["scope", "set-limit"],
    ["scope", "unset-limit"],
    ["scope", "delete"],
    ["vfolder", "create"],
    ["vfolder", "delete"],
    ["vfolder", "clone"],
    ["vfolder", "usage"],
    ["vfolder", "mount"],
    ["vfolder", "ls"],
    ["vfolder", "mkdir"],
    ["vfolder", "mv"],
    ["vfolder", "rm"],
    ["vfolder", "get"],
    ["task", "show"],
    ["task", "wait"],
    ["task", "list"],
]
GROUP_COMMANDS = [["volume"], ["scope"], ["vfolder"], ["task"], ["s3"], ["s3", "user"],
                  ["s3", "key"], ["s3", "bucket"]]


# --------------------------------------------------------------------------- helpers


def new_qsid():
    return f"user:{uuid.uuid4()}"


def new_vfid(qsid=None):
    return f"{qsid or new_qsid()}/{uuid.uuid4().hex}"


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(extra)
    return env


def tree(root):
    """{relpath: (kind, detail)} below root; symlinks not followed."""
    out = {}
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None)
            else:
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return out


class Daemon:
    def __init__(self, root, tls=None):
        self.root = Path(root)
        self.vol = self.root / "vol"
        self.vol.mkdir(parents=True)
        self.client_port, self.port, self.internal_port = free_ports(3)
        self.scheme = "https" if tls else "http"
        manager = [
            f'service-addr = {{ host = "127.0.0.1", port = {self.port} }}',
            f'internal-addr = {{ host = "127.0.0.1", port = {self.internal_port} }}',
            f'secret = "{SECRET}"',
        ]
        if tls:
            manager += [
                "ssl-enabled = true",
                f"ssl-cert = {json.dumps(str(tls[0]))}",
                f"ssl-privkey = {json.dumps(str(tls[1]))}",
            ]
        config = "\n".join(
            [
                "[storage-proxy]",
                'secret = "cli-test-token-secret"',
                "allow-auto-quota-scope-creation = true",
                "[api.client]",
                f'service-addr = {{ host = "127.0.0.1", port = {self.client_port} }}',
                "[api.manager]",
                *manager,
                "[sluice]",
                f"state-dir = {json.dumps(str(self.root / 'state'))}",
                "[volume.local]",
                'backend = "vfs"',
                f"path = {json.dumps(str(self.vol))}",
                "",
            ]
        )
        self.config = self.root / "storage-proxy.toml"
        self.config.write_text(config)
        self.log = self.root / "sluiced.log"
        self.proc = None

    @property
    def endpoint(self):
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self):
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(SLUICED), "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )
        deadline = time.monotonic() + 15
        url = f"http://127.0.0.1:{self.internal_port}/health"
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"sluiced exited early:\n{self.log.read_text()}"
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        pytest.fail(f"sluiced did not become healthy:\n{self.log.read_text()}")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("sluiced did not stop on SIGTERM")

    def scope_path(self, qsid):
        return self.vol / uuid.UUID(qsid.split(":", 1)[1]).hex

    def vfolder_path(self, vfid):
        qsid, hexid = vfid.rsplit("/", 1)
        return self.scope_path(qsid) / hexid[0:2] / hexid[2:4] / hexid[4:]


def run(*args, env=None, cwd=None, timeout=60, stderr=subprocess.PIPE):
    return subprocess.run(
        [str(SLUICE), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=timeout,
    )


class Cli:
    """Runs `sluice` against one daemon with the right token, from an empty directory."""

    def __init__(self, daemon, cwd):
        self.d = daemon
        self.cwd = cwd

    def raw(self, *args, **kw):
        kw.setdefault("cwd", self.cwd)
        return run("--endpoint", self.d.endpoint, "--token", SECRET, *args, **kw)

    def __call__(self, *args, rc=0, **kw):
        p = self.raw(*args, **kw)
        assert p.returncode == rc, (
            f"sluice {' '.join(map(str, args))}: exit {p.returncode}, wanted {rc}\n"
            f"stdout: {p.stdout[:2000]!r}\nstderr: {p.stderr[:2000]!r}"
        )
        return p

    def out(self, *args, **kw):
        return self(*args, **kw).stdout.decode()

    def json(self, *args, **kw):
        p = self("--json", *args, **kw)
        return json.loads(p.stdout)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("cli-daemon"))
    d.start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def cli(daemon, tmp_path):
    work = tmp_path / "cwd"
    work.mkdir()
    return Cli(daemon, work)


@pytest.fixture
def vfid(cli):
    v = new_vfid()
    cli("vfolder", "create", "local", v)
    return v


def test_binaries_exist():
    assert os.access(SLUICE, os.X_OK), f"no sluice at {SLUICE}: build it or set SLUICE_BIN_DIR"
    assert os.access(SLUICED, os.X_OK), f"no sluiced at {SLUICED}"


# --------------------------------------------------------------------------- help and usage


def test_root_help_lists_commands_and_exit_codes():
    p = run("--help")
    assert p.returncode == 0
    out = p.stdout.decode()
    assert "Usage: sluice" in out
    for group in ("volumes", "volume", "scope", "vfolder", "task"):
        assert re.search(rf"^\s+{group}\s", out, re.M), group
    assert "Exit status" in out
    for code, word in [(0, "success"), (2, "usage"), (3, "not found"), (4, "conflict"),
                       (5, "auth"), (6, "cannot connect")]:
        assert re.search(rf"^\s+{code}\s+.*{word}", out, re.M | re.I), (code, word)


@pytest.mark.parametrize("cmd", GROUP_COMMANDS + LEAF_COMMANDS, ids=" ".join)
def test_every_command_has_help(cmd):
    p = run(*cmd, "--help")
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert f"Usage: sluice {' '.join(cmd)}" in out, out
    if cmd in LEAF_COMMANDS:
        assert f"Example:\n  sluice {' '.join(cmd)}" in out, out


def test_version():
    p = run("--version")
    assert p.returncode == 0
    assert re.match(rb"^sluice \d+\.\d+\.\d+\n$", p.stdout), p.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],  # no command
        ["scope"],  # group without a command
        ["scope", "create", "local"],  # missing QSID
        ["vfolder", "clone", "local", "a", "local"],  # missing DST_VFID
        ["vfolder", "frobnicate"],
        ["volumes", "--no-such-option"],
        ["scope", "set-limit", "local", "user:x", "12zz"],  # bad size
        ["scope", "create", "local", "user:x", "--limit", "lots"],
        ["vfolder", "create", "local", "x", "--mode", "999"],  # not octal
        ["--timeout", "0", "volumes"],
        ["--endpoint", "ftp://127.0.0.1:1", "volumes"],  # bad URL: caught before connecting
        ["--endpoint", "http://127.0.0.1:99999", "volumes"],
        ["--token-file", "/nonexistent/token", "volumes"],
    ],
    ids=lambda a: " ".join(a) or "<none>",
)
def test_usage_errors_exit_2(args, tmp_path):
    # A closed port: had any of these reached the network, the exit status would be 6.
    (port,) = free_ports(1)
    p = run(*args, env=clean_env(SLUICE_ENDPOINT=f"http://127.0.0.1:{port}"), cwd=tmp_path)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.strip(), "a usage error must say what is wrong"
    assert p.stdout == b""


# --------------------------------------------------------------------------- volumes


def test_volumes(cli, daemon):
    out = cli.out("volumes")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "BACKEND", "PATH", "CAPABILITIES"]
    row = lines[1].split()
    assert row[:3] == ["local", "vfs", str(daemon.vol)]
    assert set(row[3].split(",")) >= {"vfolder", "quota"}
    j = cli.json("volumes")
    assert [v["name"] for v in j["volumes"]] == ["local"]
    assert j["volumes"][0]["path"] == str(daemon.vol)


def test_volume_info(cli):
    out = cli.out("volume", "info", "local")
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())
    assert fields["VOLUME"] == "local"
    assert fields["STATUS"] == "healthy"
    assert re.match(r"^[\d.]+ [KMGTPE]iB \(\d+ bytes\)$", fields["CAPACITY"]), fields
    assert "READS" in fields and "WRITES" in fields
    j = cli.json("volume", "info", "local")
    assert j["hwinfo"]["status"] == "healthy"
    st = os.statvfs(cli.d.vol)
    assert j["fs_usage"]["capacity_bytes"] == st.f_blocks * st.f_frsize
    assert set(j["performance_metric"]["metric"]) >= {"iops_read", "io_bytes_write"}
    p = cli.raw("volume", "info", "nosuchvolume")
    assert p.returncode == 3, p.stderr
    assert ERROR_RE.search(p.stderr.decode()).group(1) == "400"


# --------------------------------------------------------------------------- quota scopes


def test_scope_lifecycle(cli, daemon):
    q = new_qsid()
    assert "created quota scope" in cli.out("scope", "create", "local", q, "--limit", "1.5GiB")
    assert daemon.scope_path(q).is_dir()

    out = cli.out("scope", "show", "local", q)
    assert re.search(r"^LIMIT\s+1\.5 GiB \(1610612736 bytes\)$", out, re.M), out
    assert re.search(r"^USED\s+0 bytes$", out, re.M), out
    assert cli.json("scope", "show", "local", q) == {"used_bytes": 0, "limit_bytes": 1610612736}

    cli("scope", "set-limit", "local", q, "10g")
    assert cli.json("scope", "show", "local", q)["limit_bytes"] == 10 << 30
    j = cli.json("scope", "set-limit", "local", q, "512m")
    assert j == {"status": "ok", "volume": "local", "qsid": q, "limit_bytes": 512 << 20}
    cli("scope", "set-limit", "local", q, "4096")
    assert cli.json("scope", "show", "local", q)["limit_bytes"] == 4096

    cli("scope", "unset-limit", "local", q)
    assert cli.json("scope", "show", "local", q)["limit_bytes"] is None
    assert re.search(r"^LIMIT\s+none$", cli.out("scope", "show", "local", q), re.M)

    p = cli("scope", "create", "local", q, rc=4)
    assert ERROR_RE.search(p.stderr.decode()).group(1) == "409"

    cli("scope", "delete", "local", q)
    assert not daemon.scope_path(q).exists()
    p = cli("scope", "show", "local", q, rc=3)
    assert ERROR_RE.search(p.stderr.decode()).group(1) == "404"
    cli("scope", "delete", "local", q, rc=3)
    cli("scope", "unset-limit", "local", q, rc=3)


def test_scope_with_vfolders_cannot_be_deleted(cli, daemon):
    q = new_qsid()
    v = new_vfid(q)
    cli("vfolder", "create", "local", v)
    cli("scope", "delete", "local", q, rc=4)
    assert daemon.vfolder_path(v).is_dir()


# --------------------------------------------------------------------------- vfolders


def test_vfolder_create_mode_and_scope_limit(cli, daemon):
    q = new_qsid()
    v = new_vfid(q)
    j = cli.json("vfolder", "create", "local", v, "--mode", "750", "--scope-limit", "1g")
    assert j["status"] == "ok" and j["vfid"] == v
    path = daemon.vfolder_path(v)
    assert path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert cli.json("scope", "show", "local", q)["limit_bytes"] == 1 << 30

    p = cli("vfolder", "create", "local", v, rc=4)
    err = p.stderr.decode()
    assert ERROR_RE.search(err).group(1) == "409", err
    assert p.stdout == b""


def test_vfolder_missing_is_not_found(cli):
    v = new_vfid()
    for args in (["vfolder", "usage", "local", v], ["vfolder", "ls", "local", v],
                 ["vfolder", "mount", "local", v], ["vfolder", "delete", "local", v]):
        p = cli(*args, rc=3)
        assert ERROR_RE.search(p.stderr.decode()), p.stderr
        assert p.stdout == b""


def test_mount_usage_and_file_ops(cli, daemon, vfid):
    root = daemon.vfolder_path(vfid)
    assert cli.out("vfolder", "mount", "local", vfid).strip() == str(root)
    assert cli.json("vfolder", "mount", "local", vfid, "sub")["path"] == str(root / "sub")

    cli("vfolder", "mkdir", "local", vfid, "a/b", "c")
    assert (root / "a" / "b").is_dir() and (root / "c").is_dir()
    (root / "a" / "data.bin").write_bytes(b"x" * 3000)
    os.symlink("data.bin", root / "a" / "link")

    lines = cli.out("vfolder", "ls", "local", vfid, "a").splitlines()
    assert lines[0].split()[:3] == ["NAME", "TYPE", "SIZE"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:]}
    assert rows["b"][1] == "dir"
    assert rows["data.bin"][1:4] == ["file", "2.9", "KiB"]
    assert rows["link"][1:4] == ["->", "data.bin", "link"]
    by_bytes = cli.out("vfolder", "ls", "local", vfid, "a", "--bytes")
    assert re.search(r"^data\.bin\s+file\s+3000\s", by_bytes, re.M), by_bytes
    items = {i["name"]: i for i in cli.json("vfolder", "ls", "local", vfid, "a")["items"]}
    assert items["data.bin"]["type"] == "FILE" and items["data.bin"]["stat"]["size"] == 3000
    assert items["link"]["type"] == "SYMLINK"
    top = cli.out("vfolder", "ls", "local", vfid).splitlines()[1:]
    assert sorted(ln.split()[0] for ln in top) == ["a", "c"]

    usage = cli.json("vfolder", "usage", "local", vfid)
    assert usage["used_bytes"] >= 3000
    assert re.search(r"^FILES\s+\d+$", cli.out("vfolder", "usage", "local", vfid), re.M)

    cli("vfolder", "mv", "local", vfid, "a/data.bin", "c/moved.bin")
    assert (root / "c" / "moved.bin").read_bytes() == b"x" * 3000
    assert not (root / "a" / "data.bin").exists()
    cli("vfolder", "mv", "local", vfid, "nope", "c/nope", rc=3)

    p = cli("vfolder", "rm", "local", vfid, "c", rc=4)  # a directory needs -r
    assert ERROR_RE.search(p.stderr.decode()).group(1) == "400"  # ENOTEMPTY, exit code "conflict"
    assert (root / "c" / "moved.bin").exists()
    cli("vfolder", "rm", "local", vfid, "a/link")
    assert not os.path.lexists(root / "a" / "link")
    assert cli.json("vfolder", "rm", "local", vfid, "-r", "c") == {"status": "ok"}
    assert not (root / "c").exists()


def test_mkdir_batches_partial_failure_and_flags(cli, daemon, vfid):
    root = daemon.vfolder_path(vfid)
    many = [f"d{i:03}" for i in range(120)]  # more than the daemon takes in one request
    j = cli.json("vfolder", "mkdir", "local", vfid, *many)
    assert len(j["results"]["success"]) == 120 and j["results"]["failed"] == []
    assert all((root / d).is_dir() for d in many)

    p = cli("vfolder", "mkdir", "local", vfid, "d000", "fresh", rc=1)
    assert "d000" in p.stderr.decode()
    assert (root / "fresh").is_dir()
    cli("vfolder", "mkdir", "local", vfid, "d000", "fresh", "--exist-ok")
    cli("vfolder", "mkdir", "local", vfid, "x/y/z", "--no-parents", rc=1)
    assert not (root / "x").exists()
    cli("vfolder", "mkdir", "local", vfid, "x/y/z")
    assert (root / "x" / "y" / "z").is_dir()


def test_get_streams_to_stdout_and_file(cli, daemon, vfid, tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 123)  # several read chunks
    (daemon.vfolder_path(vfid) / "blob.bin").write_bytes(data)

    p = cli("vfolder", "get", "local", vfid, "blob.bin")
    assert p.stdout == data
    out = tmp_path / "dl" / "blob.bin"
    out.parent.mkdir()
    assert "wrote 3 MiB" in cli.out("vfolder", "get", "local", vfid, "blob.bin", "-o", out)
    assert out.read_bytes() == data
    j = cli.json("vfolder", "get", "local", vfid, "blob.bin", "-o", out)
    assert j == {"status": "ok", "path": str(out), "bytes": len(data)}

    # A directory gets the file under its own name.
    j = cli.json("vfolder", "get", "local", vfid, "blob.bin", "-o", out.parent)
    assert j["path"] == str(out) and out.read_bytes() == data
    # A FIFO (or /dev/null) is written in place, not replaced by a renamed temporary file.
    fifo = tmp_path / "dl" / "fifo"
    _, got = through_fifo(fifo, lambda: cli("vfolder", "get", "local", vfid, "blob.bin", "-o",
                                            fifo))
    assert got == data and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    os.unlink(fifo)

    missing = tmp_path / "dl" / "missing.bin"
    p = cli("vfolder", "get", "local", vfid, "missing.bin", "-o", missing, rc=3)
    assert ERROR_RE.search(p.stderr.decode()).group(1) == "400"
    assert sorted(os.listdir(out.parent)) == ["blob.bin"]  # no partial or temporary file
    p = cli("vfolder", "get", "local", vfid, "missing.bin", rc=3)
    assert p.stdout == b""


def test_clone_waits_and_copies(cli, daemon, vfid):
    src = daemon.vfolder_path(vfid)
    (src / "dir" / "sub").mkdir(parents=True)
    (src / "dir" / "a.txt").write_text("alpha")
    (src / "dir" / "sub" / "b.bin").write_bytes(os.urandom(200_000))
    (src / "empty").mkdir()
    os.symlink("dir/a.txt", src / "link")

    dst = new_vfid()  # another scope: created on the way
    p = cli("vfolder", "clone", "local", vfid, "local", dst)
    out = p.stdout.decode()
    assert out.startswith("cloned ") and dst in out, out
    assert p.stderr == b"", "no progress output when stderr is not a terminal"
    assert tree(daemon.vfolder_path(dst)) == tree(src)

    dst2 = new_vfid()
    task = cli.json("vfolder", "clone", "local", vfid, "local", dst2)
    assert task["status"] == "completed" and task["kind"] == "vfolder-clone"
    assert tree(daemon.vfolder_path(dst2)) == tree(src)

    cli("vfolder", "clone", "local", vfid, "local", dst, rc=4)  # destination exists


def test_delete_waits_then_folder_is_gone(cli, daemon, vfid):
    path = daemon.vfolder_path(vfid)
    (path / "f").write_text("x")
    p = cli("vfolder", "delete", "local", vfid)
    assert p.stdout.decode().startswith("deleted vfolder"), p.stdout
    assert not path.exists()
    # Deleting it again: the daemon answers 410 Gone, which is "not found" for scripts.
    p = cli("vfolder", "delete", "local", vfid, rc=3)
    assert ERROR_RE.search(p.stderr.decode()).group(1) == "410"


def test_no_wait_and_task_commands(cli, daemon):
    v = new_vfid()
    cli("vfolder", "create", "local", v)
    task_id = cli.out("vfolder", "delete", "local", v, "--no-wait").strip()
    assert UUID_RE.match(task_id), task_id

    assert "completed" in cli.out("task", "wait", task_id)
    assert not daemon.vfolder_path(v).exists()
    t = cli.json("task", "show", task_id)
    assert t["task_id"] == task_id and t["status"] == "completed" and t["kind"] == "vfolder-delete"
    out = cli.out("task", "show", task_id)
    assert re.search(r"^STATUS\s+completed$", out, re.M), out
    assert task_id in cli.out("task", "list")
    assert task_id in [x["task_id"] for x in cli.json("task", "list")["tasks"]]

    v2 = new_vfid()
    cli("vfolder", "create", "local", v2)
    j = cli.json("vfolder", "delete", "local", v2, "--no-wait")
    assert UUID_RE.match(j["bgtask_id"])
    assert cli.json("task", "wait", j["bgtask_id"])["status"] == "completed"

    unknown = str(uuid.uuid4())
    cli("task", "show", unknown, rc=3)
    cli("task", "wait", unknown, rc=3)


def test_failed_task_exits_1(cli, daemon, vfid):
    (daemon.vfolder_path(vfid) / "big").write_bytes(b"z" * 64 * 1024)
    q = new_qsid()
    cli("scope", "create", "local", q, "--limit", "1k")  # too small for the clone
    dst = new_vfid(q)
    p = cli("vfolder", "clone", "local", vfid, "local", dst, rc=1)
    err = p.stderr.decode()
    assert re.search(r"^sluice: task [0-9a-f-]+ \(vfolder-clone\) failed: .+", err, re.M), err
    assert not daemon.vfolder_path(dst).exists()

    task_id = cli.out("vfolder", "clone", "local", vfid, "local", new_vfid(q), "--no-wait").strip()
    p = cli("task", "wait", task_id, rc=1)
    assert "failed" in p.stderr.decode()
    t = json.loads(cli("--json", "task", "show", task_id, rc=1).stdout)
    assert t["status"] == "failed" and t["error"]["msg"]
    assert re.search(r"^ERROR\s+\S", cli("task", "show", task_id, rc=1).stdout.decode(), re.M)


def test_progress_spinner_only_on_a_terminal(cli, daemon, vfid):
    (daemon.vfolder_path(vfid) / "f").write_bytes(b"y" * 1000)
    master, slave = pty.openpty()
    try:
        p = cli("vfolder", "clone", "local", vfid, "local", new_vfid(), stderr=slave)
        os.close(slave)
        slave = None
        chunks = []
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:  # EIO once the terminal has no writer left
                break
            if not b:
                break
            chunks.append(b)
        err = b"".join(chunks)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert b"\r" in err and b"cloning" in err, err
    assert err.endswith(b"\r\x1b[K"), err  # the line is cleared before the result is printed
    assert p.stdout.decode().startswith("cloned ")


# --------------------------------------------------------------------------- errors and exit codes


def test_wrong_or_missing_token_exits_5(daemon, tmp_path):
    p = run("--endpoint", daemon.endpoint, "--token", "wrong", "volumes", cwd=tmp_path)
    assert p.returncode == 5, p.stderr
    assert ERROR_RE.search(p.stderr.decode()).group(1) == "403"
    assert p.stdout == b""
    p = run("--endpoint", daemon.endpoint, "volumes", cwd=tmp_path)  # no token anywhere
    assert p.returncode == 5, p.stderr
    assert "token" in p.stderr.decode()


def test_closed_port_exits_6(tmp_path):
    (port,) = free_ports(1)
    t0 = time.monotonic()
    p = run("--endpoint", f"http://127.0.0.1:{port}", "--token", "t", "volumes", cwd=tmp_path)
    assert p.returncode == 6, p.stderr
    assert "cannot connect" in p.stderr.decode()
    assert time.monotonic() - t0 < 10


def test_silent_daemon_times_out_with_6(tmp_path):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)  # accepts connections (backlog) but never answers
    try:
        t0 = time.monotonic()
        p = run("--endpoint", f"http://127.0.0.1:{srv.getsockname()[1]}", "--token", "t",
                "--timeout", "0.5", "volumes", cwd=tmp_path, timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        srv.close()
    assert p.returncode == 6, p.stderr
    assert "timed out" in p.stderr.decode()
    assert elapsed < 10


def test_token_and_endpoint_sources(daemon, tmp_path):
    # Environment.
    p = run("volumes", env=clean_env(SLUICE_ENDPOINT=daemon.endpoint, SLUICE_TOKEN=SECRET),
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # --token-file, which beats $SLUICE_TOKEN.
    tf = tmp_path / "token"
    tf.write_text(SECRET + "\n")
    p = run("--token-file", tf, "volumes",
            env=clean_env(SLUICE_ENDPOINT=daemon.endpoint, SLUICE_TOKEN="wrong"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # --token beats everything.
    p = run("--token", SECRET, "--token-file", tmp_path / "nonexistent-is-not-read", "volumes",
            env=clean_env(SLUICE_ENDPOINT=daemon.endpoint, SLUICE_TOKEN="wrong"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    # The default file, ./var/secrets/manager.secret, as sluiced writes it.
    secrets = tmp_path / "var" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "manager.secret").write_text(SECRET + "\n")
    p = run("--endpoint", daemon.endpoint, "volumes", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (secrets / "manager.secret").write_text("stale\n")
    p = run("--endpoint", daemon.endpoint, "volumes", cwd=tmp_path)
    assert p.returncode == 5, p.stderr


def test_global_options_after_the_command(cli, vfid):
    j = json.loads(cli("vfolder", "usage", "local", vfid, "--json").stdout)
    assert {"file_count", "used_bytes", "measured_at", "age_seconds"} <= set(j)


def test_json_output_parses_for_every_read_command(cli, vfid):
    q = vfid.rsplit("/", 1)[0]
    for args in (
        ["volumes"],
        ["volume", "info", "local"],
        ["scope", "show", "local", q],
        ["vfolder", "usage", "local", vfid],
        ["vfolder", "mount", "local", vfid],
        ["vfolder", "ls", "local", vfid],
        ["vfolder", "mkdir", "local", vfid, "j"],
        ["vfolder", "mv", "local", vfid, "j", "k"],
        ["vfolder", "rm", "local", vfid, "-r", "k"],
        ["task", "list"],
    ):
        j = cli.json(*args)
        assert isinstance(j, dict) and j, args


def openssl(*args, cwd):
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=120,
                   cwd=cwd)


def test_https_with_insecure(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
            "-keyout", key, "-out", cert, cwd=tmp_path)
    d = Daemon(tmp_path / "tls", tls=(cert, key))
    d.start()
    try:
        assert d.endpoint.startswith("https://")
        p = run("--endpoint", d.endpoint, "--token", SECRET, "--insecure", "volumes", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert b"local" in p.stdout
        # A self-signed certificate is refused without --insecure.
        p = run("--endpoint", d.endpoint, "--token", SECRET, "volumes", cwd=tmp_path)
        assert p.returncode == 6, p.stderr
        assert "certificate" in p.stderr.decode().lower()
        # Plain HTTP to a TLS listener fails cleanly too.
        p = run("--endpoint", d.endpoint.replace("https", "http"), "--token", SECRET,
                "--timeout", "5", "volumes", cwd=tmp_path)
        assert p.returncode == 6, p.stderr
    finally:
        d.stop()


def test_https_verifies_ca_and_host(tmp_path):
    # A private CA (trusted through SSL_CERT_FILE) signs a certificate for 127.0.0.1 only.
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=tmp_path)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=sluice-test",
            "-keyout", "srv.key", "-out", "srv.csr", cwd=tmp_path)
    (tmp_path / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", "ext.cnf", "-out", "srv.pem",
            cwd=tmp_path)
    d = Daemon(tmp_path / "tls", tls=(tmp_path / "srv.pem", tmp_path / "srv.key"))
    d.start()
    try:
        env = clean_env(SSL_CERT_FILE=str(tmp_path / "ca.pem"), SLUICE_TOKEN=SECRET)
        p = run("--endpoint", d.endpoint, "vfolder", "ls", "local", new_vfid(), env=env,
                cwd=tmp_path)
        assert p.returncode == 3, p.stderr  # verified, connected, and the daemon answered 404
        # The same certificate does not name "localhost".
        p = run("--endpoint", f"https://localhost:{d.port}", "volumes", env=env, cwd=tmp_path)
        assert p.returncode == 6, p.stderr
        assert "not for 'localhost'" in p.stderr.decode(), p.stderr
        # Without the CA the chain is untrusted.
        p = run("--endpoint", d.endpoint, "volumes", env=clean_env(SLUICE_TOKEN=SECRET),
                cwd=tmp_path)
        assert p.returncode == 6, p.stderr
    finally:
        d.stop()
