"""Paged attention against a dense reference: prefill, prefill after a cached prefix, batched decode, mixed."""

from __future__ import annotations

import math

import pytest
import torch

from kvpool.kernels.paged_attention import build_metadata, paged_attention, write_kv

BT, HKV, HQ, D, NB = 4, 2, 6, 8, 32


def reference(q, k_all, v_all, first):
    """q [L, HQ, D] at positions first..first+L-1; k/v_all [ctx, HKV, D]; causal; GQA by head repeat."""
    rep = HQ // HKV
    k = k_all.repeat_interleave(rep, dim=1)
    v = v_all.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    q_pos = torch.arange(first, first + q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run(seqs, device="cpu"):
    """seqs: list of (ctx_before, q_len, block_table). Returns (output, expected) on the CPU."""
    torch.manual_seed(0)
    k_cache = torch.zeros(NB, BT, HKV, D, device=device)
    v_cache = torch.zeros(NB, BT, HKV, D, device=device)
    histories = []
    for before, _, table in seqs:  # earlier tokens already in the cache
        k_hist, v_hist = torch.randn(before, HKV, D), torch.randn(before, HKV, D)
        if before:
            meta = build_metadata([before], [before], [table], BT, device)
            write_kv(k_cache, v_cache, meta.slot_mapping, k_hist.to(device), v_hist.to(device))
        histories.append((k_hist, v_hist))
    total = sum(q for _, q, _ in seqs)
    q, k, v = torch.randn(total, HQ, D), torch.randn(total, HKV, D), torch.randn(total, HKV, D)
    meta = build_metadata([s[1] for s in seqs], [s[0] + s[1] for s in seqs], [s[2] for s in seqs], BT, device)
    qd, kd, vd = q.to(device), k.to(device), v.to(device)
    write_kv(k_cache, v_cache, meta.slot_mapping, kd, vd)
    out = paged_attention(qd, kd, vd, k_cache, v_cache, meta).cpu()
    expected, start = [], 0
    for (before, q_len, _), (k_hist, v_hist) in zip(seqs, histories):
        rows = slice(start, start + q_len)
        expected.append(reference(q[rows], torch.cat([k_hist, k[rows]]), torch.cat([v_hist, v[rows]]), before))
        start += q_len
    return out, torch.cat(expected)


@pytest.mark.parametrize("seqs", [
    [(0, 7, [5, 3])],                                   # plain prefill, scattered blocks
    [(6, 5, [9, 1, 4])],                                # chunk after a cached prefix (crosses a block edge)
    [(8, 1, [2, 7, 11]), (2, 1, [0]), (13, 1, [20, 21, 22, 23])],   # batched decode, different lengths
    [(0, 5, [1, 2]), (4, 3, [3, 4]), (9, 1, [5, 6, 7]), (3, 1, [8])],  # mixed step
])
def test_paged_attention_matches_dense_reference(seqs):
    out, expected = run(seqs)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_paged_attention_on_cuda_matches_dense_reference():
    out, expected = run([(0, 5, [1, 2]), (4, 3, [3, 4]), (9, 1, [5, 6, 7]), (3, 1, [8])], device="cuda")
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_write_kv_places_tokens_at_their_slots():
    k_cache = torch.zeros(NB, BT, HKV, D)
    v_cache = torch.zeros(NB, BT, HKV, D)
    meta = build_metadata([6], [6], [[7, 2]], BT)
    assert meta.slot_mapping.tolist() == [28, 29, 30, 31, 8, 9]
    k = torch.arange(6.0)[:, None, None].expand(6, HKV, D).contiguous()
    write_kv(k_cache, v_cache, meta.slot_mapping, k, -k)
    assert k_cache[7, :, 0, 0].tolist() == [0, 1, 2, 3]
    assert k_cache[2, :2, 0, 0].tolist() == [4, 5]
    assert v_cache[2, :2, 1, 3].tolist() == [-4, -5]
    assert k_cache[2, 2:].abs().sum() == 0 and k_cache[0].abs().sum() == 0
