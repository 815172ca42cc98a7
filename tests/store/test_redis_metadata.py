"""RedisMetadata against a real redis-server: what one master writes, a fresh backend (a restarted master) reads."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.store.redis_metadata import RedisMetadata
from kvpool.tiers.types import Tier
from tests.store.cluster import redis_server  # noqa: F401 - fixture


def _rec(i: int, node: str = "n1", tier: Tier = Tier.DRAM) -> ObjectRecord:
    return ObjectRecord(key=i.to_bytes(16, "big"), ns_digest=b"N" * 16, node_id=node, tier=tier, offset=4096 * i,
                        size=1000 + i, checksum=(1 << 63) + i)


def test_objects_and_nodes_survive_a_new_backend(redis_server):
    a = RedisMetadata(redis_server.url, prefix="t")
    a.put_node(NodeInfo(node_id="n1", address="127.0.0.1:1", dram_bytes=1 << 20, dram_path="/dev/shm/x"))
    a.put_node(NodeInfo(node_id="n2", dram_bytes=2 << 20, ssd_bytes=4 << 20, ssd_record_overhead=64))
    a.put_objects([_rec(i) for i in range(5)] + [_rec(i, "n2", Tier.SSD) for i in range(5, 8)])
    a.put_objects([_rec(2, "n1", Tier.SSD)])  # a tier move is an upsert
    a.delete_objects([_rec(0).key, _rec(6).key])
    a.put_node_endpoint("n1", b"\x00\x01endpoint")
    secret = a.shared_secret()
    a.close()

    b = RedisMetadata(redis_server.url, prefix="t")
    got = sorted(b.load_objects(), key=lambda r: r.key)
    want = [_rec(1), _rec(2, "n1", Tier.SSD), _rec(3), _rec(4), _rec(5, "n2", Tier.SSD), _rec(7, "n2", Tier.SSD)]
    assert got == want
    assert [n.node_id for n in b.load_nodes()] == ["n1", "n2"]
    assert b.load_nodes()[0] == NodeInfo(node_id="n1", address="127.0.0.1:1", dram_bytes=1 << 20,
                                         dram_path="/dev/shm/x")
    assert b.load_node_endpoints() == {"n1": b"\x00\x01endpoint"}
    assert b.shared_secret() == secret and len(secret) == 32
    assert b.count_objects() == 6

    b.delete_node("n2")
    assert sorted(r.key for r in b.load_objects()) == [_rec(i).key for i in (1, 2, 3, 4)]
    assert [n.node_id for n in b.load_nodes()] == ["n1"]
    b.delete_node_objects("n1")     # a node that left or restarted: its records, not its registration
    assert b.load_objects() == [] and [n.node_id for n in b.load_nodes()] == ["n1"]
    assert RedisMetadata(redis_server.url, prefix="other").load_objects() == []


def test_a_thousand_key_commit_is_batched(redis_server):
    m = RedisMetadata(redis_server.url)
    m.put_objects(_rec(i) for i in range(10_000))
    assert m.count_objects() == 10_000
    m.delete_objects([_rec(i).key for i in range(0, 10_000, 2)])
    assert sorted(r.key for r in m.load_objects()) == [_rec(i).key for i in range(1, 10_000, 2)]


def test_bad_url_and_prefix_name_the_argument(redis_server):
    with pytest.raises(ValueError, match="redis_url"):
        RedisMetadata("127.0.0.1:6379")
    with pytest.raises(ValueError, match="prefix"):
        RedisMetadata(redis_server.url, prefix="a:b")


def test_sentinel_urls_parse_or_name_what_is_wrong():
    from kvpool.store.redis_metadata import parse_sentinel_url

    assert parse_sentinel_url("redis+sentinel://:pw@10.0.0.1:26379,h2:26380/kvpool/2?wait_replicas=1") == {
        "sentinels": [("10.0.0.1", 26379), ("h2", 26380)], "service": "kvpool", "db": 2, "password": "pw",
        "wait_replicas": 1, "wait_timeout_ms": 1000, "failover_timeout_s": 15.0}
    assert parse_sentinel_url("redis+sentinel://h:1/s")["db"] == 0
    for bad, message in [("redis+sentinel://h/s", "sentinel 'h' must be host:port"),
                         ("redis+sentinel://h:1", "must look like redis\\+sentinel://"),
                         ("redis+sentinel://h:1/s/x", "must look like redis\\+sentinel://"),
                         ("redis+sentinel://h:1/s?wait=1", r"unknown option\(s\) \['wait'\]"),
                         ("redis+sentinel://h:1/s?wait_replicas=x", "must be integers"),
                         ("redis+sentinel://h:1/s?failover_timeout_s=0", "failover_timeout_s > 0")]:
        with pytest.raises(ValueError, match=message):
            parse_sentinel_url(bad)


def test_a_write_short_of_its_replicas_is_metadata_unavailable(tmp_path):
    """wait_replicas=1 with no replica connected: the write fails (the master answers UNAVAILABLE), never 'done'."""
    from kvpool.store.metadata import MetadataUnavailable
    from tests.faults.harness import Sentinel

    sentinel = Sentinel(tmp_path).start()
    try:
        m = RedisMetadata(sentinel.url + "?wait_replicas=1&wait_timeout_ms=200", prefix="t")
        m.put_objects([_rec(1)])  # the replica acknowledges it
        replica = next(s for s in sentinel.servers if s.port != sentinel.primary_port())
        replica.kill()
        with pytest.raises(MetadataUnavailable, match=r"reached 0 of 1 replica\(s\) within 200 ms"):
            m.put_objects([_rec(2)])
        m.close()
    finally:
        sentinel.close()


def test_a_pinned_record_keeps_its_pin_end_and_an_unpinned_one_stays_41_bytes(redis_server):
    a = RedisMetadata(redis_server.url, prefix="pins")
    pinned = dataclasses.replace(_rec(1), pinned_until=1_800_000_123.5)
    a.put_objects([pinned, _rec(2)])
    assert sorted(len(v) for v in a._r.hvals("pins:obj:n1")) == [41, 49]
    assert sorted(RedisMetadata(redis_server.url, prefix="pins").load_objects(), key=lambda r: r.key) == \
        [pinned, _rec(2)]


def test_a_nodes_registration_time_capabilities_are_not_stored_and_unknown_fields_are_dropped(redis_server):
    """What a node says anew at each registration (`ssd_index_rows`) is not journalled, so a master rolled back to
    an older version still loads what a newer one stored; and fields this version does not know (a newer master's)
    are dropped as the nodes load, not a crash."""
    import json

    import redis

    a = RedisMetadata(redis_server.url, prefix="caps")
    a.put_node(NodeInfo(node_id="n1", dram_bytes=1 << 20, dram_path="/dev/shm/x", ssd_index_rows=True))
    raw = redis.Redis.from_url(redis_server.url)
    try:
        stored = json.loads(raw.hget("caps:nodes", "n1"))
        assert "ssd_index_rows" not in stored and stored["dram_path"] == "/dev/shm/x"
        raw.hset("caps:nodes", "n2", json.dumps({**stored, "node_id": "n2", "from_the_future": 7}))
    finally:
        raw.close()
    assert a.load_nodes() == [NodeInfo(node_id="n1", dram_bytes=1 << 20, dram_path="/dev/shm/x"),
                              NodeInfo(node_id="n2", dram_bytes=1 << 20, dram_path="/dev/shm/x")]
    a.close()
