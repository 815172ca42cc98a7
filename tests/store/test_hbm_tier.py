"""HBM as the node's fastest tier: config refusal without CUDA, and the master's HBM > DRAM > SSD placement chain.

The placement tests run a real Master, a real StorageNode (DRAM arena in tmp_path, real SSD file) and, because this
box has no GPU, a host-memory stand-in for HbmArena passed to the node (same interface: capacity, write, read_into,
close). The GPU test at the end runs the same path with the real HbmArena and is skipped where CUDA is absent.
"""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from kvpool.store import tokens, wire
from kvpool.store.config import (
    EmbeddedConfig,
    MasterConfig,
    NodeConfig,
    NodeServerConfig,
    UpConfig,
)
from kvpool.store.data_channel import Extent
from kvpool.store.master import Master
from kvpool.store.node import Move, StorageNode
from kvpool.store.node_data import NodeDataHandler
from kvpool.store.records import NodeInfo, PutStatus
from kvpool.tiers.hbm import cuda_available
from kvpool.tiers.types import Tier

OBJ = 4096


class HostHbm:
    """HbmArena's interface over host memory: the only stand-in here (a real device cannot exist on this box)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.buf = bytearray(capacity)
        self.closed = False

    def write(self, offset: int, data) -> int:
        src = memoryview(data).cast("B")
        assert offset + src.nbytes <= self.capacity
        self.buf[offset:offset + src.nbytes] = src
        return src.nbytes

    def read_into(self, offset: int, out) -> int:
        dst = memoryview(out).cast("B")
        assert offset + dst.nbytes <= self.capacity
        dst[:] = self.buf[offset:offset + dst.nbytes]
        return dst.nbytes

    def close(self) -> None:
        self.closed = True


def key(i: int) -> bytes:
    return bytes([i]) * 16


def payload(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, OBJ, dtype=np.uint8)


# ---------------------------------------------------------------- config


@pytest.mark.skipif(cuda_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("make", [
    lambda: NodeConfig(hbm_bytes=1 << 20),
    lambda: NodeServerConfig(hbm_bytes=1 << 20),
    lambda: UpConfig(hbm_bytes=1 << 20, ssd_path=None),
    lambda: EmbeddedConfig(hbm_bytes=1 << 20),
], ids=["NodeConfig", "NodeServerConfig", "UpConfig", "EmbeddedConfig"])
def test_hbm_bytes_without_cuda_is_refused(make):
    from kvpool.tiers.gpu import unavailable_reason

    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == ("hbm_bytes=1048576 asks for an HBM tier but no CUDA device is present "
                              f"(set hbm_bytes=0): {unavailable_reason()}")


@pytest.mark.parametrize("cls", [NodeConfig, EmbeddedConfig])
def test_hbm_fields_validated(cls):
    with pytest.raises(ValueError, match="hbm_bytes must be an integer >= 0"):
        cls(hbm_bytes=-1)
    with pytest.raises(ValueError, match="hbm_device must be an integer >= 0"):
        cls(hbm_device=-1)
    assert cls().hbm_bytes == 0


def test_hbm_capacity_travels_in_the_node_endpoint():
    info = NodeInfo(node_id="n", dram_bytes=8192, ssd_bytes=0, hbm_bytes=12288, incarnation="x")
    back = wire.info_from_endpoint(wire.endpoint_from_info(info, host_id="h", data_address="a:1"))
    assert back.hbm_bytes == 12288 and back.dram_bytes == 8192 and back.ssd_bytes == 0
    plain = NodeInfo(node_id="n", dram_bytes=8192)
    assert wire.info_from_endpoint(wire.endpoint_from_info(plain, host_id="h", data_address="")).hbm_bytes == 0


# ---------------------------------------------------------------- placement chain


@pytest.fixture
def pool(tmp_path):
    """HBM fits 2 objects, DRAM 2, SSD 4 (an SSD extent is header + payload = 2 * OBJ); exclusive tiers."""
    hbm = HostHbm(2 * OBJ)
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=2 * OBJ, shm_dir=str(tmp_path),
                                  ssd_path=str(tmp_path / "ssd"), ssd_bytes=4 * 2 * OBJ), hbm=hbm)
    master = Master(MasterConfig(write_behind=False))
    assert node.info().hbm_bytes == 2 * OBJ
    master.register_node(node.info(), node, expires=False)
    yield master, node
    node.close()
    assert hbm.closed


def put(master, node, i):
    r = master.put_start([key(i)], [OBJ])[0]
    assert r.status == PutStatus.STORED
    data = payload(i)
    node.write(r.grant.location.tier, r.grant.location.offset, key(i), b"\0" * 16, data,
               xxhash.xxh3_64_intdigest(data))
    assert master.put_commit([r.grant.grant_id], [xxhash.xxh3_64_intdigest(data)]) == [True]
    return r.grant.location.tier


def where(master, n=9):
    out = {"hbm": [], "dram": [], "ssd": [], None: []}
    for i, rec in zip(range(1, n + 1), master.inspect([key(i) for i in range(1, n + 1)])):
        out[None if rec is None else rec.tier.label].append(i)
    return out


def read(node, rec):
    out = bytearray(rec.size)
    assert node.read_into(rec.tier, rec.offset, rec.key, rec.size, out)
    return bytes(out)


def assert_all_bytes(master, node, n=9):
    for i, rec in zip(range(1, n + 1), master.inspect([key(i) for i in range(1, n + 1)])):
        if rec is not None:
            assert read(node, rec) == payload(i).tobytes(), (i, rec.tier)


def test_puts_fill_hbm_then_demote_down_the_chain(pool):
    master, node = pool
    assert [put(master, node, i) for i in (1, 2)] == [Tier.HBM, Tier.HBM]
    assert where(master) == {"hbm": [1, 2], "dram": [], "ssd": [], None: [3, 4, 5, 6, 7, 8, 9]}
    assert put(master, node, 3) is Tier.HBM                     # HBM's coldest (1) -> DRAM
    assert where(master)["hbm"] == [2, 3] and where(master)["dram"] == [1]
    put(master, node, 4)
    assert where(master) == {"hbm": [3, 4], "dram": [1, 2], "ssd": [], None: [5, 6, 7, 8, 9]}
    assert_all_bytes(master, node)
    # From here on each put demotes twice: HBM's coldest (3) -> DRAM, DRAM's coldest (1) -> SSD.
    assert put(master, node, 5) is Tier.HBM
    assert where(master) == {"hbm": [4, 5], "dram": [2, 3], "ssd": [1], None: [6, 7, 8, 9]}
    assert_all_bytes(master, node)
    for i in (6, 7, 8):
        put(master, node, i)
    assert where(master) == {"hbm": [7, 8], "dram": [5, 6], "ssd": [1, 2, 3, 4], None: [9]}
    put(master, node, 9)                                        # SSD full: its coldest (1) is evicted
    assert where(master) == {"hbm": [8, 9], "dram": [6, 7], "ssd": [2, 3, 4, 5], None: [1]}
    assert_all_bytes(master, node)
    s = master.stats()
    assert s["demotions"] == 1 + 1 + 2 * 5 and s["evictions"] == {"dram": 0, "ssd": 1}
    assert {t: s["tiers"][t]["objects"] for t in ("hbm", "dram", "ssd")} == {"hbm": 2, "dram": 2, "ssd": 4}
    assert s["nodes"]["n1"]["hbm"] == {"objects": 2, "bytes": 2 * OBJ, "capacity": 2 * OBJ}
    master.index.check_invariants()


def test_hits_are_promoted_into_hbm(pool):
    master, node = pool
    for i in range(1, 10):
        put(master, node, i)
    # SSD hit: 2 -> HBM; HBM's coldest (8) -> DRAM; DRAM's coldest (6) -> SSD, where the coldest unleased
    # object (3; 2 is ours, leased) is evicted for it.
    res = master.lookup([key(2)])
    assert res.hits == 1 and res.locations[0].tier is Tier.SSD  # where it is now; promoted after the lookup
    master.release([res.lease_id])
    assert master.promote_pending() == 1
    rec = master.inspect([key(2)])[0]
    assert rec.tier is Tier.HBM and read(node, rec) == payload(2).tobytes()
    assert where(master) == {"hbm": [2, 9], "dram": [7, 8], "ssd": [4, 5, 6], None: [1, 3]}
    # DRAM hit: 7 -> HBM; HBM's coldest (9) -> DRAM, whose coldest unleased (8) -> SSD (room there).
    res = master.lookup([key(7)])
    assert res.hits == 1 and res.locations[0].tier is Tier.DRAM
    master.release([res.lease_id])
    assert master.promote_pending() == 1
    assert where(master) == {"hbm": [2, 7], "dram": [9], "ssd": [4, 5, 6, 8], None: [1, 3]}
    # An HBM hit stays where it is.
    res = master.lookup([key(2)])
    assert res.locations[0].tier is Tier.HBM
    master.release([res.lease_id])
    assert where(master) == {"hbm": [2, 7], "dram": [9], "ssd": [4, 5, 6, 8], None: [1, 3]}
    assert_all_bytes(master, node)
    s = master.stats()
    assert s["promotions"] == 2 and s["evictions"] == {"dram": 0, "ssd": 2}
    master.index.check_invariants()


def test_node_moves_between_every_pair_of_tiers(pool):
    """The NodeOps copies themselves, byte-exact: HBM <-> DRAM <-> SSD and SSD <-> HBM through a host buffer."""
    master, node = pool
    data = payload(42)
    node.write(Tier.HBM, OBJ, key(42), b"\0" * 16, data, 0)
    csum = xxhash.xxh3_64_intdigest(data)
    hops = [(Tier.HBM, OBJ, Tier.DRAM, 0), (Tier.DRAM, 0, Tier.SSD, 2 * OBJ), (Tier.SSD, 2 * OBJ, Tier.HBM, 0),
            (Tier.HBM, 0, Tier.SSD, 4 * OBJ), (Tier.SSD, 4 * OBJ, Tier.DRAM, OBJ), (Tier.DRAM, OBJ, Tier.HBM, OBJ)]
    for src, so, dst, do in hops:
        move = Move(key(42), b"\0" * 16, OBJ, csum, src, so, dst, do)
        ops = node.demote if dst > src else node.promote
        assert ops([move]) == [True]
        out = bytearray(OBJ)
        assert node.read_into(dst, do, key(42), OBJ, out) and bytes(out) == data.tobytes(), (src, dst)


def test_remote_data_path_writes_and_reads_hbm_extents(pool):
    """NodeDataHandler (data channel / gRPC Write+Read): an HBM extent is staged in host memory, one copy each way."""
    _, node = pool
    handler = NodeDataHandler(node)
    handler.secret = b"s" * 32
    expires = tokens.now_ms() + 60_000

    def extent(kind):
        return Extent(7, int(Tier.HBM), OBJ, OBJ, expires,
                      tokens.sign(handler.secret, kind, 7, int(Tier.HBM), OBJ, OBJ, expires), key=key(7))

    view = handler.write_view(extent(tokens.WRITE))
    view[:] = payload(7).tobytes()
    handler.write_done(extent(tokens.WRITE), view)
    assert bytes(node.hbm.buf[OBJ:2 * OBJ]) == payload(7).tobytes()
    assert bytes(handler.read_view(extent(tokens.READ))) == payload(7).tobytes()


def test_node_without_hbm_has_no_hbm_tier(tmp_path):
    node = StorageNode(NodeConfig(node_id="n", dram_bytes=OBJ, shm_dir=str(tmp_path)))
    try:
        assert node.info().hbm_bytes == 0 and node.hbm is None
        with pytest.raises(ValueError, match="is not on this node"):
            node.write(Tier.HBM, 0, key(1), b"\0" * 16, payload(1), 0)
    finally:
        node.close()


# ---------------------------------------------------------------- real device


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_real_hbm_arena_round_trip_through_a_node(shm_path):
    node = StorageNode(NodeConfig(node_id="g", dram_bytes=2 * OBJ, hbm_bytes=2 * OBJ, shm_dir=str(shm_path)))
    try:
        assert node.dram.pinned                             # a node with HBM pins its DRAM arena for the moves
        master = Master(MasterConfig())
        master.register_node(node.info(), node, expires=False)
        assert [put(master, node, i) for i in (1, 2, 3)] == [Tier.HBM] * 3
        assert where(master, 3) == {"hbm": [2, 3], "dram": [1], "ssd": [], None: []}
        assert_all_bytes(master, node, 3)
        res = master.lookup([key(1)])                       # a DRAM hit, promoted after the lookup
        assert res.locations[0].tier is Tier.DRAM
        master.release([res.lease_id])
        assert master.promote_pending() == 1                # DRAM -> HBM, HBM's coldest (2) -> DRAM
        assert where(master, 3) == {"hbm": [1, 3], "dram": [2], "ssd": [], None: []}
        assert_all_bytes(master, node, 3)
    finally:
        node.close()
