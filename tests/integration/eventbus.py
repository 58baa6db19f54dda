"""Backend.AI event-bus tooling for the integration tests: a real redis-server and etcd on free
loopback ports (all state in a temporary directory), and a consumer that reads the `events`
stream the way the Backend.AI manager does, with the manager's decoders, made strict so that an
entry the manager would choke on fails the test instead of passing silently.

Wire format: /work/research/event_bus.md, sections 0-2 (stream entry) and 4 (etcd keys).
"""

import base64
import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import msgpack
import redis
import requests

from conftest import free_ports, tail

START_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0

REDIS_STREAM_DB = 4  # Backend.AI's REDIS_STREAM_DB
STREAM_KEY = "events"  # anycast_stream_key
MANAGER_GROUP = "manager"  # EVENT_DISPATCHER_CONSUMER_GROUP
READ_COUNT = 64  # the manager's _DEFAULT_READ_COUNT

# Event name -> the positional tuple its `deserialize` indexes (generation A/B) and the fields
# its pydantic model requires (generation C): the same names in the same order.
VFOLDER_EVENTS = {
    "vfolder_deletion_success": ("vfid",),
    "vfolder_deletion_failure": ("vfid", "message"),
    "vfolder_clone_success": ("vfid", "dst_vfid"),
    "vfolder_clone_failure": ("vfid", "dst_vfid", "message"),
}
METADATA_KEYS = {"request_id", "user"}


# --------------------------------------------------------------------------- processes


def _die_with_parent():
    """preexec_fn: the daemon gets SIGKILL when the test process dies, so a pytest killed by a
    timeout leaves no redis-server or etcd behind (the `finally` blocks never run then)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _spawn(proc, argv, log_path):
    """Starts argv, logging to log_path; proc is the caller's current one, which must be gone.
    Start daemons from the main thread: PDEATHSIG follows the thread that forked."""
    if proc is not None and proc.poll() is None:
        raise RuntimeError(f"{argv[0]} is already running (pid {proc.pid}); stop it first")
    # ETCD_* variables of the caller's environment would configure our etcd as well.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)


def _stop(proc):
    """SIGTERM, then SIGKILL if it does not exit in time; always reaps the pid."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ready(what, proc, log_path, probe, timeout=START_TIMEOUT):
    """Calls probe() until it returns truthy; raises with the log tail if the process exits or
    the deadline passes (killing it then, so a half-started daemon never lingers)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting\n"
                               f"--- log tail ---\n{tail(log_path)}")
        try:
            if probe():
                return
        except Exception as e:  # noqa: BLE001 - any failure means "not yet"
            last = repr(e)
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{what} not ready within {timeout}s (last: {last})\n"
                       f"--- log tail ---\n{tail(log_path)}")


class RedisServer:
    """A redis-server without persistence: a restart is an outage that also loses the stream and
    its consumer groups, as a Redis without AOF/RDB does."""

    def __init__(self, dir, port=None, password=None):
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_ports(1)[0]
        self.password = password
        self.log_path = self.dir / "redis.log"
        self.proc = None

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no"]
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = _spawn(self.proc, argv, self.log_path)
        probe = self.client(db=0, socket_timeout=1, socket_connect_timeout=1)
        try:
            # The pid check: a stranger that took the port meanwhile must not pass for ours.
            _wait_ready(f"redis-server on {self.addr}", self.proc, self.log_path,
                        lambda: probe.info("server")["process_id"] == self.proc.pid)
        finally:
            probe.close()
        return self

    def stop(self):
        _stop(self.proc)
        self.proc = None

    def restart(self):
        """Stop, then start again on the same port (SO_REUSEADDR: no TIME_WAIT trouble)."""
        self.stop()
        return self.start()

    def client(self, db=REDIS_STREAM_DB, **kw):
        """Bytes in, bytes out, like the manager's client. The socket timeout bounds every
        command, so a blocked XREADGROUP must ask for less (ManagerConsumer does)."""
        kw.setdefault("socket_timeout", 10)
        kw.setdefault("socket_connect_timeout", 5)
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, password=self.password, **kw)


class EtcdServer:
    """A single-member etcd 3.4, spoken to through its v3 JSON gateway (no python3-etcd3, whose
    generated protobuf code breaks with newer protobuf)."""

    def __init__(self, dir):
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.client_port, self.peer_port = free_ports(2)
        self.log_path = self.dir / "etcd.log"
        self.proc = None

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.client_port}"

    def start(self):
        client = f"http://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = _spawn(self.proc, [
            "etcd", "--name", "it", "--data-dir", str(self.dir / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"it={peer}", "--initial-cluster-state", "new",
            # One member: a short election gets it a leader (and so health) sooner.
            "--heartbeat-interval", "10", "--election-timeout", "100",
            "--logger", "zap", "--log-outputs", "stderr",
        ], self.log_path)

        def healthy():
            r = requests.get(f"{client}/health", timeout=1)
            return r.status_code == 200 and r.json().get("health") == "true"

        _wait_ready(f"etcd on {self.endpoint}", self.proc, self.log_path, healthy)
        return self

    def stop(self):
        _stop(self.proc)
        self.proc = None

    def _call(self, method, body):
        r = requests.post(f"http://{self.endpoint}/v3/kv/{method}", json=body, timeout=5)
        r.raise_for_status()
        return r.json()

    def put(self, key, value):
        self._call("put", {"key": _b64(key), "value": _b64(value)})

    def get_prefix(self, prefix):
        """{key: value} (str) of every key starting with prefix."""
        raw = prefix.encode()
        end = bytearray(raw)
        while end and end[-1] == 0xFF:  # the etcd "prefix end": increment the last byte
            end.pop()
        if end:
            end[-1] += 1
        body = {"key": _b64(raw), "range_end": _b64(bytes(end) or b"\0")}
        kvs = self._call("range", body).get("kvs", [])  # absent when nothing matches
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
                for kv in kvs}


def _b64(s):
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def put_redis_config(etcd, namespace, redis_addr, password=None, node_id=None):
    """The keys Backend.AI's storage proxy reads with get_prefix("config/redis"): global scope,
    or with node_id the node scope, which wins over the global one."""
    scope = f"nodes/storage/{node_id}/" if node_id else ""
    base = f"/sorna/{namespace}/{scope}config/redis"
    etcd.put(f"{base}/addr", redis_addr)
    if password is not None:
        etcd.put(f"{base}/password", password)


@contextlib.contextmanager
def redis_server(tmp_path, **kw):
    """A started RedisServer in tmp_path/redis (kw: port, password), stopped at the end."""
    server = RedisServer(Path(tmp_path) / "redis", **kw)
    try:
        yield server.start()
    finally:
        server.stop()


@contextlib.contextmanager
def etcd_server(tmp_path):
    """A started EtcdServer in tmp_path/etcd, stopped at the end."""
    server = EtcdServer(Path(tmp_path) / "etcd")
    try:
        yield server.start()
    finally:
        server.stop()


# --------------------------------------------------------------------------- decoding


class EventDecodeError(ValueError):
    """The entry is one the manager would reject, misread or crash on."""


def parse_quota_scope_id(raw):
    """QuotaScopeID.parse: "<type>:<uuid>", type matched lowercased. -> (type, UUID)."""
    scope_type, _, rest = raw.partition(":")
    scope_type = scope_type.lower()
    if scope_type not in ("user", "project"):
        raise ValueError(f"invalid quota scope type {scope_type!r}")
    return scope_type, uuid.UUID(rest)


def parse_vfid(s):
    """VFolderID.from_str: -> (scope_type, scope_uuid, folder_uuid); the scope is (None, None)
    for a bare folder id. Raises ValueError/TypeError exactly where the manager would."""
    first, _, second = s.partition("/")
    if second:
        return (*parse_quota_scope_id(first), uuid.UUID(hex=second))
    return None, None, uuid.UUID(hex=first)


@dataclasses.dataclass
class Event:
    """One decoded entry. payload_json: the generation-C JSON text; args: the generation-A/B
    tuple; either is None when its field is absent (a reader of that generation would then reject
    the entry). fields: the raw stream entry."""

    name: str
    source: str
    vfid: str
    dst_vfid: str | None
    message: str | None
    payload_json: str | None
    args: tuple | None
    metadata: dict | None
    fields: dict
    entry_id: bytes | None = None


def _check_values(name, values):
    """The event's fields as its handler gets them; vfids must parse, message must be str."""
    for key in VFOLDER_EVENTS[name]:
        v = values[key]
        if not isinstance(v, str):
            raise EventDecodeError(f"{name}: {key} must be a str, got {type(v).__name__} {v!r}")
        if key != "message":
            try:
                parse_vfid(v)
            except (ValueError, TypeError) as e:
                raise EventDecodeError(f"{name}: {key} {v!r} is no VFolderID: {e}") from e
    return {k: values[k] if k in VFOLDER_EVENTS[name] else None
            for k in ("vfid", "dst_vfid", "message")}


def _event_name(name):
    if name not in VFOLDER_EVENTS:
        raise EventDecodeError(f"unknown event name {name!r}")
    return name


def decode_payload(name, payload):
    """Generation C: `payload` is the pydantic model's JSON; unknown keys are ignored."""
    _event_name(name)
    try:
        obj = json.loads(payload.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise EventDecodeError(f"{name}: payload is no UTF-8 JSON: {e}: {payload!r}") from e
    if not isinstance(obj, dict):
        raise EventDecodeError(f"{name}: payload is not a JSON object: {payload!r}")
    missing = [k for k in VFOLDER_EVENTS[name] if k not in obj]
    if missing:
        raise EventDecodeError(f"{name}: payload lacks {missing}: {payload!r}")
    return _check_values(name, obj)


def _reject_constant(c):
    raise ValueError(f"{c} is not JSON")  # Python's json takes NaN/Infinity; pydantic does not


def decode_args(name, args):
    """Generation A/B: `args` is msgpack of the positional tuple, unpacked with raw=False, so a
    bin element arrives as bytes and VFolderID.from_str fails on it. Stricter than the manager in
    one way: the arity must match exactly (serialize() never writes more)."""
    _event_name(name)
    try:
        value = msgpack.unpackb(args, raw=False, strict_map_key=False, use_list=False)
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types
        raise EventDecodeError(f"{name}: args is no msgpack: {e!r}: {args!r}") from e
    keys = VFOLDER_EVENTS[name]
    if not isinstance(value, tuple) or len(value) != len(keys):
        raise EventDecodeError(f"{name}: args must be a msgpack array of {len(keys)}: {value!r}")
    return _check_values(name, dict(zip(keys, value)))


def decode_metadata(raw):
    """MessageMetadata.deserialize does cls(**json): any key but request_id/user crashes it."""
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise EventDecodeError(f"metadata is no UTF-8 JSON: {e}: {raw!r}") from e
    if not isinstance(meta, dict) or not set(meta) <= METADATA_KEYS:
        raise EventDecodeError(f"metadata must be a JSON object with keys {sorted(METADATA_KEYS)}"
                               f" only: {raw!r}")
    if meta.get("request_id") is not None and not isinstance(meta["request_id"], str):
        raise EventDecodeError(f"metadata request_id must be a str or null: {raw!r}")
    return meta


def decode(fields, entry_id=None):
    """A stream entry as the manager reads it: `payload` (generation C) and/or `args` (A/B),
    at least one, and when both are present they must agree. `_retry_count` is rejected: only a
    consumer's redelivery writes it, never a producer. fields: {bytes: bytes}, as redis-py
    returns them."""
    try:
        name = fields[b"name"].decode("utf-8")
        source = fields[b"source"].decode("utf-8")
    except KeyError as e:
        raise EventDecodeError(f"entry lacks field {e}: {fields!r}") from e
    except UnicodeDecodeError as e:
        raise EventDecodeError(f"name/source not UTF-8: {fields!r}") from e
    _event_name(name)
    if b"_retry_count" in fields:
        raise EventDecodeError(f"a producer wrote _retry_count: {fields!r}")
    if b"payload" not in fields and b"args" not in fields:
        raise EventDecodeError(f"{name}: entry has neither payload nor args: {fields!r}")
    decoded = []
    payload_json = args = None
    if b"payload" in fields:
        decoded.append(decode_payload(name, fields[b"payload"]))
        payload_json = fields[b"payload"].decode()
    if b"args" in fields:
        decoded.append(decode_args(name, fields[b"args"]))
        args = msgpack.unpackb(fields[b"args"], raw=False, use_list=False)
    if len(decoded) == 2 and decoded[0] != decoded[1]:
        raise EventDecodeError(f"{name}: payload {decoded[0]} and args {decoded[1]} disagree")
    metadata = decode_metadata(fields[b"metadata"]) if b"metadata" in fields else None
    return Event(name=name, source=source, payload_json=payload_json, args=args,
                 metadata=metadata, fields=fields, entry_id=entry_id, **decoded[0])


# --------------------------------------------------------------------------- the consumer


class ManagerConsumer:
    """Reads `events` as a member of the manager's consumer group, with its commands: the group
    is made at `$` (entries older than the group are never delivered) and remade on NOGROUP
    (after a Redis restart without persistence), as the manager does."""

    def __init__(self, redis_client, stream=STREAM_KEY, group=MANAGER_GROUP, consumer="mgr-test"):
        self.redis = redis_client
        self.stream = stream
        self.group = group
        self.consumer = consumer

    def create_group(self):
        try:
            self.redis.xgroup_create(self.stream, self.group, id="$", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def read(self, timeout=5.0, count=READ_COUNT):
        """[(entry_id, fields)] of the first non-empty XREADGROUP ... > within timeout, else [].
        Connection errors (Redis down) are retried until the deadline, like the manager's loop."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            block = max(1, min(int(left * 1000), 2000))  # below the client's socket timeout
            try:
                reply = self.redis.xreadgroup(self.group, self.consumer, {self.stream: ">"},
                                              count=count, block=block)
            except redis.ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                self.create_group()
                reply = None
            except redis.ConnectionError:
                time.sleep(0.05)
                reply = None
            entries = [entry for _stream, items in reply or () for entry in items]
            if entries or time.monotonic() >= deadline:
                return entries

    def ack(self, entry_id):
        self.redis.xack(self.stream, self.group, entry_id)

    def collect(self, n, timeout=10.0):
        """n decoded events, each acked once decoded. Reads no more than n entries, so later
        events stay for the next call; raises TimeoutError with what did arrive."""
        events = []
        deadline = time.monotonic() + timeout
        while len(events) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{len(events)} of {n} events within {timeout}s: {events}")
            for entry_id, fields in self.read(timeout=left, count=n - len(events)):
                events.append(decode(fields, entry_id))
                self.ack(entry_id)
        return events

    def drain(self, timeout=0.5):
        """Every event that arrives within timeout (acked): [] asserts that nothing was sent."""
        events = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for entry_id, fields in self.read(timeout=left):
                events.append(decode(fields, entry_id))
                self.ack(entry_id)
        return events
