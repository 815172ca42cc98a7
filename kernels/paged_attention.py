"""Paged attention over block tables, torch on CPU (the same code runs on CUDA; no fused kernel yet).

The cache of one layer is a pair of views `k_cache, v_cache: [num_blocks, block_tokens, kv_heads, head_dim]` into
the engine's single KV tensor (see kernels/kv_transfer.py for the whole layout). A step's tokens arrive flattened:

    tokens:  | seq A chunk (prefill, q_len=5) | seq B (decode) | seq C (decode) |
    slot of token t = block_table[pos // block_tokens] * block_tokens + pos % block_tokens

`write_kv` stores the step's new K/V at those slots; `paged_attention` then attends:
  * a prefill chunk with no earlier context uses its own K/V directly (causal, no gather);
  * a prefill chunk after cached tokens gathers its blocks and uses a bottom-right causal mask: query i (absolute
    position ctx_len - q_len + i) sees keys 0..ctx_len - q_len + i;
  * all decode tokens of the step go through one batched call on block tables padded to the longest context,
    padding masked out.
Metadata (masks, padded tables) is built once per step by `build_metadata` and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillSpan:
    q_start: int
    q_len: int
    ctx_len: int                          # tokens of this sequence in the cache after this step
    block_table: torch.Tensor | None      # long [num_blocks]; None when ctx_len == q_len (no gather needed)
    mask: torch.Tensor | None             # bool [q_len, ctx_len] for the cached-prefix case


@dataclass(slots=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor                      # long [num_tokens]
    prefills: list[PrefillSpan] = field(default_factory=list)
    decode_rows: torch.Tensor | None = None         # long [B]: rows of the flattened batch that are decodes
    decode_tables: torch.Tensor | None = None       # long [B, max_blocks]
    decode_mask: torch.Tensor | None = None         # bool [B, 1, 1, max_blocks * block_tokens]


def build_metadata(q_lens: list[int], ctx_lens: list[int], block_tables: list[list[int]], block_tokens: int,
                   device: torch.device | str = "cpu") -> AttentionMetadata:
    """Per-step metadata. `ctx_lens[i]` counts the tokens of sequence i in the cache after this step's writes."""
    slot_parts: list[torch.Tensor] = []
    prefills: list[PrefillSpan] = []
    decode_rows: list[int] = []
    decode_seqs: list[int] = []
    start = 0
    for i, (q_len, ctx_len, table) in enumerate(zip(q_lens, ctx_lens, block_tables)):
        first = ctx_len - q_len
        n_blocks = -(-ctx_len // block_tokens)
        if q_len == 1:
            pos = ctx_len - 1
            slot_parts.append(torch.tensor([table[pos // block_tokens] * block_tokens + pos % block_tokens]))
        else:
            pos = torch.arange(first, ctx_len)
            blocks = torch.tensor(table[:n_blocks], dtype=torch.long)
            slot_parts.append(blocks[pos // block_tokens] * block_tokens + pos % block_tokens)
        if q_len == 1 and ctx_len > 1:
            decode_rows.append(start)
            decode_seqs.append(i)
        elif first == 0:
            prefills.append(PrefillSpan(start, q_len, ctx_len, None, None))
        else:
            bt = torch.tensor(table[:n_blocks], dtype=torch.long, device=device)
            q_pos = torch.arange(first, ctx_len, device=device)
            mask = torch.arange(ctx_len, device=device)[None, :] <= q_pos[:, None]
            prefills.append(PrefillSpan(start, q_len, ctx_len, bt, mask))
        start += q_len
    slots = torch.cat(slot_parts).to(device) if slot_parts else torch.empty(0, dtype=torch.long, device=device)
    meta = AttentionMetadata(slot_mapping=slots, prefills=prefills)
    if decode_rows:
        max_blocks = max(-(-ctx_lens[i] // block_tokens) for i in decode_seqs)
        tables = torch.zeros(len(decode_seqs), max_blocks, dtype=torch.long)
        lens = torch.tensor([ctx_lens[i] for i in decode_seqs])
        for row, i in enumerate(decode_seqs):
            n = -(-ctx_lens[i] // block_tokens)
            tables[row, :n] = torch.tensor(block_tables[i][:n])
        meta.decode_rows = torch.tensor(decode_rows, dtype=torch.long, device=device)
        meta.decode_tables = tables.to(device)
        span = torch.arange(max_blocks * block_tokens)
        meta.decode_mask = (span[None, :] < lens[:, None])[:, None, None, :].to(device)
    return meta


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """Store new K/V [num_tokens, kv_heads, head_dim] at their slots of this layer's cache."""
    heads, dim = k_cache.shape[-2:]
    k_cache.view(-1, heads, dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, heads, dim).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """[n_blocks, bt, H, D] blocks of `table` -> [H, length, D] (one copy)."""
    heads, dim = cache.shape[-2:]
    return cache.index_select(0, table).view(-1, heads, dim)[:length].transpose(0, 1)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] (already written to the cache) -> attention output [T, Hq, D]."""
    out = torch.empty_like(q)
    for span in meta.prefills:
        # 4-D [1, H, L, D] inputs: CPU SDPA takes its fused flash path only for batched 4-D tensors (~10x faster)
        rows = slice(span.q_start, span.q_start + span.q_len)
        qs = q[rows].transpose(0, 1).unsqueeze(0)
        if span.block_table is None:
            ks, vs = k[rows].transpose(0, 1).unsqueeze(0), v[rows].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        else:
            ks = _gather(k_cache, span.block_table, span.ctx_len).unsqueeze(0)
            vs = _gather(v_cache, span.block_table, span.ctx_len).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=span.mask, enable_gqa=True)
        out[rows] = o[0].transpose(0, 1)
    if meta.decode_rows is not None:
        tables = meta.decode_tables
        batch, max_blocks = tables.shape
        heads, dim = k_cache.shape[-2:]
        ks = k_cache[tables].view(batch, -1, heads, dim).transpose(1, 2)   # [B, Hkv, S, D]
        vs = v_cache[tables].view(batch, -1, heads, dim).transpose(1, 2)
        qd = q[meta.decode_rows].unsqueeze(2)                               # [B, Hq, 1, D]
        o = F.scaled_dot_product_attention(qd, ks, vs, attn_mask=meta.decode_mask, enable_gqa=True)
        out[meta.decode_rows] = o.squeeze(2)
    return out
