"""An object an admin removes while the node holding it is out of the pool stays removed when that node comes back.

Real processes: a master and an SSD-only node n1 holding 40 objects. n1 stops (SIGTERM) and is taken out of the
pool (`kvpool drain --no-migrate`): its objects are misses, its SSD file keeps their records. An admin then removes
10 of them (the master no longer knows them: `remove` answers 0) and evicts the namespace of 10 others, which the
test put under a namespace of their own. n1 starts again on the same SSD file and reports its records. Before
removal tombstones (store/tombstones.py) the master adopted every record it did not know, so the 20 removed objects
were hits again; now a record written before a removal of its key (or namespace) is dropped and erased by the node.
The other 20 are hits with their own bytes. Run twice: with a master on the memory backend, and with a master on
Redis that is killed and started again between the removals and the node's return (the tombstones come back from
Redis with it). With authentication on, a tenant's own removal of its keys while n1 is away does the same (before
2026-12-06's tenant key spaces it tombstoned only the objects the master still knew: none), and another tenant
naming the same key bytes removes nothing of it."""

from __future__ import annotations

import pytest

from kvpool import Namespace, PoolClient
from kvpool.admin import AdminClient
from kvpool.cli import main
from kvpool.launcher import free_port
from tests.store.cluster import cluster, key_of, pattern, start_redis  # noqa: F401 - the cluster fixture
from tests.store.test_secure_cluster import auth_args, write_tokens

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SIZE = 8192
OBJECTS = 40
REMOVED = range(0, 10)          # removed by key while n1 is away
PURGED = range(10, 20)          # in namespace NS, evicted while n1 is away
NS = Namespace(model="tombstones", fingerprint="away", kv_dtype="float32", block_tokens=16, num_layers=1,
               num_kv_heads=1, head_dim=128)


def _hits(address: str, objects=range(OBJECTS), token: str | None = None) -> dict[int, bool]:
    """Per object, whether a get returns exactly its bytes (a wrong byte fails the test)."""
    out = {}
    buf = bytearray(SIZE)
    with PoolClient(address, timeout=10, token=token) as c:
        for i in objects:                                   # one by one: a get stops at its first miss
            ns = {"namespace": NS} if i in PURGED else {}
            out[i] = bool(c.get_many_into([key_of(i)], [buf], **ns))
            assert not out[i] or bytes(buf) == pattern(i, SIZE), f"object {i}: wrong bytes"
    return out


@pytest.fixture(params=[False, True], ids=["memory", "redis-master-restarted"])
def redis(request, tmp_path):
    """None: the master on the memory backend; else a redis-server the master journals to (and restarts on)."""
    if not request.param:
        yield None
        return
    server = start_redis(tmp_path / "redis")
    try:
        yield server
    finally:
        server.kill()


def test_objects_removed_while_their_node_was_away_stay_removed_when_it_comes_back(cluster, capsys, redis):
    master_port = free_port()
    url = redis.url if redis is not None else None
    master = cluster.start_master(node_ttl_s=5.0, port=master_port, redis_url=url)
    port = free_port()
    node = cluster.start_node("n1", dram="0", ssd="16MiB", port=port)
    with PoolClient(master.address, timeout=10) as c:
        plain = [i for i in range(OBJECTS) if i not in PURGED]
        assert c.put_many([key_of(i) for i in plain], [pattern(i, SIZE) for i in plain]) == ["stored"] * len(plain)
        assert c.put_many([key_of(i) for i in PURGED], [pattern(i, SIZE) for i in PURGED],
                          namespace=NS) == ["stored"] * len(PURGED)
    assert _hits(master.address) == {i: True for i in range(OBJECTS)}
    assert node.stop(timeout=60) == 0
    with AdminClient(master.address) as admin:
        assert admin.drain("n1", migrate=False)["dropped"] == OBJECTS     # away: every object a miss
        assert admin.remove([key_of(i).hex() for i in REMOVED]) == 0      # the master no longer knows them
        assert admin.evict(namespace=NS.digest.hex()) == 0
    if redis is not None:                                               # the master goes down and comes back
        master.kill()
        master = cluster.start_master(node_ttl_s=5.0, port=master_port, redis_url=url)
    cluster.start_node("n1", dram="0", ssd="16MiB", port=port)           # serves once it has reported
    assert _hits(master.address) == {i: i not in REMOVED and i not in PURGED for i in range(OBJECTS)}
    with AdminClient(master.address) as admin:
        stats = admin.stats()
    assert (stats["tombstones"], stats["records_refused"]) == (len(REMOVED) + 1, len(REMOVED) + len(PURGED))
    assert main(["status", "--master", master.address]) == 0
    assert "removal tombstones 11 (folded 0), reported SSD records refused 20" in capsys.readouterr().out.splitlines()


def test_a_tenant_s_objects_removed_while_their_node_was_away_stay_removed(cluster, tmp_path):
    tokens = write_tokens(tmp_path / "tokens")
    master = cluster.start_master(node_ttl_s=5.0, extra=auth_args(tmp_path / "tokens"))
    node_auth = ["--auth-node-tokens", f"file:{tmp_path / 'tokens' / 'node.tokens'}"]
    port = free_port()
    node = cluster.start_node("n1", dram="0", ssd="16MiB", port=port, extra=node_auth)
    acme, beta = range(0, 20), range(20, 30)
    for tenant, objects in (("acme", acme), ("beta", beta)):
        with PoolClient(master.address, timeout=10, token=tokens[tenant]) as c:
            assert c.put_many([key_of(i) for i in objects], [pattern(i, SIZE) for i in objects]) == \
                ["stored"] * len(objects)
    assert node.stop(timeout=60) == 0
    with AdminClient(master.address, token=tokens["admin"]) as admin:
        assert admin.drain("n1", migrate=False)["dropped"] == len(acme) + len(beta)
    with PoolClient(master.address, timeout=10, token=tokens["acme"]) as c:
        assert c.remove_many([key_of(i) for i in REMOVED]) == 0      # its own, unknown to the master now
    with PoolClient(master.address, timeout=10, token=tokens["beta"]) as c:
        assert c.remove_many([key_of(i) for i in range(10, 15)]) == 0  # acme's key bytes: beta's own key space
    cluster.start_node("n1", dram="0", ssd="16MiB", port=port, extra=node_auth)
    assert _hits(master.address, acme, tokens["acme"]) == {i: i not in REMOVED for i in acme}
    assert _hits(master.address, beta, tokens["beta"]) == {i: True for i in beta}
    with AdminClient(master.address, token=tokens["admin"]) as admin:
        stats = admin.stats()
    assert (stats["tombstones"], stats["tombstones_folded"], stats["records_refused"]) == (15, 0, len(REMOVED))
