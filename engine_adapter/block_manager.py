"""Paged KV block bookkeeping: reference counts, a free queue with LRU reuse, and a local prefix cache.

A block holds `block_tokens` consecutive tokens of one or more sequences (shared prefixes share blocks). A full
block whose KV is computed gets a key, `kvpool.block_keys(namespace, tokens)[i]` — the same key the pool uses, so
a connector can move blocks between this cache and the pool without re-hashing. Invariants:

  * ref_count > 0  <=> the block is in some request's block table, and it is not in the free queue;
  * `cached[key] == b` => blocks[b].key == key (a block is the cached copy of at most one key);
  * the free queue is ordered by eviction preference: head = taken first. Keyless blocks go to the head; freed
    keyed blocks go to the tail, a request's blocks in reverse so that a chain's tail is evicted before its parents.
    A keyed free block stays findable by its key until it is taken for new data (LRU reuse).

Running out of blocks is an ordinary `False` from the check methods; the scheduler then waits or preempts.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvpool.keys import Namespace, block_keys
from kvpool.engine_adapter.request import Request


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    key: bytes | None = None


class BlockManager:
    def __init__(self, num_blocks: int, block_tokens: int, namespace: Namespace, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.block_tokens = block_tokens
        self.namespace = namespace
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def keys(self, req: Request) -> list[bytes]:
        """Keys of req's full blocks (extends the request's cached list; token_ids only ever grow)."""
        full = req.num_tokens // self.block_tokens
        if len(req.block_keys) < full:
            req.block_keys = block_keys(self.namespace, req.token_ids[: full * self.block_tokens])
        return req.block_keys[:full]

    # prefix cache -------------------------------------------------------------------------------------------
    def match_prefix(self, req: Request) -> list[int]:
        """Block ids of the leading full blocks of req already cached here. At least one token is left to
        compute (the last one's logits are needed), so a fully cached prompt gives up its last block."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        for key in self.keys(req):
            b = self.cached.get(key)
            if b is None:
                break
            hits.append(b)
        if hits and len(hits) * self.block_tokens >= req.num_tokens:
            hits.pop()
        return hits

    def can_allocate(self, hit_ids: list[int], num_tokens: int) -> bool:
        """Can a new request take `hit_ids` and fresh blocks up to `num_tokens` tokens?"""
        revived = sum(1 for b in hit_ids if self.blocks[b].ref_count == 0)  # hits still in the free queue
        fresh = max(0, self.blocks_for(num_tokens) - len(hit_ids))
        return revived + fresh <= len(self.free)

    def allocate(self, req: Request, hit_ids: list[int], num_tokens: int) -> None:
        if req.block_ids:
            raise RuntimeError(f"request {req.request_id} already holds blocks")
        if not self.can_allocate(hit_ids, num_tokens):
            raise RuntimeError("allocate called without a successful can_allocate")
        for b in hit_ids:
            block = self.blocks[b]
            if block.ref_count == 0:
                del self.free[b]
            block.ref_count += 1
            req.block_ids.append(b)
        self._grow(req, num_tokens)

    def can_append(self, req: Request, num_tokens: int) -> bool:
        """Can req's block table grow to hold `num_tokens` tokens?"""
        return self.blocks_for(num_tokens) - len(req.block_ids) <= len(self.free)

    def append(self, req: Request, num_tokens: int) -> None:
        if not self.can_append(req, num_tokens):
            raise RuntimeError("append called without a successful can_append")
        self._grow(req, num_tokens)

    def _grow(self, req: Request, num_tokens: int) -> None:
        for _ in range(self.blocks_for(num_tokens) - len(req.block_ids)):
            b, _ = self.free.popitem(last=False)
            block = self.blocks[b]
            if block.key is not None:  # LRU reuse: the cached copy is overwritten, forget it
                if self.cached.get(block.key) == b:
                    del self.cached[block.key]
                block.key = None
            block.ref_count = 1
            req.block_ids.append(b)

    def free_request(self, req: Request) -> None:
        """Drop req's references; blocks reaching zero go to the free queue (keyed ones stay findable)."""
        for b in reversed(req.block_ids):
            block = self.blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[b] = None
                if block.key is None:
                    self.free.move_to_end(b, last=False)
        req.block_ids = []

    def commit(self, req: Request, num_computed_tokens: int) -> None:
        """Register the full blocks among req's first `num_computed_tokens` tokens in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        full = min(num_computed_tokens, req.num_tokens) // self.block_tokens
        if full == 0:
            return
        keys = self.keys(req)
        for i in range(full):
            block = self.blocks[req.block_ids[i]]
            if block.key is not None:
                continue
            if keys[i] not in self.cached:
                self.cached[keys[i]] = block.block_id
                block.key = keys[i]
