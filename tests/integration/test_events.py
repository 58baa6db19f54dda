"""Clone and delete completion events on Backend.AI's event bus, with a real redis-server and etcd.

The stream is consumed the way the manager consumes it (consumer group "manager" created at "$",
XREADGROUP, XACK) and every entry is decoded with the manager's schema, strictly
(eventbus.decode: the JSON `payload` and the msgpack `args` both, and they must agree).
"""

import contextlib
import json
import socket
import subprocess
import threading
import time
import uuid

import pytest

from conftest import running_daemon, start_daemon, toml_section, write_tree
from eventbus import ManagerConsumer, parse_vfid, put_redis_config, redis_server, etcd_server


def dashed_vfid():
    return f"user:{uuid.uuid4()}/{uuid.uuid4().hex}"


def bus_toml(redis=None, etcd=None, namespace="local"):
    parts = []
    if etcd:
        parts.append(toml_section("etcd", {"namespace": namespace, "addr": etcd.endpoint}))
    if redis:
        parts.append(toml_section("events", {"redis-addr": redis.addr, "retry-max": "1s"}))
    return "\n".join(parts)


def create(d, vfid):
    r = d.mgr("POST", "/folder/create", json={"volume": "local", "vfid": vfid, "options": {}})
    assert r.status_code == 204, r.text


def test_clone_and_delete_events_via_etcd(tmp_path):
    with redis_server(tmp_path / "redis") as redis, etcd_server(tmp_path / "etcd") as etcd:
        put_redis_config(etcd, "ns1", redis.addr)
        consumer = ManagerConsumer(redis.client())
        consumer.create_group()
        with running_daemon(tmp_path / "d", extra_toml=bus_toml(etcd=etcd, namespace="ns1")) as d:
            src, dst = dashed_vfid(), dashed_vfid()
            create(d, src)
            write_tree(d.vfolder_path(src), {"a.txt": b"a"})
            r = d.mgr("POST", "/folder/clone",
                      json={"src_volume": "local", "src_vfid": src, "dst_volume": "local", "dst_vfid": dst})  # fmt: skip
            assert r.status_code == 200, r.text
            (ev,) = consumer.collect(1, timeout=15)
            assert ev.name == "vfolder_clone_success"
            assert ev.vfid == src and ev.dst_vfid == dst
            assert parse_vfid(ev.vfid)[2] == uuid.UUID(src.split("/")[1])
            assert ev.source == "storage"

            r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": dst})
            assert r.status_code == 202, r.text
            (ev,) = consumer.collect(1, timeout=15)
            assert (ev.name, ev.vfid) == ("vfolder_deletion_success", dst)

            # A clone that fails (unmanaged source: cross-backend) reports failure, with a reason.
            other = dashed_vfid()
            r = d.mgr("POST", "/folder/clone",
                      json={"src_volume": "noop", "src_vfid": src, "dst_volume": "local", "dst_vfid": other})  # fmt: skip
            assert r.status_code == 200, r.text
            (ev,) = consumer.collect(1, timeout=15)
            assert ev.name == "vfolder_clone_failure" and ev.dst_vfid == other
            assert ev.message
            assert not d.vfolder_path(other).exists()


def test_events_survive_a_bus_outage_and_a_restart(tmp_path):
    with redis_server(tmp_path / "redis") as redis:
        consumer = ManagerConsumer(redis.client())
        consumer.create_group()
        vfids = [dashed_vfid() for _ in range(3)]
        with running_daemon(tmp_path / "d", extra_toml=bus_toml(redis=redis)) as d:
            for v in vfids:
                create(d, v)
            redis.stop()
            # Deleted while the bus is down: kept in the outbox.
            for v in vfids[:2]:
                r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": v})
                assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"
        # sluiced stopped with two events undelivered; one more while it is down is impossible,
        # so the third delete happens after the restart, with Redis back.
        redis.start()
        consumer = ManagerConsumer(redis.client())
        consumer.create_group()
        with running_daemon(tmp_path / "d", extra_toml=bus_toml(redis=redis)) as d:
            r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": vfids[2]})
            assert r.status_code == 202
            got = consumer.collect(3, timeout=20)
        assert [e.name for e in got] == ["vfolder_deletion_success"] * 3
        assert [e.vfid for e in got] == vfids  # in order


def test_a_clone_and_a_delete_cut_short_are_finished_and_announced(tmp_path):
    """sluiced is killed with a clone hung in its first step (the source's usage, slowed by an
    injected fault) and a delete queued behind it (one task thread). At the next start the
    clone's partial destination is removed and the clone announced failed, and the delete's
    tree is removed from the trash and announced: before, both were only marked 'interrupted'
    and the manager waited on CLONING and DELETE_ONGOING for good."""
    vol = tmp_path / "d" / "vol-faulty"
    vol.mkdir(parents=True)

    def faulty(rules):
        items = {"backend": "vfs", "path": str(vol)}
        if rules:
            items["faults"] = rules
        return toml_section("volume.faulty", items)

    def vfolder(d, vfid):
        r = d.mgr("POST", "/folder/create", json={"volume": "faulty", "vfid": vfid, "options": {}})
        assert r.status_code == 204, r.text

    src, dst, gone = dashed_vfid(), dashed_vfid(), dashed_vfid()
    with redis_server(tmp_path / "redis") as redis:
        consumer = ManagerConsumer(redis.client())
        consumer.create_group()
        slow = faulty([{"op": "usage", "latency": "60s"}])
        d = start_daemon(tmp_path / "d", sluice={"task-threads": 1},
                         extra_toml=bus_toml(redis=redis) + "\n" + slow)
        try:
            d.volumes["faulty"] = vol
            vfolder(d, src)
            vfolder(d, gone)
            write_tree(d.vfolder_path(src, "faulty"), {"a.txt": b"a"})
            write_tree(d.vfolder_path(gone, "faulty"), {"b.txt": b"b"})
            r = d.mgr("POST", "/folder/clone", json={"src_volume": "faulty", "src_vfid": src,
                                                     "dst_volume": "faulty", "dst_vfid": dst})
            assert r.status_code == 200, r.text
            r = d.mgr("POST", "/folder/delete", json={"volume": "faulty", "vfid": gone})
            assert r.status_code == 202, r.text
            assert d.vfolder_path(dst, "faulty").exists()  # made before the copy began
            assert not d.vfolder_path(gone, "faulty").exists()  # detached at once
            assert consumer.drain(timeout=1) == []  # neither has finished
        finally:
            d.kill()
        # Another vfolder's leftover in the trash that cannot go: not this delete's failure
        # (before, the resumed delete announced the whole trash's error as its own).
        trash = vol / ".sluice-trash"
        stuck = trash / ("0" * 32 + "-deadbeef") / "stuck"
        stuck.parent.mkdir(parents=True)
        stuck.write_bytes(b"s")
        subprocess.run(["chattr", "+i", str(stuck)], check=True)
        try:
            with running_daemon(tmp_path / "d",
                                extra_toml=bus_toml(redis=redis) + "\n" + faulty(None),
                                volumes={"faulty": vol}) as d:
                got = consumer.collect(2, timeout=20)
                assert sorted((e.name, e.vfid) for e in got) == sorted(
                    [("vfolder_clone_failure", src), ("vfolder_deletion_success", gone)]), got
                (clone,) = [e for e in got if e.name == "vfolder_clone_failure"]
                assert clone.dst_vfid == dst and "interrupted" in clone.message
                assert not d.vfolder_path(dst, "faulty").exists()
                assert d.vfolder_path(src, "faulty").exists()
                assert [p.name for p in trash.iterdir()] == [stuck.parent.name]
        finally:
            subprocess.run(["chattr", "-i", str(stuck)], check=True)


def test_a_clone_that_finished_copying_stands_after_a_restart(tmp_path):
    """A clone records that its copy ended (durably) before it announces success. A restart
    that finds its task cut short after that (here its last write is undone in tasks.db, as a
    kill or a power loss in that window leaves it) keeps the clone and announces success
    again. Before, it removed the clone the manager had heard succeed, and announced failure."""
    import sqlite3

    with redis_server(tmp_path / "redis") as redis:
        consumer = ManagerConsumer(redis.client())
        consumer.create_group()
        src, dst = dashed_vfid(), dashed_vfid()
        d = start_daemon(tmp_path / "d", extra_toml=bus_toml(redis=redis))
        try:
            create(d, src)
            write_tree(d.vfolder_path(src), {"a.txt": b"a"})
            r = d.mgr("POST", "/folder/clone",
                      json={"src_volume": "local", "src_vfid": src, "dst_volume": "local", "dst_vfid": dst})  # fmt: skip
            assert r.status_code == 200, r.text
            task = r.json()["bgtask_id"]
            assert d.wait_task(task)["status"] == "completed"
            (ev,) = consumer.collect(1, timeout=15)
            assert (ev.name, ev.vfid, ev.dst_vfid) == ("vfolder_clone_success", src, dst)
            state = d.state
        finally:
            d.kill()
        db = sqlite3.connect(state / "tasks.db")
        with db:
            assert db.execute("UPDATE tasks SET state = 1 WHERE id = ?", (task,)).rowcount == 1
        db.close()
        with running_daemon(tmp_path / "d", extra_toml=bus_toml(redis=redis)) as d:
            (ev,) = consumer.collect(1, timeout=20)
            assert (ev.name, ev.vfid, ev.dst_vfid) == ("vfolder_clone_success", src, dst)
            assert (d.vfolder_path(dst) / "a.txt").read_bytes() == b"a"


def test_no_bus_configured_still_completes(tmp_path):
    with running_daemon(tmp_path / "d") as d:
        v = dashed_vfid()
        create(d, v)
        r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": v})
        assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"
        assert "no event bus" in d.log()


@contextlib.contextmanager
def answering(handler_bytes):
    """A TCP server on a free port that answers every connection's first bytes with
    `handler_bytes(request)` until closed: a server that is not what the config says it is."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            with c:
                c.settimeout(2)
                try:
                    c.sendall(handler_bytes(c.recv(65536)))
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        done.set()
        t.join()
        srv.close()


def http_json(body):
    raw = json.dumps(body).encode()
    return lambda _req: (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(raw)) + raw


@pytest.mark.parametrize("answer", [
    {"kvs": [{"key": 5, "value": [1]}]},  # fields of the wrong types
    {"kvs": {"key": "a2V5"}},            # an object where etcd has a list
    {"kvs": ["x", None]},                # entries that are not objects
])
def test_an_etcd_address_that_answers_nonsense_is_a_warning(tmp_path, answer):
    """The event bus's lookup of Redis in etcd, answered in shapes etcd never sends: a warning,
    retried; the node goes on serving (a thrown type error on the bus's thread ended it)."""
    with answering(http_json(answer)) as addr:
        etcd = type("E", (), {"endpoint": addr})
        with running_daemon(tmp_path / "d", extra_toml=bus_toml(etcd=etcd)) as d:
            v = dashed_vfid()
            create(d, v)
            r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": v})
            assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"
            # Entries of the wrong shape are skipped (then no Redis address is found); an
            # answer not shaped as a range answer is named so.
            want = "not an etcd range answer" if isinstance(answer["kvs"], dict) else \
                "has no Redis address"
            deadline = time.monotonic() + 15
            while want not in d.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert want in d.log()
            assert d.proc.poll() is None
            create(d, dashed_vfid())  # still serving


def test_a_sentinel_that_answers_nil_is_a_warning(tmp_path):
    """A sentinel's answer to get-master-addr-by-name holding nil elements (not what Redis
    sends, but a reply of that type): a warning, retried, never read as strings."""
    with etcd_server(tmp_path / "etcd") as etcd, \
            answering(lambda _req: b"*2\r\n$-1\r\n$-1\r\n") as sentinel:
        etcd.put("/sorna/local/config/redis/sentinel", sentinel)
        etcd.put("/sorna/local/config/redis/service_name", "mymaster")
        with running_daemon(tmp_path / "d", extra_toml=bus_toml(etcd=etcd)) as d:
            v = dashed_vfid()
            create(d, v)
            r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": v})
            assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"
            want = "does not know master 'mymaster'"
            deadline = time.monotonic() + 15
            while want not in d.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert want in d.log()
            assert d.proc.poll() is None
            create(d, dashed_vfid())
