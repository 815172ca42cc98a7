"""kernels/mapped_scatter.py: whole layers of many pool objects into their cache blocks by one gather and one
index_put, through one address translation. On a CPU cache the translation is the identity and the arithmetic is
the same as on a GPU (where tests/connector/test_gpu_engine.py and the gpu test below run it for real)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvpool.kernels.kv_transfer import object_shape
from kvpool.kernels.mapped_scatter import MappedScatter, host_address
from kvpool.kernels.streams import HostCopies, LayerwiseLoad

LAYERS, BLOCKS, BT, HEADS, DIM = 3, 7, 2, 2, 4
POISON = -7.0


def cache(dtype=torch.float16, device="cpu"):
    return torch.full((LAYERS, 2, BLOCKS, BT, HEADS, DIM), POISON, dtype=dtype, device=device)


def arena_objects(kv, offsets, arena_bytes, seed=0):
    """Objects at byte `offsets` of one host arena (random bytes around them), as uint8 numpy views."""
    obj = int(np.prod(object_shape(kv))) * kv.element_size()
    arena = np.random.default_rng(seed).integers(0, 256, arena_bytes, dtype=np.uint8)
    return arena, [arena[o:o + obj] for o in offsets]


def expected(kv, objs):
    return [torch.from_numpy(o.copy()).view(kv.dtype).view(object_shape(kv)) for o in objs]


def identity(ptr):
    return ptr


def same(a, b):
    """Bitwise equality (random bytes hold NaNs, which torch.equal never calls equal)."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype,offsets", [(torch.float16, [4096, 0, 20480, 9216]),        # 8-byte words
                                           (torch.float32, [1028, 7172]),                   # 4-byte words
                                           (torch.float16, [2, 3074])])                     # 2-byte words
def test_whole_load_lands_every_object_in_its_block_and_nothing_else(dtype, offsets):
    kv = cache(dtype)
    _, objs = arena_objects(kv, offsets, 32768)
    ids = [5, 0, 3, 6][:len(objs)]
    plan = MappedScatter.plan(kv, ids, objs, identity)
    assert plan is not None and plan.count == len(objs)
    plan.scatter(0, LAYERS)
    for b, want in zip(ids, expected(kv, objs)):
        assert same(kv[:, :, b], want)
    others = [b for b in range(BLOCKS) if b not in ids]
    assert bool((kv[:, :, others] == POISON).all())


def test_one_layer_at_a_time_writes_only_that_layer():
    kv = cache()
    _, objs = arena_objects(kv, [0, 8192, 2048], 16384, seed=1)
    plan = MappedScatter.plan(kv, [1, 4, 2], objs, identity)
    want = expected(kv, objs)
    plan.scatter(1, 2)
    for b, w in zip([1, 4, 2], want):
        assert same(kv[1, :, b], w[1])
        assert bool((kv[0, :, b] == POISON).all()) and bool((kv[2, :, b] == POISON).all())
    plan.scatter(0, 1)
    plan.scatter(2, 3)
    assert all(same(kv[:, :, b], w) for b, w in zip([1, 4, 2], want))


def test_sources_in_separate_buffers_share_one_window():
    kv = cache()
    _, a = arena_objects(kv, [0], 4096, seed=2)
    _, b = arena_objects(kv, [1024], 8192, seed=3)
    plan = MappedScatter.plan(kv, [6, 2], [a[0], b[0]], identity)
    plan.scatter(0, LAYERS)
    assert [same(kv[:, :, blk], w) for blk, w in zip([6, 2], expected(kv, [a[0], b[0]]))] == [True, True]


def test_no_plan_where_a_source_is_not_mapped_the_same_way_or_has_the_wrong_size():
    kv = cache()
    arena, objs = arena_objects(kv, [0, 4096], 8192)
    first = objs[0].ctypes.data
    assert MappedScatter.plan(kv, [0, 1], objs, lambda p: None if p != first else p) is None     # one unmapped
    assert MappedScatter.plan(kv, [0, 1], objs, lambda p: p + (64 if p == first else 128)) is None  # two shifts
    assert MappedScatter.plan(kv, [0, 1], [objs[0], arena[4096:4100]], identity) is None        # wrong size
    assert MappedScatter.plan(kv, [], [], identity) is None
    assert MappedScatter.plan(kv, [0, 1], objs, lambda p: p + 4096) is not None                  # one shift: fine
    assert bool((kv == POISON).all())                                                             # plans copy nothing


@pytest.mark.parametrize("layerwise", [True, False])
def test_layerwise_load_goes_mapped_with_a_translation_and_keeps_its_waits(layerwise):
    kv = cache(torch.float32)
    _, objs = arena_objects(kv, [0, 3072], 8192, seed=4)
    want = expected(kv, objs)
    load = LayerwiseLoad(kv, [2, 5], objs, HostCopies(deferred=True), layerwise=layerwise, translate=identity)
    load.start()
    assert load.mapped and bool((kv == POISON).all())
    load.wait(0)
    arrived = [all(same(kv[layer, :, b], w[layer]) for b, w in zip([2, 5], want)) for layer in range(LAYERS)]
    assert arrived == ([True, False, False] if layerwise else [True] * LAYERS)
    load.finish()
    assert all(same(kv[:, :, b], w) for b, w in zip([2, 5], want)) and load.done()
    plain = LayerwiseLoad(cache(torch.float32), [2, 5], objs, HostCopies())
    plain.start()
    assert not plain.mapped


def test_a_source_the_translation_refuses_sends_the_whole_load_block_by_block():
    kv = cache(torch.float32)
    _, objs = arena_objects(kv, [0, 3072], 8192, seed=8)
    second = objs[1].ctypes.data
    load = LayerwiseLoad(kv, [4, 1], objs, HostCopies(), translate=lambda p: None if p == second else p)
    load.start()
    assert not load.mapped
    assert all(same(kv[:, :, b], w) for b, w in zip([4, 1], expected(kv, objs)))
    assert bool((kv[:, :, [0, 2, 3, 5, 6]] == POISON).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")
def test_cuda_mapped_load_reads_pinned_host_memory_in_place():
    from kvpool.pinned import device_address
    from kvpool.tiers.gpu import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"needs CuPy on a CUDA device: {unavailable_reason()}")
    kv = cache(torch.float16, "cuda")
    obj = int(np.prod(object_shape(kv))) * kv.element_size()
    host = torch.from_numpy(np.random.default_rng(5).integers(0, 256, 4 * obj, dtype=np.uint8)).pin_memory()
    srcs = [host[o:o + obj] for o in (2 * obj, 0, 3 * obj)]
    assert device_address(host.data_ptr()) is not None
    assert device_address(np.zeros(64, np.uint8).ctypes.data) is None          # pageable memory is not mapped
    plan = MappedScatter.plan(kv, [6, 1, 3], srcs, device_address)
    assert plan is not None
    plan.scatter(0, LAYERS)
    torch.cuda.synchronize()
    for b, s in zip([6, 1, 3], srcs):
        assert same(kv[:, :, b].cpu(), s.view(kv.dtype).view(object_shape(kv)))
    assert bool((kv[:, :, [0, 2, 4, 5]] == POISON).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")
def test_cuda_mapped_load_on_the_side_stream_survives_a_busy_compute_stream():
    """The plan's index tensors must belong to the copy stream: ones made on the compute stream and dropped after
    `start` were reused by the next allocations there while the gathers were still queued (a device-side assert in
    bench/gpu_path.py at 4K tokens on an H100)."""
    from kvpool.kernels.streams import copies_for
    from kvpool.pinned import device_address
    from kvpool.tiers.gpu import unavailable_reason

    if unavailable_reason() is not None:
        pytest.skip(f"needs CuPy on a CUDA device: {unavailable_reason()}")
    layers, blocks, bt, heads, dim = 30, 260, 16, 3, 64
    kv = torch.full((layers, 2, blocks, bt, heads, dim), POISON, dtype=torch.float32, device="cuda")
    obj = int(np.prod(object_shape(kv))) * kv.element_size()
    count = 256
    host = torch.from_numpy(np.random.default_rng(6).integers(0, 256, count * obj, dtype=np.uint8)).pin_memory()
    order = np.random.default_rng(7).permutation(count)
    srcs = [host[i * obj:(i + 1) * obj] for i in range(count)]
    for layerwise in (True, False):
        kv.fill_(POISON)
        load = LayerwiseLoad(kv, [int(b) for b in order], srcs, copies_for(kv), layerwise=layerwise,
                             translate=device_address)
        load.start()
        assert load.mapped
        for _ in range(20):                              # the compute stream allocates and writes meanwhile
            torch.full((1 << 20,), -1, dtype=torch.int64, device="cuda").add_(1)
        for layer in range(layers):
            load.wait(layer)
        load.finish()
        torch.cuda.synchronize()
        for i in range(count):
            assert same(kv[:, :, int(order[i])].cpu(), srcs[i].view(kv.dtype).view(object_shape(kv))), (layerwise, i)
        assert bool((kv[:, :, [256, 257, 258, 259]] == POISON).all())


def test_host_address_of_each_buffer_kind_and_none_for_what_a_plan_cannot_use():
    arr = np.zeros(4096, np.uint8)
    base = arr.__array_interface__["data"][0]
    assert host_address(arr[1024:2048], 1024) == base + 1024
    assert host_address(memoryview(arr)[2048:3072].toreadonly(), 1024) == base + 2048
    assert host_address(torch.from_numpy(arr)[:1024], 1024) == base
    assert host_address(arr[:1024], 512) is None                           # another size
    assert host_address(arr.reshape(64, 64)[:, :16], 1024) is None          # not contiguous
    assert host_address(bytes(1024), 1024) is not None                     # read-only buffers are fine
    assert host_address(object(), 1024) is None
