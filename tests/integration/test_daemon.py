"""The sluiced process: embedded default, config handling, signals, TLS."""

import hashlib
import os
import re
import signal
import stat
import subprocess
import time
import tomllib

import requests

from conftest import (
    AUTH_HEADER,
    SLUICED,
    Daemon,
    free_ports,
    ports_free,
    run_sluiced,
    tail,
    terminate,
    toml_section,
    wait_http_ok,
)

DEFAULT_PORTS = (6021, 6022, 6023)


def check_fresh_state(proc, log_path, state, manager_port):
    """What a first start on an empty state dir must leave, and a working manager API."""
    wait_http_ok(f"http://127.0.0.1:{manager_port}/health", proc, log_path)
    local = state / "volumes" / "local"
    assert (local / "version.txt").read_text() == "3\n"
    for name in ("manager.secret", "token.secret"):
        p = state / "secrets" / name
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, name
        assert p.read_text().strip()
    secret = (state / "secrets" / "manager.secret").read_text().strip()
    r = requests.get(
        f"http://127.0.0.1:{manager_port}/volumes", headers={AUTH_HEADER: secret}, timeout=10
    )
    assert r.status_code == 200, r.text
    vols = r.json()["volumes"]
    assert [(v["name"], v["backend"]) for v in vols] == [("local", "vfs")]
    assert vols[0]["path"] == str(local)
    r = requests.get(f"http://127.0.0.1:{manager_port}/volumes", timeout=10)
    assert r.status_code == 403
    assert terminate(proc, log_path) == 0, tail(log_path)


def dumped_default_config(tmp_path):
    """The --dump-default-config sample with free ports and paths under tmp_path."""
    r = run_sluiced("--dump-default-config")
    assert r.returncode == 0, r.stderr
    sample = tomllib.loads(r.stdout)
    assert sample["api"]["manager"]["service-addr"]["port"] == 6022
    ports = dict(zip(DEFAULT_PORTS, free_ports(3)))
    text = re.sub(r"port = (602[123])", lambda m: f"port = {ports[int(m.group(1))]}", r.stdout)
    state = tmp_path / "var"
    text = text.replace('"./var/volumes/local"', f'"{state}/volumes/local"')
    text = text.replace('"./var"', f'"{state}"')
    cfg = tomllib.loads(text)
    assert cfg["sluice"]["state-dir"] == str(state)
    assert cfg["volume"]["local"]["path"] == str(state / "volumes" / "local")
    assert cfg["api"]["manager"]["service-addr"]["port"] == ports[6022]
    path = tmp_path / "default.toml"
    path.write_text(text)
    return path, state, ports[6022]


def start_logged(tmp_path, *args):
    log_path = tmp_path / "sluiced.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(SLUICED), *map(str, args)], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
        )
    return proc, log_path


def run_default_config(tmp_path):
    path, state, manager_port = dumped_default_config(tmp_path)
    proc, log_path = start_logged(tmp_path, "--config", path)
    try:
        check_fresh_state(proc, log_path, state, manager_port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- (a) defaults


def test_embedded_default(tmp_path):
    """No config file: state and volume under --state-dir, secrets generated with mode 0600.

    The embedded default listens on 6021-6023; when another process holds one of them, the same
    first-start checks run on the dumped default config with free ports instead.
    """
    if not ports_free(DEFAULT_PORTS):
        return run_default_config(tmp_path)
    state = tmp_path / "var"
    proc, log_path = start_logged(tmp_path, "--state-dir", state)
    try:
        check_fresh_state(proc, log_path, state, 6022)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dump_default_config_starts(tmp_path):
    run_default_config(tmp_path)


def test_help():
    r = run_sluiced("--help")
    assert r.returncode == 0, r.stderr
    assert "--config" in r.stdout


# --------------------------------------------------------------------------- (b) halfstack


# Shaped like Backend.AI's configs/storage-proxy/halfstack.toml.
HALFSTACK_TOML = """[etcd]
namespace = "local"
addr = {{ host = "127.0.0.1", port = 8121 }}
user = ""
password = ""

[storage-proxy]
node-id = "i-local-storage-proxy"
num-proc = 2
event-loop = "uvloop"
scandir-limit = 1000
max-upload-size = "100g"
secret = "some-secret-private-for-storage-proxy"
session-expire = "1d"
use-watcher = false

[api.client]
service-addr = {{ host = "127.0.0.1", port = {client} }}
ssl-enabled = false

[api.manager]
service-addr = {{ host = "127.0.0.1", port = {manager} }}
internal-addr = {{ host = "127.0.0.1", port = {internal} }}
ssl-enabled = false
secret = "some-secret-shared-with-manager"

[debug]
enabled = false
asyncio = false
enhanced-aiomonitor-task-info = true

[logging]
level = "INFO"
drivers = ["console"]

[logging.pkg-ns]
"" = "WARNING"
"aiotools" = "INFO"
"aiohttp" = "INFO"
"ai.backend" = "INFO"

[logging.console]
colored = true
format = "verbose"

[pyroscope]
enabled = false
app-name = "backendai-half-storage-proxy"
server-addr = "http://localhost:4040"
sample-rate = 100

[volume.volume1]
backend = "vfs"
path = "{vol}"
"""


def test_halfstack_config(tmp_path):
    """A Backend.AI halfstack storage-proxy.toml starts; what Sluice ignores is warned about."""
    vol = tmp_path / "vfroot" / "local"
    vol.mkdir(parents=True)

    def text(d):
        return HALFSTACK_TOML.format(
            client=d.client_port, manager=d.manager_port, internal=d.internal_port, vol=vol
        )

    d = Daemon(tmp_path / "d", config_text=text, secret="some-secret-shared-with-manager")
    d.start()
    try:
        r = d.mgr("GET", "/volumes")
        assert r.status_code == 200, r.text
        assert [v["name"] for v in r.json()["volumes"]] == ["volume1"]
        log_lines = d.log().splitlines()
        for what in ("[logging]", "[debug]", "[pyroscope]", "event-loop", "use-watcher"):
            hits = [line for line in log_lines if what in line]
            assert hits, f"no log line mentions {what}\n{d.log()}"
            assert any(re.search(r"warn", line, re.I) for line in hits), hits
    finally:
        try:
            d.stop()
        finally:
            d.kill()


# --------------------------------------------------------------------------- (c-f) bad configs


def config_with(tmp_path, storage_proxy=None, volume_path=None, volume_options=None):
    client, manager, internal = free_ports(3)
    vol = tmp_path / "vol"
    vol.mkdir(exist_ok=True)
    sp = {"node-id": "it-node", "num-proc": 2, "secret": "s"}
    sp.update(storage_proxy or {})
    text = "\n".join(
        [
            toml_section("storage-proxy", sp),
            toml_section("api.client", {"service-addr": {"host": "127.0.0.1", "port": client}}),
            toml_section(
                "api.manager",
                {
                    "service-addr": {"host": "127.0.0.1", "port": manager},
                    "internal-addr": {"host": "127.0.0.1", "port": internal},
                    "secret": "m",
                },
            ),
            toml_section("sluice", {"state-dir": str(tmp_path / "state")}),
            toml_section("volume.local", {"backend": "vfs", "path": str(volume_path or vol)}),
            toml_section("volume.local.options", volume_options) if volume_options else "",
        ]
    )
    path = tmp_path / "storage-proxy.toml"
    path.write_text(text)
    return path


def assert_refused(tmp_path, path, key):
    t0 = time.monotonic()
    r = run_sluiced("--config", path, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert time.monotonic() - t0 < 5
    assert key in r.stderr, r.stderr


def test_unknown_key_is_refused(tmp_path):
    path = config_with(tmp_path, storage_proxy={"node-idd": "x"})
    assert_refused(tmp_path, path, "storage-proxy.node-idd")


def test_bad_value_is_refused(tmp_path):
    path = config_with(tmp_path, storage_proxy={"num-proc": "four"})
    assert_refused(tmp_path, path, "storage-proxy.num-proc")


def test_missing_volume_path_is_refused(tmp_path):
    path = config_with(tmp_path, volume_path=tmp_path / "no" / "such" / "dir")
    assert_refused(tmp_path, path, "volume.local.path")
    assert not (tmp_path / "no").exists()


def test_check_config(tmp_path):
    path = config_with(tmp_path)
    r = run_sluiced("--check-config", "--config", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = config_with(tmp_path, storage_proxy={"node-idd": "x"})
    r = run_sluiced("--check-config", "--config", path, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    # Backend options are checked too, naming the key.
    for options, expect in (
        ({"usage-reconcile-interval": "soon"}, "usage-reconcile-interval"),
        ({"colour": "blue"}, "unknown key 'colour'"),
    ):
        path = config_with(tmp_path, volume_options=options)
        r = run_sluiced("--check-config", "--config", path, cwd=tmp_path)
        assert r.returncode == 2 and expect in r.stderr, (r.stdout, r.stderr)
    path = config_with(tmp_path, volume_options={"usage-walk-budget": "0s"})
    r = run_sluiced("--check-config", "--config", path, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- (g) drain


def test_sigterm_drains_inflight_fetch(make_daemon):
    d = make_daemon()
    vfid = d.create_vfolder()
    data = os.urandom(64 << 20)
    (d.vfolder_path(vfid) / "big.bin").write_bytes(data)
    r = d.mgr(
        "POST",
        "/folder/file/fetch",
        json={"volume": "local", "vfid": vfid, "relpath": "big.bin"},
        stream=True,
    )
    assert r.status_code == 200
    h = hashlib.sha256()
    h.update(r.raw.read(1 << 20))
    d.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert d.proc.poll() is None, "sluiced exited with a response still being sent"
    for chunk in iter(lambda: r.raw.read(1 << 20), b""):
        h.update(chunk)
        time.sleep(0.002)  # a slow reader
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert d.proc.wait(timeout=10) == 0, d.log()


def test_sigterm_with_idle_keepalive_connections(make_daemon):
    """Idle keep-alive connections do not hold up the drain (drain-timeout is 30 s)."""
    d = make_daemon()
    sessions = [requests.Session() for _ in range(4)]
    for s in sessions:
        for _ in range(3):
            r = s.get(d.url("/volumes"), headers={AUTH_HEADER: d.secret}, timeout=10)
            assert r.status_code == 200
    t0 = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=10) == 0, d.log()
    assert time.monotonic() - t0 < 5, "drain waited on idle connections"
    for s in sessions:
        s.close()


# --------------------------------------------------------------------------- TLS


def test_tls_manager_listener(make_daemon, tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost".split()
    subprocess.run([*cmd, "-keyout", key, "-out", cert], check=True, capture_output=True)
    d = make_daemon(manager={"ssl-enabled": True, "ssl-cert": str(cert), "ssl-privkey": str(key)})
    assert d.url("/").startswith("https://")
    r = d.mgr("GET", "/volumes")
    assert r.status_code == 200, r.text
    assert r.json()["volumes"][0]["name"] == "local"
    assert d.mgr("GET", "/volumes", token=False).status_code == 403
    # Plain HTTP on the TLS port gets no answer.
    try:
        plain = requests.get(f"http://127.0.0.1:{d.manager_port}/health", timeout=5)
        assert plain.status_code != 200
    except requests.RequestException:
        pass
