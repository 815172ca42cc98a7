"""Caller buffers -> flat uint8 memoryviews, without copying and without importing torch.

Accepted: bytes, bytearray, memoryview, numpy arrays, anything with the buffer protocol, and torch CPU tensors
(recognised by duck typing: `.numpy()` and `__dlpack__`; torch is taken from sys.modules, so it is never imported
here). Every mistake is a ValueError naming the argument (e.g. "buffers[3] ..."), raised before any pool state moves.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvpool.tiers.dram import as_byte_view


def _is_torch_tensor(obj: Any) -> bool:
    return hasattr(obj, "__dlpack__") and hasattr(obj, "numpy") and hasattr(obj, "is_contiguous") \
        and not isinstance(obj, np.ndarray)


def _torch_bytes(obj: Any, arg: str) -> memoryview:
    device = getattr(obj, "device", None)
    if getattr(device, "type", "cpu") != "cpu":
        raise ValueError(f"{arg} is a tensor on {device}; pass a CPU tensor (the pool copies host memory)")
    if not obj.is_contiguous():
        raise ValueError(f"{arg} must be a contiguous tensor (call .contiguous() first)")
    torch = sys.modules["torch"]  # present: the caller made a tensor
    flat = obj.detach().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)  # reinterpret, no copy (works for bfloat16, which numpy lacks)
    return memoryview(flat.numpy())


def as_bytes(obj: Any, arg: str) -> memoryview:
    """Flat, C-contiguous uint8 view of `obj` (may be read-only). Torch tensors are turned into a buffer here;
    the contiguity check and the flattening are the tier layer's `as_byte_view`."""
    if _is_torch_tensor(obj):
        view = _torch_bytes(obj, arg)
    else:
        try:
            view = memoryview(obj)
        except TypeError:
            raise ValueError(f"{arg} must be bytes-like, a numpy array or a CPU torch tensor, got "
                             f"{type(obj).__name__}") from None
    return as_byte_view(view, arg)


def byte_views(objs: Sequence[Any], arg: str, *, writable: bool) -> list[memoryview]:
    """`as_writable_bytes` (writable) or `as_bytes` of each of `objs`, a mistake naming `arg[i]`: a batch's buffers
    in one call. Flat uint8 numpy arrays and flat byte memoryviews (what most callers pass) are taken as they are,
    without the general path's checks or building the argument's name (~2 us per buffer)."""
    convert = as_writable_bytes if writable else as_bytes
    out = []
    for i, obj in enumerate(objs):
        kind = type(obj)
        if kind is np.ndarray and obj.ndim == 1 and obj.dtype.char == "B" and obj.flags.c_contiguous \
                and (obj.flags.writeable or not writable):
            out.append(memoryview(obj))
        elif kind is memoryview and obj.format == "B" and obj.ndim == 1 and obj.c_contiguous \
                and not (writable and obj.readonly):
            out.append(obj)
        else:
            out.append(convert(obj, f"{arg}[{i}]"))
    return out


def as_writable_bytes(obj: Any, arg: str) -> memoryview:
    """Like `as_bytes`, but the pool will write into it: read-only buffers are refused."""
    if type(obj) is memoryview and obj.format == "B" and obj.ndim == 1 and obj.c_contiguous and not obj.readonly:
        return obj      # already what as_bytes makes (a get's buffers, often): ~1 us per buffer saved
    view = as_bytes(obj, arg)
    if view.readonly:
        raise ValueError(f"{arg} is read-only ({type(obj).__name__}); pass a bytearray, numpy array or tensor")
    return view
