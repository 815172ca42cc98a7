"""kernels/streams.py: per-layer loads ordered by their waits, saves gathered into pool memory, buffers shared (never
copied) whether they come through the buffer protocol or DLPack. CPU tensors here; the CUDA stream version is the
gpu test at the end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvpool.kernels.kv_transfer import as_byte_tensor, object_shape, object_view
from kvpool.kernels.streams import CudaCopies, HostCopies, LayerwiseLoad, copies_for, gather_to

LAYERS, BLOCKS, BT, HEADS, DIM = 4, 6, 2, 2, 3


def cache(device="cpu"):
    return torch.zeros(LAYERS, 2, BLOCKS, BT, HEADS, DIM, device=device)


def objects(n, device="cpu"):
    shape = (LAYERS, 2, BT, HEADS, DIM)
    return [torch.arange(np.prod(shape), dtype=torch.float32).view(shape).add(1000 * (i + 1)).to(device)
            for i in range(n)]


def arrived(kv, block_ids, objs):
    return [all(torch.equal(kv[layer, :, b], o[layer]) for b, o in zip(block_ids, objs)) for layer in range(LAYERS)]


def test_deferred_layerwise_load_delivers_each_layer_at_its_wait():
    kv, objs = cache(), objects(2)
    pool_memory = [memoryview(o.numpy()).cast("B") for o in objs]          # host bytes, like arena extents
    load = LayerwiseLoad(kv, [4, 1], pool_memory, HostCopies(deferred=True))
    load.start()
    assert arrived(kv, [4, 1], objs) == [False] * LAYERS and not load.done()
    load.wait(0)
    assert arrived(kv, [4, 1], objs) == [True, False, False, False]
    load.wait(2)                                                            # out of order: only layer 2 comes
    assert arrived(kv, [4, 1], objs) == [True, False, True, False]
    load.wait(2)                                                            # a second wait copies nothing again
    load.finish()
    assert arrived(kv, [4, 1], objs) == [True] * LAYERS and load.done()
    assert kv[:, :, [0, 2, 3, 5]].abs().sum() == 0                          # no other block touched
    with pytest.raises(RuntimeError, match="called twice"):
        load.start()


def test_whole_load_arrives_at_the_first_wait_and_immediate_copies_at_start():
    kv, objs = cache(), objects(1)
    load = LayerwiseLoad(kv, [3], objs, HostCopies(deferred=True), layerwise=False)
    load.start()
    assert arrived(kv, [3], objs) == [False] * LAYERS
    load.wait(0)
    assert arrived(kv, [3], objs) == [True] * LAYERS
    kv2 = cache()
    LayerwiseLoad(kv2, [3], objs, HostCopies()).start()
    assert arrived(kv2, [3], objs) == [True] * LAYERS


def test_gather_to_pool_memory_runs_before_it_returns_even_when_deferred():
    kv = cache()
    kv.copy_(torch.randn_like(kv))
    extents = [bytearray(4 * LAYERS * 2 * BT * HEADS * DIM) for _ in range(2)]
    marker = gather_to(kv, [5, 0], extents, HostCopies(deferred=True))
    HostCopies(deferred=True).synchronize(marker)                           # nothing left to run
    for b, ext in zip([5, 0], extents):
        assert torch.equal(object_view(ext, kv), kv[:, :, b])


def test_buffers_are_shared_not_copied():
    arr = np.arange(16, dtype=np.uint8)
    for buf, first in ((arr, 0), (memoryview(arr), 0), (memoryview(arr)[4:], 4)):
        as_byte_tensor(buf)[0] = 200 + first
        assert arr[first] == 200 + first
    raw = bytearray(8)
    as_byte_tensor(raw)[7] = 9
    assert raw[7] == 9

    class DlpackOnly:                                                       # e.g. a CuPy array, host edition
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kwargs):
            return self.t.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    src = torch.zeros(8, dtype=torch.uint8)
    as_byte_tensor(DlpackOnly(src))[3] = 5
    assert src[3] == 5
    with pytest.raises(ValueError, match="neither a tensor, a host buffer nor DLPack-capable"):
        as_byte_tensor(object())
    kv = cache()
    with pytest.raises(ValueError, match=r"buffer: has 40 bytes, one block needs 384 \(4, 2, 2, 2, 3\)"):
        object_view(bytearray(40), kv)
    assert object_view(bytearray(4 * int(np.prod(object_shape(kv)))), kv).shape == object_shape(kv)


def test_copies_for_picks_the_device():
    assert isinstance(copies_for(cache()), HostCopies)
    assert copies_for(cache(), deferred=True).deferred


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")
def test_cuda_layerwise_load_from_pinned_memory_on_a_side_stream():
    kv = cache("cuda")
    objs = objects(3)
    pinned = [o.pin_memory() for o in objs]
    copies = copies_for(kv)
    assert isinstance(copies, CudaCopies)
    load = LayerwiseLoad(kv, [0, 2, 5], pinned, copies)
    load.start()
    for layer in range(LAYERS):
        load.wait(layer)                              # the compute stream waits on the side stream's event
        torch.cuda.current_stream().synchronize()
        assert all(torch.equal(kv[layer, :, b].cpu(), o[layer]) for b, o in zip([0, 2, 5], objs))
    load.finish()
    assert load.done()
    out = [torch.empty_like(o).pin_memory() for o in objs]
    copies.synchronize(gather_to(kv, [0, 2, 5], out, copies))
    assert all(torch.equal(a, b) for a, b in zip(out, objs))
