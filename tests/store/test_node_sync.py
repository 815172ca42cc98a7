"""StorageNode's SSD sync schedule (NodeConfig.ssd_fsync_s): after every write batch at 0, within the period
otherwise, and at close; counted in `ssd_syncs`."""

import numpy as np
import pytest

from kvpool.store.config import NodeConfig
from kvpool.store.node import Drop, Move, StorageNode
from kvpool.tiers.types import Tier

OBJ = 4096


def node_with(tmp_path, fsync_s: float) -> StorageNode:
    return StorageNode(NodeConfig(node_id="n", dram_bytes=4 * OBJ, shm_dir=str(tmp_path), ssd_fsync_s=fsync_s,
                                  ssd_path=str(tmp_path / "ssd"), ssd_bytes=8 * 2 * OBJ))


def fill_dram(node: StorageNode, n: int) -> list[Move]:
    moves = []
    for i in range(n):
        node.write(Tier.DRAM, i * OBJ, bytes([i]) * 16, b"\0" * 16, np.full(OBJ, i, np.uint8), None)
        moves.append(Move(bytes([i]) * 16, b"\0" * 16, OBJ, 0, Tier.DRAM, i * OBJ, Tier.SSD, i * 2 * OBJ))
    return moves


def test_zero_syncs_once_per_write_batch(tmp_path):
    node = node_with(tmp_path, 0)
    try:
        moves = fill_dram(node, 3)
        assert node.ssd_syncs == 0                              # DRAM writes need no sync
        assert node.demote(moves) == [True] * 3 and node.ssd_syncs == 1
        assert node.drop([Drop(m.key, Tier.SSD, m.dst_offset, OBJ) for m in moves[:2]]) == 2
        assert node.ssd_syncs == 2
        node.write(Tier.SSD, 6 * 2 * OBJ, b"x" * 16, b"\0" * 16, np.ones(OBJ, np.uint8), None)
        assert node.ssd_syncs == 3
        node.sync_ssd()                                         # nothing unsynced: no fdatasync
        assert node.ssd_syncs == 3
    finally:
        node.close()


def test_a_period_syncs_in_the_background_and_close_syncs_the_rest(tmp_path):
    node = node_with(tmp_path, 0.05)
    moves = fill_dram(node, 2)
    node.demote(moves)
    assert node.synced.wait(10), "the syncer thread never synced"
    assert node.ssd_syncs >= 1
    node.sync_ssd()                                             # whatever is left of the demote: nothing unsynced
    before = node.ssd_syncs
    node.drop([Drop(moves[0].key, Tier.SSD, moves[0].dst_offset, OBJ)])
    node.close()                                                # syncs it unless the period got there first
    assert node.ssd_syncs == before + 1                         # exactly once either way


def test_config_names_the_field():
    with pytest.raises(ValueError, match="ssd_fsync_s must be a number >= 0"):
        NodeConfig(ssd_fsync_s=-1)
