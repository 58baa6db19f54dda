"""The event-bus tooling itself (tests/integration/eventbus.py): real redis-server and etcd, and
the manager-style consumer and its strict decoders. No sluiced involved."""

import json
import uuid

import msgpack
import pytest
import redis

from eventbus import (
    EventDecodeError,
    ManagerConsumer,
    decode,
    etcd_server,
    parse_vfid,
    put_redis_config,
    redis_server,
)

SCOPE = uuid.uuid4()
VFID = f"user:{SCOPE}/{uuid.uuid4().hex}"
DST_VFID = f"project:{uuid.uuid4()}/{uuid.uuid4().hex}"


def gen_c(name, source="storage", metadata=b'{"request_id":null,"user":null}', **payload):
    fields = {b"name": name.encode(), b"source": source.encode(),
              b"payload": json.dumps(payload).encode()}
    if metadata is not None:
        fields[b"metadata"] = metadata
    return fields


def gen_a(name, *args, source="storage"):
    return {b"name": name.encode(), b"source": source.encode(),
            b"args": msgpack.packb(args, use_bin_type=True)}


@pytest.fixture
def rs(tmp_path):
    with redis_server(tmp_path) as s:
        yield s


@pytest.fixture
def consumer(rs):
    c = ManagerConsumer(rs.client())
    c.create_group()
    return c


def test_redis_restart_keeps_port_and_loses_state(rs):
    port = rs.port
    c = rs.client()
    c.set("k", "v")
    rs.restart()
    assert rs.port == port and rs.addr == f"127.0.0.1:{port}"
    assert c.ping()  # the same client reconnects
    assert c.get("k") is None  # no persistence: an outage loses the stream and its groups


def test_redis_password(tmp_path):
    with redis_server(tmp_path, password="s3cret") as s:
        assert s.client().ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=s.port).ping()


def test_etcd_put_get_prefix_and_redis_config(tmp_path):
    with etcd_server(tmp_path) as etcd:
        put_redis_config(etcd, "local", "127.0.0.1:6390")
        put_redis_config(etcd, "local", "127.0.0.1:6391", password="pw", node_id="node-1")
        etcd.put("/sorna/localx/config/redis/addr", "elsewhere")
        assert etcd.get_prefix("/sorna/local/") == {
            "/sorna/local/config/redis/addr": "127.0.0.1:6390",
            "/sorna/local/nodes/storage/node-1/config/redis/addr": "127.0.0.1:6391",
            "/sorna/local/nodes/storage/node-1/config/redis/password": "pw",
        }
        assert etcd.get_prefix("/nothing/") == {}


def test_consumer_decodes_generation_c(rs, consumer):
    rs.client().xadd("events", gen_c("vfolder_clone_failure", vfid=VFID, dst_vfid=DST_VFID,
                                     message="no space"), maxlen=128, approximate=True)
    [ev] = consumer.collect(1, timeout=5)
    assert (ev.name, ev.source, ev.vfid, ev.dst_vfid, ev.message) == (
        "vfolder_clone_failure", "storage", VFID, DST_VFID, "no space")
    assert ev.args is None and json.loads(ev.payload_json)["vfid"] == VFID
    assert ev.metadata == {"request_id": None, "user": None}
    assert consumer.redis.xpending("events", "manager")["pending"] == 0  # acked


def test_consumer_decodes_generation_a(rs, consumer):
    rs.client().xadd("events", gen_a("vfolder_deletion_failure", VFID, "busy"))
    [ev] = consumer.collect(1, timeout=5)
    assert (ev.name, ev.vfid, ev.dst_vfid, ev.message, ev.args) == (
        "vfolder_deletion_failure", VFID, None, "busy", (VFID, "busy"))
    assert ev.payload_json is None and ev.metadata is None
    assert consumer.drain(0.1) == []


def test_both_generations_in_one_entry_must_agree():
    fields = {**gen_a("vfolder_clone_success", VFID, DST_VFID),
              **gen_c("vfolder_clone_success", vfid=VFID, dst_vfid=DST_VFID)}
    ev = decode(fields)
    assert ev.args == (VFID, DST_VFID) and ev.payload_json is not None
    fields[b"args"] = msgpack.packb((VFID, VFID))
    with pytest.raises(EventDecodeError, match="disagree"):
        decode(fields)


def test_group_made_at_dollar_misses_earlier_entries(rs):
    c = rs.client()
    c.xadd("events", gen_a("vfolder_deletion_success", VFID))
    consumer = ManagerConsumer(c)
    consumer.create_group()
    consumer.create_group()  # BUSYGROUP is ignored
    assert consumer.read(timeout=0.2) == []
    c.xadd("events", gen_a("vfolder_deletion_success", DST_VFID))
    assert [ev.vfid for ev in consumer.collect(1, timeout=5)] == [DST_VFID]


def test_consumer_remakes_group_after_outage(rs, consumer):
    rs.restart()  # stream and group gone: XREADGROUP answers NOGROUP
    assert consumer.read(timeout=0.2) == []
    rs.client().xadd("events", gen_a("vfolder_deletion_success", VFID))
    assert [ev.vfid for ev in consumer.collect(1, timeout=5)] == [VFID]


def test_parse_vfid():
    scope, folder = uuid.uuid4(), uuid.uuid4()
    assert parse_vfid(f"USER:{scope.hex}/{folder.hex}") == ("user", scope, folder)
    assert parse_vfid(f"project:{scope}/{folder}") == ("project", scope, folder)
    assert parse_vfid(folder.hex) == (None, None, folder)


@pytest.mark.parametrize("fields, error", [
    (gen_c("vfolder_deletion_success", vfid=f"group:{SCOPE}/{uuid.uuid4().hex}"), "scope type"),
    (gen_c("vfolder_deletion_success", vfid=f"user:{SCOPE}/xyz"), "no VFolderID"),
    (gen_c("vfolder_deletion_success", vfid=f"user:{SCOPE}/"), "no VFolderID"),
    (gen_a("vfolder_deletion_success", VFID.encode()), "must be a str"),
    (gen_a("vfolder_deletion_failure", VFID, b"busy"), "must be a str"),
    (gen_a("vfolder_deletion_failure", VFID), "array of 2"),
    (gen_c("vfolder_deletion_failure", vfid=VFID, message=3), "must be a str"),
    (gen_c("vfolder_clone_success", vfid=VFID), "lacks"),
    (gen_c("vfolder_deletion_success", metadata=b'{"request_id":null,"x":1}', vfid=VFID),
     "metadata"),
    (gen_c("vfolder_exploded", vfid=VFID), "unknown event"),
    ({b"name": b"vfolder_deletion_success", b"source": b"s"}, "neither"),
    ({**gen_a("vfolder_deletion_success", VFID), b"_retry_count": b"1"}, "_retry_count"),
])
def test_strict_decoder_rejects(fields, error):
    with pytest.raises(EventDecodeError, match=error):
        decode(fields)
