"""A prefix-cache workload for the warm-restart tests (issue 11 item 4), against any pool address.

    put       CHAINS chains of BLOCKS real block keys (kvpool.block_keys), one put per chain, oldest first
    reuse     the RECENT oldest chains are read again (a leased get): the master promotes their SSD blocks, so
              DRAM (= DRAM_SHARE of the objects) ends up holding exactly the chains used last, as in the issue
    measure   per chain, `lookup_prefix` (blocks present from the root); a restart keeps a share of their tokens

Payloads encode (chain, block) so a wrong byte anywhere is detected (`read_back`).
"""

from __future__ import annotations

import time

import numpy as np

from kvpool import Namespace, PoolClient, block_keys

BLOCK_TOKENS = 16
NS = Namespace(model="faults", fingerprint="warm-restart", kv_dtype="float32", block_tokens=BLOCK_TOKENS,
               num_layers=1, num_kv_heads=1, head_dim=512)
BLOCK = NS.block_bytes            # 64 KiB
CHAINS = 24
BLOCKS = 8                        # blocks per chain: 192 objects in all
RECENT = 6                        # chains read last; DRAM holds exactly these (6 x 8 = 48 = 25% of the objects)
DRAM_BYTES = RECENT * BLOCKS * BLOCK
SSD_RECORD = BLOCK + 4096         # header page + payload
SSD_BYTES = 256 * SSD_RECORD      # room for every object (the exclusive tiers too)


def chain_keys(c: int) -> list[bytes]:
    return block_keys(NS, [c * 100_000 + t for t in range(BLOCKS * BLOCK_TOKENS)])


def payload(c: int, b: int) -> np.ndarray:
    out = np.full(BLOCK, (c * 31 + b * 7 + 1) % 251, np.uint8)
    out[:8] = np.frombuffer(np.array([c, b], np.uint32).tobytes(), np.uint8)
    return out


def put_chains(client: PoolClient, chains=range(CHAINS)) -> None:
    for c in chains:
        statuses = client.put_many(chain_keys(c), [payload(c, b) for b in range(BLOCKS)], namespace=NS)
        assert statuses == ["stored"] * BLOCKS, (c, statuses)


def reuse_recent(client: PoolClient, deadline_s: float = 30.0) -> None:
    """Read chains 0..RECENT-1 until every block of them is served from DRAM (their promotion finished)."""
    bufs = [np.zeros(BLOCK, np.uint8) for _ in range(BLOCKS)]
    end = time.monotonic() + deadline_s
    for c in range(RECENT):
        while True:
            tiers: list[str] = []
            assert client.get_many_into(chain_keys(c), bufs, namespace=NS, tiers_out=tiers) == BLOCKS
            if tiers == ["dram"] * BLOCKS:
                break
            assert time.monotonic() < end, f"chain {c} not promoted to DRAM in {deadline_s}s: {tiers}"
            time.sleep(0.02)


def prefix_hits(client: PoolClient) -> list[int]:
    """Blocks present from the root, per chain (no lease: measuring changes nothing)."""
    return [client.lookup_prefix(chain_keys(c), namespace=NS) for c in range(CHAINS)]


def wait_written(client: PoolClient, deadline_s: float = 30.0) -> float:
    """Wait until the master's write-behind has copied everything; returns how long that took."""
    start = time.monotonic()
    while client.stats()["write_behind"]["pending"]:
        assert time.monotonic() - start < deadline_s, "write-behind did not catch up"
        time.sleep(0.02)
    return time.monotonic() - start


def read_back(client: PoolClient, hits: list[int], chains=None) -> int:
    """Read every block a prefix lookup found (hits[i] blocks of chain chains[i], default chain i); returns the
    number of wrong bytes (0 expected)."""
    wrong = 0
    for c, n in zip(range(len(hits)) if chains is None else chains, hits):
        if not n:
            continue
        bufs = [np.zeros(BLOCK, np.uint8) for _ in range(n)]
        got = client.get_many_into(chain_keys(c)[:n], bufs, namespace=NS)
        assert got == n, f"chain {c}: lookup said {n} blocks, get returned {got}"
        wrong += sum(int(np.count_nonzero(buf != payload(c, b))) for b, buf in enumerate(bufs))
    return wrong


def kept(before: list[int], after: list[int]) -> tuple[float, int]:
    """(share of prefix hit tokens kept, how many of the RECENT most recently used chains kept every block)."""
    share = sum(min(a, b) for a, b in zip(after, before)) / sum(before)
    recent = sum(after[c] >= before[c] for c in range(RECENT))
    return share, recent
