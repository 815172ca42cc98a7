"""Tier layer: where object bytes live (HBM, DRAM arena, SSD file), how extents are allocated, and which object
to evict first. Uses only numpy, xxhash and the standard library: a storage node runs without torch; CuPy is
imported lazily by tiers/gpu.py, only where a CUDA driver and CuPy are present (HBM tier, pinning)."""

from .allocator import OffsetAllocator
from .dram import DramArena
from .gpu import cuda_available
from .hbm import HbmArena
from .lru import LRUPolicy
from .policy import POLICY_NAMES, EvictionPolicy, make_policy
from .s3fifo import S3FIFOPolicy
from .ssd import HEADER_BYTES, SsdFile, SsdRecord, checksum_of, record_size
from .types import Location, Tier

__all__ = [
    "HEADER_BYTES", "POLICY_NAMES", "DramArena", "EvictionPolicy", "HbmArena", "LRUPolicy", "Location",
    "OffsetAllocator", "S3FIFOPolicy", "SsdFile", "SsdRecord", "Tier", "checksum_of", "cuda_available", "make_policy", "record_size",
]
