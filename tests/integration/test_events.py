"""Clone and delete completion events on Backend.AI's event bus, with a real redis-server and etcd.

The stream is consumed the way the manager consumes it (consumer group "manager" created at "$",
XREADGROUP, XACK) and every entry is decoded with the manager's schema, strictly
(eventbus.decode: the JSON `payload` and the msgpack `args` both, and they must agree).
"""

import uuid

import pytest

from conftest import running_daemon, toml_section, write_tree
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


def test_no_bus_configured_still_completes(tmp_path):
    with running_daemon(tmp_path / "d") as d:
        v = dashed_vfid()
        create(d, v)
        r = d.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": v})
        assert d.wait_task(r.json()["bgtask_id"])["status"] == "completed"
        assert "no event bus" in d.log()
