"""EmbeddedPool warm restart with the inclusive SSD tier: `close()` writes what DRAM holds to the SSD first, and a
process killed with SIGKILL after its write-behind caught up loses nothing; a pool reopened on the same ssd_path
finds every chain whole, the ones used last (in DRAM at the stop) included. The same workload with the exclusive
tiers loses exactly those chains' heads (the issue's reproduction)."""

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from kvpool import EmbeddedPool

OBJ = 8192
CHAINS, BLOCKS, RECENT = 8, 4, 2          # 32 objects; DRAM holds 8 (25%): the 2 chains read last


def chain(c: int) -> list[bytes]:
    return [bytes([c, b]) * 8 for b in range(BLOCKS)]


def value(c: int, b: int) -> np.ndarray:
    return np.full(OBJ, c * 16 + b + 1, np.uint8)


def workload(pool) -> list[int]:
    """Put every chain, read the RECENT oldest again (promoted into DRAM); returns prefix hits per chain."""
    for c in range(CHAINS):
        assert pool.put_many(chain(c), [value(c, b) for b in range(BLOCKS)]) == ["stored"] * BLOCKS
    bufs = [np.zeros(OBJ, np.uint8) for _ in range(BLOCKS)]
    for c in range(RECENT):
        assert pool.get_many_into(chain(c), bufs) == BLOCKS     # SSD hits, promoted after the copy
    for c in range(RECENT):
        tiers: list[str] = []
        assert pool.get_many_into(chain(c), bufs, tiers_out=tiers) == BLOCKS and tiers == ["dram"] * BLOCKS
    return [pool.lookup_prefix(chain(c)) for c in range(CHAINS)]


def config(tmp_path, **kw) -> dict:
    return dict(dram_bytes=RECENT * BLOCKS * OBJ, ssd_path=str(tmp_path / "ssd"), ssd_bytes=64 * (OBJ + 4096),
                shm_dir=str(tmp_path), **kw)


def reopened(tmp_path, **kw) -> tuple[list[int], int]:
    with EmbeddedPool(**config(tmp_path, **kw)) as pool:
        hits = [pool.lookup_prefix(chain(c)) for c in range(CHAINS)]
        wrong = 0
        for c, n in enumerate(hits):
            bufs = [np.zeros(OBJ, np.uint8) for _ in range(n)]
            assert pool.get_many_into(chain(c)[:n], bufs) == n
            wrong += sum(int(np.count_nonzero(buf != value(c, b))) for b, buf in enumerate(bufs))
        return hits, wrong


@pytest.mark.parametrize("write_behind", [True, False], ids=["inclusive", "exclusive"])
def test_close_and_reopen_keeps_every_chain(tmp_path, write_behind):
    pool = EmbeddedPool(**config(tmp_path, write_behind=write_behind))
    before = workload(pool)
    assert before == [BLOCKS] * CHAINS
    pool.close()
    after, wrong = reopened(tmp_path, write_behind=write_behind)
    assert wrong == 0
    if write_behind:
        assert after == before
    else:
        assert after == [0] * RECENT + [BLOCKS] * (CHAINS - RECENT)


CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[2])
    from kvpool import EmbeddedPool
    from tests.kvpool.test_warm_restart import config, workload
    import pathlib
    pool = EmbeddedPool(**config(pathlib.Path(sys.argv[1])))
    hits = workload(pool)
    while pool.stats()["write_behind"]["pending"]:   # the write-behind catches up within write_behind_s
        time.sleep(0.01)
    print(json.dumps(hits), flush=True)
    time.sleep(600)
""")


def test_sigkill_after_the_write_behind_caught_up_loses_nothing(tmp_path):
    repo = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), repo], stdout=subprocess.PIPE, text=True)
    try:
        before = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert before == [BLOCKS] * CHAINS
    after, wrong = reopened(tmp_path)
    assert (after, wrong) == (before, 0)
