"""Capacity planner: replay a trace (kvpool/trace.py) through the master's REAL index, placement and eviction code
at several pool sizes and policies, and say what each buys in hit rate and prefill seconds.

No second simulator that could drift from production: every event drives a fresh `kvpool.store.master.Master`
through its public methods, with one registered node whose `NodeOps` moves no bytes:

    REQUEST (Mooncake row)  lookup(chain) ─▶ release(lease) ─▶ put_start(missed tail) ─▶ put_commit(grants)
    LOOKUP (recorded)       lookup(chain) ─▶ release(lease)
    PROBE (recorded)        lookup(chain, lease=False)          (lookup_prefix: the policy sees no use)
    PUT (recorded)          put_start(chain) ─▶ put_commit(grants)

exactly as a connector drives the pool (load the hit prefix under a lease, prefill the rest, save it). Every block
is one object of `UNIT` bytes in a DRAM tier of capacity_blocks * UNIT bytes: with equal sizes the allocator never
fragments, so eviction order is the policy's order and a byte capacity only needs converting to blocks
(capacity_bytes // block_bytes). The master's clock is the trace's clock.

Ceiling: an infinite pool hits every block whose id was seen before in an earlier chain (ids are chained, so a
seen id means its whole prefix was stored too): `ceiling_hits`, counted by set membership, not by replay.

What the pool sees is what kvpool's connectors send it: full blocks only (kvpool/trace.py drops a Mooncake row's
partial last block by default, `partial_blocks="keep"` replays it). A request with no full block makes no pool call
(the connectors skip it) but still counts as a request. Rates: block hit rate = hit blocks / block refs looked up
(the chains as replayed); token hit rate = hit tokens / every input token of the requests (whole prompts, so the
tokens of a dropped partial block count in the denominator and never hit) - the share of prefill the pool saves;
for a recorded log, its `tokens` column (keys x block_tokens: the full blocks the connector asked the pool for).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import numpy as np

from kvpool.store.config import MasterConfig
from kvpool.store.master import Master
from kvpool.store.records import NodeInfo
from kvpool.tiers.policy import POLICY_NAMES
from kvpool.trace import PROBE, PUT, REQUEST, Trace

UNIT = 4096                   # bytes of one simulated block in the master's allocator (its alignment)
_TAG = 0xA5A5_A5A5_A5A5_A5A5  # high half of every simulated key: never ends in a NUL, so numpy "S16" keeps 16 bytes
_CHUNK_BLOCKS = 1 << 18       # keys are built this many block refs at a time (bounded memory on huge traces)


class NullNode:
    """NodeOps of a node that holds no bytes: every move succeeds, every drop is done."""

    def demote(self, moves, drops=()):
        return [True] * len(moves)

    def promote(self, moves):
        return [True] * len(moves)

    def drop(self, drops):
        return len(drops)

    def objects_removed(self, keys=None):
        pass


class TraceClock:
    """The master's clock during a replay: the current event's trace time (seconds), moved by the replay loop."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class ReplayResult:
    policy: str
    capacity_blocks: int
    lookups: int = 0
    blocks: int = 0               # block refs looked up
    hit_blocks: int = 0
    tokens: int = 0               # tokens looked up
    hit_tokens: int = 0
    evictions: int = 0
    wall_s: float = 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.tokens if self.tokens else 0.0

    @property
    def events_per_s(self) -> float:
        return self.lookups / self.wall_s if self.wall_s > 0 else math.inf


def chain_keys(block_ids: np.ndarray) -> list[bytes]:
    """16-byte master keys of compact block ids, one numpy pass (id little-endian | constant tag)."""
    pairs = np.empty((len(block_ids), 2), dtype="<u8")
    pairs[:, 0] = block_ids
    pairs[:, 1] = _TAG
    return pairs.view("S16").ravel().tolist()


def ceiling_hits(trace: Trace) -> np.ndarray:
    """Hits per event of an infinite pool (PUT events: 0)."""
    seen: set[int] = set()
    hits = np.zeros(len(trace), dtype=np.int64)
    ids = trace.block_ids.tolist()
    offsets = trace.offsets.tolist()
    ops = trace.op.tolist()
    for i, op in enumerate(ops):
        a, b = offsets[i], offsets[i + 1]
        if op != PUT:
            h = a
            while h < b and ids[h] in seen:
                h += 1
            hits[i] = h - a
        if op == REQUEST or op == PUT:  # a request stores its chain after the lookup; a put stores it
            seen.update(ids[a:b])
    return hits


def replay(trace: Trace, capacity_blocks: int, policy: str, *,
           progress: Callable[[int], None] | None = None) -> tuple[ReplayResult, np.ndarray]:
    """Replay `trace` against a pool of `capacity_blocks` blocks under `policy`. Returns the totals and the hits of
    every event (PUT events: 0). `progress(n)` is called with the number of events done since the last call."""
    if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, (int, np.integer)) or capacity_blocks <= 0:
        raise ValueError(f"capacity_blocks must be an int > 0, got {capacity_blocks!r}")
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy must be one of {list(POLICY_NAMES)}, got {policy!r}")
    lengths = trace.lengths()
    longest = int(lengths.max()) if len(lengths) else 1
    clock = TraceClock()
    master = Master(MasterConfig(policy=policy, max_batch_keys=max(65536, longest)), clock=clock)
    master.register_node(NodeInfo(node_id="planner", dram_bytes=int(capacity_blocks) * UNIT, alignment=UNIT),
                         NullNode(), expires=False)
    lookup, release, put_start, put_commit = master.lookup, master.release, master.put_start, master.put_commit
    n = len(trace)
    hits = np.zeros(n, dtype=np.int64)
    offsets = trace.offsets
    times = trace.time_s.tolist()
    ops = trace.op.tolist()
    sizes = [UNIT] * longest
    zeros = [0] * longest
    t0 = time.perf_counter()
    i = 0
    while i < n:
        # the events whose chains fit in one key chunk (at least one)
        j = int(np.searchsorted(offsets, offsets[i] + _CHUNK_BLOCKS, side="right")) - 1
        j = min(max(j, i + 1), n)
        base = int(offsets[i])
        keys = chain_keys(trace.block_ids[base:int(offsets[j])])
        bounds = (offsets[i:j + 1] - base).tolist()
        for e in range(i, j):
            a, b = bounds[e - i], bounds[e - i + 1]
            if a == b:
                continue                     # no full block: a connector makes no pool call
            clock.now = times[e]
            op = ops[e]
            h = 0
            if op != PUT:
                chain = keys[a:b]
                r = lookup(chain, lease=op != PROBE)
                h = r.hits
                if r.lease_id:
                    release([r.lease_id])
                hits[e] = h
            if op != PUT and op != REQUEST:
                continue
            if h < b - a:
                tail = keys[a + h:b]
                m = b - a - h
                grants = [x.grant.grant_id for x in put_start(tail, sizes[:m]) if x.grant is not None]
                if grants:
                    put_commit(grants, zeros[:len(grants)])
        if progress is not None:
            progress(j - i)
        i = j
    wall = time.perf_counter() - t0
    result = summarize(trace, hits, policy=policy, capacity_blocks=int(capacity_blocks))
    result.wall_s = wall
    result.evictions = sum(master.stats()["evictions"].values())
    return result, hits


def summarize(trace: Trace, hits: np.ndarray, *, policy: str, capacity_blocks: int) -> ReplayResult:
    looked = trace.op != PUT
    hit_tokens = np.minimum(hits * trace.block_tokens.astype(np.int64), trace.tokens)
    return ReplayResult(policy=policy, capacity_blocks=capacity_blocks, lookups=int(looked.sum()),
                        blocks=int(trace.lengths()[looked].sum()), hit_blocks=int(hits[looked].sum()),
                        tokens=int(trace.tokens[looked].sum()), hit_tokens=int(hit_tokens[looked].sum()))


# ---------------------------------------------------------------------------------------------- planning

@dataclass(slots=True)
class Plan:
    """Everything `kvpool simulate` prints: the trace's shape, its ceiling, one ReplayResult per (capacity,
    policy) in the order run, and per policy the smallest capacity reaching `ceiling_share` of the ceiling."""

    source: str
    events: int
    lookups: int
    block_refs: int
    unique_blocks: int
    block_bytes: int
    ceiling_block_hit_rate: float
    ceiling_token_hit_rate: float
    ceiling_share: float
    prefill_tokens_per_s: float | None
    input_tokens: int = 0          # the token hit rate's denominator: every input token of the lookups
    partial_blocks: str = ""       # "drop" / "keep" (Mooncake), "" (a recorded log, replayed as recorded)
    dropped_refs: int = 0          # partial last blocks left out ("drop")
    dropped_tokens: int = 0        # their tokens (in input_tokens, never a hit)
    results: list[ReplayResult] = field(default_factory=list)

    def prefill_s_saved(self, r: ReplayResult) -> float | None:
        return r.hit_tokens / self.prefill_tokens_per_s if self.prefill_tokens_per_s else None

    def smallest(self, policy: str) -> ReplayResult | None:
        """The smallest capacity whose token hit rate reaches ceiling_share of the ceiling (None: none did)."""
        goal = self.ceiling_share * self.ceiling_token_hit_rate
        ok = [r for r in self.results if r.policy == policy and r.token_hit_rate >= goal - 1e-12]
        return min(ok, key=lambda r: r.capacity_blocks) if ok else None

    def policies(self) -> list[str]:
        return list(dict.fromkeys(r.policy for r in self.results))

    def to_dict(self) -> dict:
        rows = []
        for r in self.results:
            row = asdict(r)
            row.update(capacity_bytes=r.capacity_blocks * self.block_bytes, block_hit_rate=r.block_hit_rate,
                       token_hit_rate=r.token_hit_rate, prefill_s_saved=self.prefill_s_saved(r),
                       requests_per_s=r.events_per_s if math.isfinite(r.events_per_s) else None)
            rows.append(row)
        smallest = {}
        for p in self.policies():
            best = self.smallest(p)
            smallest[p] = None if best is None else {"capacity_blocks": best.capacity_blocks,
                                                     "capacity_bytes": best.capacity_blocks * self.block_bytes}
        return {"trace": self.source, "events": self.events, "lookups": self.lookups, "block_refs": self.block_refs,
                "unique_blocks": self.unique_blocks, "block_bytes": self.block_bytes,
                "ceiling": {"block_hit_rate": self.ceiling_block_hit_rate,
                            "token_hit_rate": self.ceiling_token_hit_rate},
                "ceiling_share": self.ceiling_share, "prefill_tokens_per_s": self.prefill_tokens_per_s,
                "token_hit_rate_of": "input_tokens", "input_tokens": self.input_tokens,
                "block_hit_rate_of": "block_refs", "partial_blocks": self.partial_blocks,
                "dropped_partial_blocks": self.dropped_refs, "dropped_partial_tokens": self.dropped_tokens,
                "results": rows, "smallest_capacity": smallest}


def plan(trace: Trace, capacities_blocks: Sequence[int], policies: Sequence[str], *, block_bytes: int,
         ceiling_share: float = 0.9, prefill_tokens_per_s: float | None = None,
         progress: Callable[[int], None] | None = None) -> Plan:
    """Replay `trace` at every capacity (blocks) under every policy, capacities in increasing order."""
    for i, cap in enumerate(capacities_blocks):
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap <= 0:
            raise ValueError(f"capacities_blocks[{i}] must be an int > 0, got {cap!r}")
    for i, p in enumerate(policies):
        if p not in POLICY_NAMES:
            raise ValueError(f"policies[{i}] must be one of {list(POLICY_NAMES)}, got {p!r}")
    if not 0.0 < ceiling_share <= 1.0:
        raise ValueError(f"ceiling_share must be in (0, 1], got {ceiling_share!r}")
    if prefill_tokens_per_s is not None and not prefill_tokens_per_s > 0:
        raise ValueError(f"prefill_tokens_per_s must be > 0, got {prefill_tokens_per_s!r}")
    ceiling = summarize(trace, ceiling_hits(trace), policy="infinite", capacity_blocks=0)
    out = Plan(source=trace.source, events=len(trace), lookups=ceiling.lookups, block_refs=int(len(trace.block_ids)),
               unique_blocks=trace.unique_blocks(), block_bytes=block_bytes,
               ceiling_block_hit_rate=ceiling.block_hit_rate, ceiling_token_hit_rate=ceiling.token_hit_rate,
               ceiling_share=ceiling_share, prefill_tokens_per_s=prefill_tokens_per_s, input_tokens=ceiling.tokens,
               partial_blocks=trace.partial_blocks, dropped_refs=trace.dropped_refs,
               dropped_tokens=trace.dropped_tokens)
    for cap in sorted(set(int(c) for c in capacities_blocks)):
        for p in policies:
            out.results.append(replay(trace, cap, p, progress=progress)[0])
    return out


def format_plan(plan_: Plan) -> str:
    """The table `kvpool simulate` prints."""
    gib = 1 << 30
    lines = [f"{plan_.source}: {plan_.events} requests, {plan_.block_refs} block refs, {plan_.unique_blocks} unique "
             f"blocks; infinite-pool ceiling: {plan_.ceiling_block_hit_rate:.1%} of blocks, "
             f"{plan_.ceiling_token_hit_rate:.1%} of tokens",
             rate_basis(plan_.block_refs, plan_.input_tokens, plan_.partial_blocks, plan_.dropped_refs,
                        plan_.dropped_tokens)]
    caps = []
    for r in plan_.results:
        size = r.capacity_blocks * plan_.block_bytes
        pct = r.capacity_blocks / plan_.unique_blocks if plan_.unique_blocks else 0.0
        caps.append(f"{r.capacity_blocks} blk {size / gib:.1f}GiB {pct:>4.0%}")
    width = max([22, *map(len, caps)])      # the column fits its widest capacity
    lines.append(f"{'capacity':>{width}}  {'policy':<10} {'block hit':>9} {'token hit':>9} {'prefill s saved':>15} "
                 f"{'replay req/s':>12}")
    for r, cap in zip(plan_.results, caps):
        saved = plan_.prefill_s_saved(r)
        lines.append(f"{cap:>{width}}  {r.policy:<10} {r.block_hit_rate:>9.1%} {r.token_hit_rate:>9.1%} "
                     f"{('-' if saved is None else f'{saved:,.0f}'):>15} {r.events_per_s:>12,.0f}")
    goal = f"{plan_.ceiling_share:.0%} of the ceiling ({plan_.ceiling_share * plan_.ceiling_token_hit_rate:.1%} " \
           f"token hit rate)"
    for p in plan_.policies():
        best = plan_.smallest(p)
        where = "none of these capacities" if best is None else \
            f"{best.capacity_blocks} blocks = {best.capacity_blocks * plan_.block_bytes / gib:.1f} GiB"
        lines.append(f"smallest capacity reaching {goal} with {p}: {where}")
    if plan_.prefill_tokens_per_s is None:
        lines.append("prefill seconds saved: give --prefill-tokens-per-s (the engine's measured prefill rate)")
    return "\n".join(lines)


def rate_basis(block_refs: int, input_tokens: int, partial_blocks: str, dropped_refs: int,
               dropped_tokens: int) -> str:
    """One line saying what the hit rates are shares of (printed under the trace's shape)."""
    blocks = f"block hit rate = hit blocks / {block_refs:,} block refs"
    if not partial_blocks:          # a recorded log: tokens = keys x block_tokens, what the connector asked for
        return f"{blocks}; token hit rate = hit tokens / {input_tokens:,} tokens of the recorded chains (full blocks)"
    if partial_blocks == "drop":
        partial = (f"{dropped_refs:,} partial last blocks dropped (connectors store full blocks only; "
                   f"--partial-blocks keep replays them), their {dropped_tokens:,} tokens counted, never hit")
    else:
        partial = "partial last blocks kept (replayed as stored blocks)"
    return f"{blocks}; token hit rate = hit tokens / {input_tokens:,} input tokens (whole prompts); {partial}"


def plot_plan(plan_: Plan, path: str) -> None:
    """A PNG of token hit rate against capacity, one line per policy, the ceiling dashed. Needs matplotlib
    (the `plot` extra): ImportError otherwise."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    gib = 1 << 30
    for p in plan_.policies():
        rows = [r for r in plan_.results if r.policy == p]
        ax.plot([r.capacity_blocks * plan_.block_bytes / gib for r in rows],
                [100 * r.token_hit_rate for r in rows], marker="o", label=p)
    ax.axhline(100 * plan_.ceiling_token_hit_rate, linestyle="--", color="grey", label="infinite pool")
    ax.set_xscale("log")
    ax.set_xlabel(f"pool capacity (GiB, {plan_.block_bytes / (1 << 20):g} MiB per block)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_title(f"kvpool simulate: {plan_.source.rsplit('/', 1)[-1]}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
