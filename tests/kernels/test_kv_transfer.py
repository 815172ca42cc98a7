"""gather/scatter between the paged cache and pool objects [layers, 2, block_tokens, kv_heads, head_dim]."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import xxhash

from kvpool.kernels.kv_transfer import gather_blocks, gather_layer, object_shape, scatter_blocks, scatter_layer

L, NB, BT, H, D = 3, 6, 4, 2, 5


@pytest.fixture
def cache():
    return torch.arange(L * 2 * NB * BT * H * D, dtype=torch.float32).view(L, 2, NB, BT, H, D)


@pytest.fixture(params=[D, 8], ids=["160-byte runs", "256-byte runs"])
def hashed_cache(request, copy_path):
    """Runs of 160 bytes always take the copy then the hash; 256-byte runs (whole 64-byte stripes) take the
    one-pass scatter (kvpool/copyhash.py) when `copy_path` is "one pass"."""
    dim = request.param
    return torch.arange(L * 2 * NB * BT * H * dim, dtype=torch.float32).view(L, 2, NB, BT, H, dim)


def test_object_layout_is_layer_major_k_then_v(cache):
    out = torch.empty(1, *object_shape(cache))
    gather_blocks(cache, [4], out)
    for layer in range(L):
        assert torch.equal(out[0, layer, 0], cache[layer, 0, 4])
        assert torch.equal(out[0, layer, 1], cache[layer, 1, 4])
    flat = out[0].reshape(-1)
    per_layer = 2 * BT * H * D
    assert torch.equal(flat[per_layer:per_layer + BT * H * D], cache[1, 0, 4].reshape(-1))  # layer 1 K by offset


def test_scatter_then_gather_round_trips_and_touches_only_target_blocks(cache):
    before = cache.clone()
    src = [torch.randn(object_shape(cache)) for _ in range(2)]
    scatter_blocks(cache, [5, 1], src)
    assert torch.equal(cache[:, :, 5], src[0]) and torch.equal(cache[:, :, 1], src[1])
    untouched = [0, 2, 3, 4]
    assert torch.equal(cache[:, :, untouched], before[:, :, untouched])
    back = torch.empty(2, *object_shape(cache))
    gather_blocks(cache, [5, 1], back)
    assert torch.equal(back[0], src[0]) and torch.equal(back[1], src[1])


def test_scatter_after_hook_runs_per_landed_block_and_stops_the_scatter(cache):
    """`after(i, digest)` runs once block i is in the cache (digest None: nothing asked to hash it); False stops
    before the next block, which keeps its old bytes."""
    before = cache.clone()
    src = [torch.randn(object_shape(cache)) for _ in range(3)]
    seen = []

    def after(i, digest):
        assert torch.equal(cache[:, :, [5, 1, 3][i]], src[i])   # landed before the hook runs
        assert digest is None
        seen.append(i)
        return i != 1

    assert scatter_blocks(cache, [5, 1, 3], src, after=after) == 1     # block 1 landed but was refused
    assert seen == [0, 1]
    assert torch.equal(cache[:, :, 3], before[:, :, 3])
    assert scatter_blocks(cache, [5, 1, 3], src, after=lambda i, digest: True) == 3
    assert scatter_blocks(cache, [5, 1, 3], src) == 3 and torch.equal(cache[:, :, 3], src[2])


def test_scatter_hashes_each_block_as_it_landed_in_object_order(hashed_cache):
    """`after(i, digest)` with `hash_landed`: digest is the xxh3_64 of block i's runs as they sit in the cache right
    after its copy, in the object's byte order, so it equals the hash of the object's bytes; None where hash_landed(i)
    is False."""
    cache = hashed_cache
    src = [torch.randn(object_shape(cache)) for _ in range(3)]
    want = [xxhash.xxh3_64_intdigest(t.numpy().tobytes()) for t in src]
    seen = []

    def landed(i, digest):
        assert torch.equal(cache[:, :, [5, 1, 3][i]], src[i])
        seen.append(digest)
        return True

    assert scatter_blocks(cache, [5, 1, 3], src, after=landed, hash_landed=lambda i: i != 1) == 3
    assert seen == [want[0], None, want[2]]


def test_the_hash_of_what_landed_sees_a_source_changed_after_its_copy(hashed_cache):
    """The digest is of the cache's bytes: a change to the source after the copy (undone or not) does not reach
    it, and a change that did land is seen even once the source is restored. False stops the scatter."""
    cache = hashed_cache
    src = [torch.randn(object_shape(cache)) for _ in range(3)]
    committed = [xxhash.xxh3_64_intdigest(t.numpy().tobytes()) for t in src]
    raw = src[1].view(-1).view(torch.uint8)

    def landed(i, digest):
        if i == 0:
            raw[7] ^= 0xFF                   # lands with block 1's copy
        if i == 1:
            raw[7] ^= 0xFF                   # the source is the committed object again
        return digest == committed[i]

    before = cache[:, :, 3].clone()
    assert scatter_blocks(cache, [5, 1, 3], src, after=landed, hash_landed=lambda i: True) == 1
    assert xxhash.xxh3_64_intdigest(src[1].numpy().tobytes()) == committed[1]
    assert not torch.equal(cache[:, :, 1], src[1]) and torch.equal(cache[:, :, 3], before)


@pytest.mark.parametrize("stop", [None, 1, 3], ids=["all", "stop in the front half", "stop in the back half"])
def test_a_helper_copies_the_back_half_while_after_runs_here_in_order(hashed_cache, stop):
    """With `helper`, blocks 0-2 of 5 are copied on this thread and 3-4 on the helper's; `after` runs on this thread
    in block order with each block's digest. A stop returns its index only once the helper is done (the back half
    has landed, though the return value does not count it); a stop at block 1 leaves block 2 uncopied."""
    cache = hashed_cache
    ids = [5, 1, 3, 0, 4]
    src = [torch.randn(object_shape(cache)) for _ in ids]
    want = [xxhash.xxh3_64_intdigest(t.numpy().tobytes()) for t in src]
    copied_on, judged = {}, []
    here = threading.current_thread().name

    def hashed(i):
        copied_on[i] = threading.current_thread().name
        return True

    def after(i, digest):
        assert torch.equal(cache[:, :, ids[i]], src[i]) and digest == want[i]
        judged.append((i, threading.current_thread().name))
        return i != stop

    with ThreadPoolExecutor(1, thread_name_prefix="copy-helper") as helper:
        got = scatter_blocks(cache, ids, src, after=after, hash_landed=hashed, helper=helper)
    assert got == (5 if stop is None else stop)
    assert judged == [(i, here) for i in range(got + (stop is not None))]
    front = [0, 1] if stop == 1 else [0, 1, 2]          # a stop in the front half ends this thread's copies there
    assert sorted(i for i, t in copied_on.items() if t == here) == front
    assert sorted(i for i, t in copied_on.items() if t.startswith("copy-helper")) == [3, 4]
    landed = [torch.equal(cache[:, :, b], t) for b, t in zip(ids, src)]
    assert landed == [True, True, stop != 1, True, True]     # the helper finished before the return


def test_a_helper_fault_reaches_the_caller_and_a_helper_needs_hash_landed(cache):
    src = [torch.randn(object_shape(cache)) for _ in range(4)]

    def hashed(i):
        if i == 3:
            raise RuntimeError("block 3 failed on the helper")
        return False

    with ThreadPoolExecutor(1) as helper:
        with pytest.raises(RuntimeError, match=r"^block 3 failed on the helper$"):
            scatter_blocks(cache, [0, 1, 2, 3], src, after=lambda i, d: True, hash_landed=hashed, helper=helper)
        before = cache.clone()
        with pytest.raises(ValueError, match=r"^helper: only a scatter with hash_landed copies on two threads$"):
            scatter_blocks(cache, [0, 1], src[:2], after=lambda i, d: True, helper=helper)
        assert torch.equal(cache, before)                                   # refused before anything was copied


def test_hash_landed_needs_a_host_cache_and_a_judge(cache):
    obj = [torch.randn(object_shape(cache))]
    with pytest.raises(ValueError, match=r"^hash_landed: needs after\(i, digest\)"):
        scatter_blocks(cache, [0], obj, hash_landed=lambda i: True)
    strided = torch.zeros(L, 2, NB, BT, H, D * 2)[..., :D]
    with pytest.raises(ValueError, match=r"^hash_landed: the cache must be one contiguous tensor$"):
        scatter_blocks(strided, [0], obj, after=lambda i, d: True, hash_landed=lambda i: True)
    meta = torch.empty(cache.shape, device="meta")
    with pytest.raises(ValueError, match=r"^hash_landed: only a host cache is hashed as it lands, this one is on meta"):
        scatter_blocks(meta, [0], obj, after=lambda i, d: True, hash_landed=lambda i: True)
    assert torch.equal(strided, torch.zeros_like(strided))       # refused before anything was copied


def test_byte_buffers_are_viewed_not_copied(cache):
    raw = torch.zeros(L * 2 * BT * H * D * 4, dtype=torch.uint8)  # e.g. torch.frombuffer over a pool arena
    gather_blocks(cache, [2], [raw])
    assert torch.equal(raw.view(torch.float32).view(object_shape(cache)), cache[:, :, 2])


def test_layer_variants_equal_object_slices(cache):
    objs = torch.empty(2, *object_shape(cache))
    gather_blocks(cache, [3, 0], objs)
    target = torch.zeros_like(cache)
    for layer in range(L):
        parts = [torch.empty(2, BT, H, D) for _ in range(2)]
        gather_layer(cache, layer, [3, 0], parts)
        assert torch.equal(parts[0], objs[0, layer]) and torch.equal(parts[1], objs[1, layer])
        scatter_layer(target, layer, [1, 2], [objs[0, layer], objs[1, layer]])
    assert torch.equal(target[:, :, 1], cache[:, :, 3]) and torch.equal(target[:, :, 2], cache[:, :, 0])


def test_bad_arguments_raise_naming_them(cache):
    with pytest.raises(ValueError, match=r"^block_ids: 6 is outside \[0, 6\)$"):
        gather_blocks(cache, [6], [torch.empty(object_shape(cache))])
    with pytest.raises(ValueError, match=r"^out: got 1 buffers for 2 block ids$"):
        gather_blocks(cache, [0, 1], [torch.empty(object_shape(cache))])
    with pytest.raises(ValueError, match=r"^src: has 7 elements, one block needs 240"):
        scatter_blocks(cache, [0], [torch.empty(7)])
    with pytest.raises(ValueError, match=r"^src: dtype torch.float64 does not match the cache dtype torch.float32$"):
        scatter_blocks(cache, [0], [torch.empty(object_shape(cache), dtype=torch.float64)])
    with pytest.raises(ValueError, match=r"^layer: 3 is outside \[0, 3\)$"):
        gather_layer(cache, 3, [0], [torch.empty(2, BT, H, D)])
