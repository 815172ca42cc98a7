"""HostIndex (tiers/host_index.py): a node's published index in its arena file, read by a same-host peer's mapping.
Exact rows found, a torn row never taken, a full bucket gives up its oldest row, bad input changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.tiers import host_index
from kvpool.tiers.dram import DramArena
from kvpool.tiers.host_index import DRAM_ROW, SSD_ROW, WAYS, HostIndex

SLOTS = 256


def key(i: int) -> bytes:
    return (0x5E << 120 | i).to_bytes(16, "big")


@pytest.fixture
def arenas(tmp_path):
    """(the node's arena with its writable index, a peer's attached mapping of the same file)."""
    owner = DramArena.create(1 << 20, name="idx", directory=str(tmp_path), index_slots=SLOTS)
    peer = DramArena.attach(owner.path)
    yield owner, peer
    peer.close()
    owner.close()
    owner.unlink()


@pytest.fixture(params=["C probe", "numpy probe"])
def probe(request):
    """Readers probe with tiers/_hostprobe.c where it is built, else with numpy: each reader test runs both."""
    if request.param == "C probe" and host_index._hostprobe is None:
        pytest.skip("kvpool.tiers._hostprobe is not built (no C compiler)")
    return request.param


def reader_of(arena, probe: str) -> HostIndex:
    reader = HostIndex(arena.index_region)
    reader.native_probe = probe == "C probe"
    return reader


def test_a_peer_finds_what_the_node_published_in_chain_order_up_to_the_first_missing_key(arenas, probe):
    owner, peer = arenas
    node, reader = HostIndex(owner.index_region, writer=True), reader_of(peer, probe)
    assert reader.slots == SLOTS and len(reader) == 0
    node.publish([key(0), key(1), key(2)], [0, 4096, 8192], [100, 200, 300], [11, 2**64 - 1, 33])
    assert reader.find([key(0), key(1), key(2)]) == ([0, 4096, 8192], [100, 200, 300], [11, 2**64 - 1, 33],
                                                      [DRAM_ROW] * 3)
    assert reader.find([key(0), key(7), key(2)]) == ([0], [100], [11], [0])        # a chain stops at its first miss
    assert reader.find([key(7), key(0)]) == ([], [], [], [])
    node.publish([key(1)], [12288], [200], [22])                                # republished: the new place
    assert reader.find([key(1)]) == ([12288], [200], [22], [0]) and len(reader) == 3
    assert node.unpublish([key(0), key(9)]) == 1
    assert reader.find([key(0)]) == ([], [], [], []) and len(reader) == 2
    node.clear()
    assert len(reader) == 0 and reader.find([key(1), key(2)]) == ([], [], [], [])


def test_only_the_owner_writes_and_the_index_lives_as_long_as_the_arena_file(arenas, tmp_path):
    _, peer = arenas
    reader = HostIndex(peer.index_region)
    with pytest.raises(ValueError, match="only the node"):
        reader.publish([key(0)], [0], [1], [1])
    with pytest.raises(ValueError, match="only the node"):
        reader.clear()
    plain = DramArena.create(1 << 20, name="plain", directory=str(tmp_path))
    assert plain.index_region is None and DramArena.attach(plain.path).index_region is None
    plain.close()
    plain.unlink()
    with pytest.raises(ValueError, match="index_slots"):
        DramArena.create(1 << 20, name="bad", directory=str(tmp_path), index_slots=10)


def test_a_torn_row_is_a_miss_never_another_objects_location(arenas, probe):
    """A reader that catches the node mid-rewrite sees words of two entries; the seal refuses the mix."""
    owner, peer = arenas
    node, reader = HostIndex(owner.index_region, writer=True), reader_of(peer, probe)
    node.publish([key(1)], [4096], [64], [0xAAAA])
    node.publish([key(2)], [8192], [64], [0xBBBB])
    rows = np.frombuffer(owner.index_region, dtype="<u8").reshape(-1, 8)
    r1 = int(np.flatnonzero(rows[:, 4] == 0xAAAA)[0])
    r2 = int(np.flatnonzero(rows[:, 4] == 0xBBBB)[0])
    rows[r1, 2:5] = rows[r2, 2:5]           # key(1)'s row with key(2)'s offset, size and checksum
    assert reader.find([key(1)]) == ([], [], [], [])
    assert reader.find([key(2)]) == ([8192], [64], [0xBBBB], [0])
    assert reader.find([key(2), key(1)]) == ([8192], [64], [0xBBBB], [0])
    with pytest.raises(ValueError, match=r"^keys\[1\] must be 16 bytes, got 5$"):
        reader.find([key(2), b"short"])


def test_ssd_rows_carry_their_place_and_dram_rows_keep_the_six_word_seal(arenas, probe):
    """An SSD record's row says so in its place word, which the seal covers: a row whose place word changed is a
    miss. A DRAM row's place word is 0, so its seal is the one readers before SSD rows computed over six words."""
    owner, peer = arenas
    node, reader = HostIndex(owner.index_region, writer=True), reader_of(peer, probe)
    node.publish([key(1), key(2), key(3)], [4096, 1 << 30, 8192], [64, 65536, 64], [0xA, 0xB, 0xC],
                 [DRAM_ROW, SSD_ROW, DRAM_ROW])
    assert reader.find([key(1), key(2), key(3)]) == ([4096, 1 << 30, 8192], [64, 65536, 64], [0xA, 0xB, 0xC],
                                                     [DRAM_ROW, SSD_ROW, DRAM_ROW])
    node.publish([key(2)], [12288], [65536], [0xB])         # promoted: the same key's row names its DRAM extent
    assert reader.find([key(2)]) == ([12288], [65536], [0xB], [DRAM_ROW])
    rows = np.frombuffer(owner.index_region, dtype="<u8").reshape(-1, 8)
    mul = [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0x27D4EB2F165667C5,
           0x94D049BB133111EB]
    for r in np.flatnonzero(rows[:, 7]).tolist():
        assert int(rows[r, 6]) == DRAM_ROW
        assert int(rows[r, 7]) == (sum(int(w) * m for w, m in zip(rows[r, :6], mul)) % 2**64) | 1
    r3 = int(np.flatnonzero(rows[:, 4] == 0xC)[0])
    rows[r3, 6] = SSD_ROW                                   # torn: key(3)'s DRAM row read as an SSD row
    assert reader.find([key(3)]) == ([], [], [], []) and reader.find([key(1)])[3] == [DRAM_ROW]


def test_a_full_bucket_gives_up_its_oldest_row(arenas, probe):
    owner, peer = arenas
    node, reader = HostIndex(owner.index_region, writer=True), reader_of(peer, probe)
    words = np.array([np.frombuffer(key(i), dtype="<u8") for i in range(4000)])
    buckets = node._bucket_of(words)
    same = [i for i in range(4000) if buckets[i] == buckets[0]][:WAYS + 1]
    assert len(same) == WAYS + 1
    for n, i in enumerate(same):
        node.publish([key(i)], [n * 4096], [8], [n + 1])
    assert node.replaced == 1
    assert reader.find([key(same[0])]) == ([], [], [], [])                         # the first one written went
    assert [reader.find([key(i)])[0] for i in same[1:]] == [[n * 4096] for n in range(1, WAYS + 1)]


@pytest.mark.parametrize("args, field", [
    (([key(0), b"short"], [0, 0], [1, 1], [1, 1]), "keys[1]"),
    (([key(0), key(1)], [0, -1], [1, 1], [1, 1]), "offsets[1]"),
    (([key(0), key(1)], [0, 0], [1, True], [1, 1]), "sizes[1]"),
    (([key(0), key(1)], [0, 0], [1, 1], [1, 2**64]), "checksums[1]"),
    (([key(0), key(1)], [0], [1, 1], [1, 1]), "offsets, sizes and checksums"),
    (([key(0), key(1)], [0, 0], [1, 1], [1, 1], [DRAM_ROW, 2]), "places[1]"),
    (([key(0), key(1)], [0, 0], [1, 1], [1, 1], [SSD_ROW]), "places must be empty or have one entry per key"),
])
def test_bad_publications_name_the_field_and_change_nothing(arenas, args, field):
    owner, _ = arenas
    node = HostIndex(owner.index_region, writer=True)
    node.publish([key(9)], [0], [1], [9])
    with pytest.raises(ValueError) as err:
        node.publish(*args)
    assert field in str(err.value)
    assert len(node) == 1 and node.find([key(0)]) == ([], [], [], []) and node.find([key(9)]) == ([0], [1], [9], [0])


def test_both_probes_agree_on_a_large_index_with_rows_of_every_state(tmp_path):
    """4,096 slots: 3,000 keys published (full buckets replacing rows), some unpublished, some rows torn; chains
    of every key, in random orders, find the same prefix with the C probe and with numpy's."""
    if host_index._hostprobe is None:
        pytest.skip("kvpool.tiers._hostprobe is not built (no C compiler)")
    owner = DramArena.create(8 << 20, name="big", directory=str(tmp_path), index_slots=4096)
    peer = DramArena.attach(owner.path)
    try:
        node = HostIndex(owner.index_region, writer=True)
        rng = np.random.default_rng(4)
        keys = [key(i) for i in range(3000)]
        node.publish(keys, [i * 4096 for i in range(3000)], [64 + i for i in range(3000)],
                     [int(c) for c in rng.integers(0, 2**63, 3000)], rng.integers(0, 2, 3000).tolist())
        node.unpublish(keys[::17])
        rows = np.frombuffer(owner.index_region, dtype="<u8").reshape(-1, 8)
        torn = rng.choice(np.flatnonzero(rows[:, 7]), 50, replace=False)
        rows[torn[:25], 3] += 1                             # the size word of 25 live rows changed: seals fail
        rows[torn[25:], 6] ^= 1                             # the place word of 25 others flipped: seals fail
        c_reader, np_reader = reader_of(peer, "C probe"), reader_of(peer, "numpy probe")
        found = ssd = 0
        for _ in range(300):
            chain = [keys[i] for i in rng.permutation(3000)[:rng.integers(1, 40)]]
            got = c_reader.find(chain)
            assert got == np_reader.find(chain)
            found += len(got[0])
            ssd += sum(got[3])
        assert found > 0 and ssd > 0 and c_reader.find(keys[:1]) == np_reader.find(keys[:1])
    finally:
        peer.close()
        owner.close()
        owner.unlink()
