"""Same-host writers' claims in the arena's tail page (tiers/writer_claims.py): blocks held by OFD locks, one per
writer process (here: per attached mapping, each its own open file description), cells held around copies, and the
owner's scan, which clears the block of a writer gone."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from kvpool.tiers.dram import DramArena
from kvpool.tiers.writer_claims import BLOCKS, CELLS, overlaps


@pytest.fixture
def arena(tmp_path):
    a = DramArena.create(1 << 20, "claims", str(tmp_path))
    yield a
    a.close()


def test_writers_get_blocks_of_their_own_and_the_owner_sees_exactly_what_they_claim(arena):
    one, two = DramArena.attach(arena.path), DramArena.attach(arena.path)
    c1, c2 = one.writer_claims(), two.writer_claims()
    assert (c1.block, c2.block) == (0, 1)
    x, y, z = c1.take(), c1.take(), c2.take()
    c1.hold(x, 0, 4096)
    c1.hold(y, 8192, 3 * 4096)
    c2.hold(z, 65536, 65536 + 100)
    assert sorted(arena.claimed_ranges()) == [(0, 4096), (8192, 12288), (65536, 65636)]
    c1.drop(x)
    c1.hold(y, 4096, 8192)          # a cell reused for the next copy
    assert sorted(arena.claimed_ranges()) == [(4096, 8192), (65536, 65636)]
    c1.give(y)
    c2.give(z)
    assert arena.claimed_ranges() == []
    del c1, c2
    one.close()
    two.close()


def test_a_process_has_cells_claims_at_once_and_an_arena_blocks_writers(arena):
    mapped = [DramArena.attach(arena.path) for _ in range(BLOCKS + 1)]
    claims = [m.writer_claims() for m in mapped]
    assert [c.block for c in claims[:BLOCKS]] == list(range(BLOCKS)) and claims[BLOCKS] is None
    cells = [claims[0].take() for _ in range(CELLS)]
    assert sorted(cells) == list(range(CELLS)) and claims[0].take() is None
    claims[0].give(cells[0])
    assert claims[0].take() == cells[0]
    claims[3] = None            # a writer that closes its mapping lets its block go
    mapped[3].close()
    gc.collect()
    assert mapped[BLOCKS].writer_claims().block == 3
    del claims
    for m in mapped:
        m.close()


def test_the_owner_clears_the_block_of_a_writer_killed_with_claims_held(arena):
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from kvpool.tiers.dram import DramArena\n"
        "claims = DramArena.attach(sys.argv[1]).writer_claims()\n"
        "claims.hold(claims.take(), 4096, 8192)\n"
        "print(claims.block, flush=True)\n"
        "time.sleep(120)\n"), arena.path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "0"
        assert arena.claimed_ranges() == [(4096, 8192)]      # alive: its claim stands, scan after scan
        assert arena.claimed_ranges() == [(4096, 8192)]
    finally:
        child.kill()
        child.wait(10)
    assert arena.claimed_ranges() == []
    late = DramArena.attach(arena.path)
    c = late.writer_claims()
    assert c.block == 0 and arena.claimed_ranges() == []
    del c
    late.close()


def test_a_new_writer_on_a_dead_writer_s_block_starts_with_no_claims(arena):
    """The owner has not scanned since the writer died: the next writer to take the block clears it."""
    first = DramArena.attach(arena.path)
    c = first.writer_claims()
    c.hold(c.take(), 0, 4096)
    del c
    first.close()
    gc.collect()
    second = DramArena.attach(arena.path)
    c2 = second.writer_claims()
    assert c2.block == 0 and arena.claimed_ranges() == []
    del c2
    second.close()


def test_only_writers_claim_and_only_the_owner_scans(arena):
    peer = DramArena.attach(arena.path)
    with pytest.raises(ValueError, match="owner scans writers' claims"):
        arena.writer_claims()
    with pytest.raises(ValueError, match="only the arena's owner scans"):
        peer.claimed_ranges()
    peer.close()


def test_overlaps_is_exact_at_the_edges():
    assert overlaps([(0, 4096)], 4095, 1) and not overlaps([(0, 4096)], 4096, 10)
    assert not overlaps([(100, 200)], 0, 100) and overlaps([(100, 200)], 0, 101) and not overlaps([], 0, 1)


def test_closing_claims_clears_the_block_and_lets_its_lock_go_at_once(arena):
    """`WriterClaims.close` (a client closing): its claims end and another writer may take the block, with no
    garbage collection and the mapping still open."""
    one, two = DramArena.attach(arena.path), DramArena.attach(arena.path)
    c = one.writer_claims()
    cell = c.take()
    c.hold(cell, 0, 4096)
    c.close()
    assert arena.claimed_ranges() == [] and c.take() is None
    c.give(cell)                # a copy ending after the close changes nothing
    assert c.take() is None
    assert two.writer_claims().block == 0
    one.close()
    two.close()
