"""Page-locked host memory as a GPU kernel sees it, for the layers above the tiers (the connector may not import
`kvpool.tiers`): `device_address(ptr)` is where a kernel on the GPU reads the pinned host byte at `ptr` (the pool
arenas pinned by `pin_host_memory()` are registered mapped; torch's pinned tensors are mapped by CUDA itself), or
None where `ptr` is not such memory or there is no CUDA device. kernels/mapped_scatter.py reads pool objects there.
"""

from __future__ import annotations

from kvpool.tiers import gpu


def device_address(ptr: int) -> int | None:
    return gpu.device_pointer(ptr)


__all__ = ["device_address"]
