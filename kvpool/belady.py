"""Belady's OPT for prefix-chain traffic: the most block hits ANY eviction + admission policy could get from a trace
at a given pool size, computed offline with knowledge of the future. A reference line for the planner's tables
(bench/trace_replay.py prints how much of the LRU -> OPT gap each policy closes), never a policy.

What is modelled. The trace fixes the block references: a request looks its chain up (hits = leading stored blocks,
the lookup stops at the first miss) and then stores what missed, so each request references every block of its
chain, in prefix order. Each reference is one step of a global clock. OPT is Belady's rule with bypass over that
reference string, unit-size blocks, `capacity` of them:

    hit   the block is stored                                   (counted, and its next use is updated)
    miss  free room: store it. Full: if some stored block's next use is later than this block's, evict the stored
          block used furthest in the future and store this one; otherwise do not store it (bypass)
    next use  the step of the block's next reference (never again: after every real step)

Why this is the bound under the prefix rule: (1) for a fixed reference string and unit sizes, furthest-next-use with
bypass maximises the number of references that find their block stored, over every policy that may evict and
decline any block at any time; a policy's prefix hits are at most that number (a prefix hit is a stored block).
(2) Where every occurrence of a block has the same parent (chained hash ids: a block id names its whole prefix), a
parent's next use is always strictly earlier than its child's (the parent is referenced one step before the child
in every chain holding the child), so OPT never evicts a parent before its child and never stores a child whose
parent it declined: its store stays prefix-closed, every stored block of a chain lies in the leading run, and
its block hits ARE prefix hits. `opt_hits` counts both ways and reports the prefix ones; they differ only on a
trace whose chains disagree about a block's parent (then the prefix count is still what OPT's store would serve,
and the block count is the looser bound).

REQUEST events only (Mooncake traces): a recorded log's separate LOOKUP / PUT calls would need a model of which
puts follow which lookups.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvpool.trace import REQUEST, Trace


@dataclass(slots=True)
class OptResult:
    capacity_blocks: int
    hits: np.ndarray            # per event: prefix hits (leading stored blocks) of OPT's store
    block_hits: int             # references that found their block stored (>= hits.sum())
    evictions: int
    bypassed: int               # misses OPT declined to store

    @property
    def hit_blocks(self) -> int:
        return int(self.hits.sum())


def next_use(block_ids: np.ndarray) -> np.ndarray:
    """For each reference i, the index of the next reference to the same block; len(block_ids) + i if none (distinct
    values, all later than any real reference, ordered like the references themselves)."""
    n = len(block_ids)
    out = np.arange(n, 2 * n, dtype=np.int64)
    order = np.argsort(block_ids, kind="stable")           # same id: increasing reference index
    same = block_ids[order[1:]] == block_ids[order[:-1]]
    out[order[:-1][same]] = order[1:][same]
    return out


def opt_hits(trace: Trace, capacity_blocks: int) -> OptResult:
    """Belady's OPT with bypass at `capacity_blocks` (module docstring)."""
    if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, (int, np.integer)) or capacity_blocks <= 0:
        raise ValueError(f"capacity_blocks must be an int > 0, got {capacity_blocks!r}")
    if len(trace) and not bool((trace.op == REQUEST).all()):
        raise ValueError("trace: OPT models REQUEST events only (a Mooncake trace), not recorded lookups/puts")
    cap = int(capacity_blocks)
    ids = trace.block_ids.tolist()
    nxt = next_use(trace.block_ids).tolist()
    offsets = trace.offsets.tolist()
    stored: dict[int, int] = {}        # block -> step of its next use (the heap holds stale entries too)
    heap: list[tuple[int, int]] = []   # (-next use, block): the furthest first
    hits = np.zeros(len(trace), dtype=np.int64)
    block_hits = evictions = bypassed = 0
    for e in range(len(trace)):
        a, b = offsets[e], offsets[e + 1]
        lead = True
        h = 0
        for i in range(a, b):
            block, when = ids[i], nxt[i]
            if block in stored:
                block_hits += 1
                if lead:
                    h += 1
            else:
                lead = False
                if len(stored) >= cap:
                    while -heap[0][0] != stored.get(heap[0][1]):     # drop stale entries
                        heapq.heappop(heap)
                    far, victim = heap[0]
                    if -far < when:
                        bypassed += 1
                        continue
                    heapq.heappop(heap)
                    del stored[victim]
                    evictions += 1
            stored[block] = when
            heapq.heappush(heap, (-when, block))
        hits[e] = h
    return OptResult(capacity_blocks=cap, hits=hits, block_hits=block_hits, evictions=evictions, bypassed=bypassed)
