"""Placement uses the whole pool (issue 11 item 5), with two real `kvpool node` processes: objects put one at a time
are never evicted until every node's tiers are full, and then one put evicts one object. Before the fix the first
node demoted and evicted while the second node's SSD stayed empty (with these sizes: the first eviction came at put
17 of 24 with exclusive tiers). Prints the puts stored before the first eviction and each node's usage."""

from __future__ import annotations

import pytest

from kvpool import PoolClient
from tests.store.cluster import check_pattern, cluster, key_of, pattern  # noqa: F401 - the cluster fixture

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SIZE = 64 << 10
DRAM_OBJECTS = 4
SSD_OBJECTS = 8                      # records of header page + payload


@pytest.mark.parametrize("write_behind", [True, False], ids=["inclusive", "exclusive"])
def test_two_nodes_evict_nothing_until_the_pool_is_full(cluster, write_behind):
    master = cluster.start_master(node_ttl_s=5.0, extra=["--write-behind", str(write_behind).lower(),
                                                         "--promote-on-hit", "false"])
    for node_id in ("n1", "n2"):
        cluster.start_node(node_id, dram=str(DRAM_OBJECTS * SIZE), ssd=str(SSD_OBJECTS * (SIZE + 4096)))
    # Inclusive: the SSDs are the pool (DRAM holds copies of what they hold); exclusive: DRAM + SSD.
    capacity = 2 * SSD_OBJECTS if write_behind else 2 * (DRAM_OBJECTS + SSD_OBJECTS)
    first_eviction = None
    with PoolClient(master.address, timeout=10) as c:
        for i in range(capacity + 1):
            assert c.put_many([key_of(i)], [pattern(i, SIZE)]) == ["stored"]
            s = c.stats()
            if first_eviction is None and sum(s["evictions"].values()):
                first_eviction = i + 1
        usage = {n: {t: s["nodes"][n][t]["objects"] for t in ("dram", "ssd")} for n in ("n1", "n2")}
        present = [i for i, ok in enumerate(c.contains_many([key_of(i) for i in range(capacity + 1)])) if ok]
        wrong = 0
        for i in present:
            buf = bytearray(SIZE)
            assert c.get_many_into([key_of(i)], [buf]) == 1
            try:
                check_pattern(buf, i)
            except AssertionError:
                wrong += 1
    mode = "inclusive" if write_behind else "exclusive"
    print(f"\ntwo equal nodes ({mode}): first eviction at put {first_eviction} of a {capacity}-object pool; "
          f"usage {usage}; wrong objects {wrong}")
    assert first_eviction == capacity + 1                      # only the put past the pool's capacity evicted
    assert sum(s["evictions"].values()) == 1 and len(present) == capacity and wrong == 0
    assert usage["n1"] == usage["n2"] == {"dram": DRAM_OBJECTS, "ssd": SSD_OBJECTS}
