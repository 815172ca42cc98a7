"""The one-pass copy + xxh3_64 (kvpool/_copyhash.c) and the switch that says whether it is used.

A copy that must be checked (the read fence, kvpool/fence.py) or committed with its checksum (a put) used to read
its bytes twice: numpy's copy, then xxhash over the destination. kvpool._copyhash stores each 64-byte stripe and
folds it into XXH3 from the same load, so the hash costs arithmetic the core does while it waits for memory. The
digest is xxhash.xxh3_64_intdigest of the bytes that landed.

It is a C extension built by `pip install` (pyproject.toml `ext-modules`, optional: a machine without a C compiler
installs without it). Every function here returns None where the one-pass copy is off, not built, or not meant for
the arguments (240 bytes or fewer; a scatter whose runs are not whole 64-byte stripes); the caller then copies and
hashes in two passes as before. `KVPOOL_NATIVE_COPY=0` turns it off for a process, `use(False)` at run time (A/B
runs, tests of both paths).

    copy(dst, src)                     -> digest of dst after dst[:] = src
    copy_many(dsts, srcs)              -> [digest, ...], every pair checked before any copy, the GIL released once
    scatter(dst, src, starts, run, at) -> digest of src's bytes after dst[at + starts[k]:][:run] = src[k * run:][:run]
    copy_into(dsts, src)               -> digest of src's bytes after src is copied into dsts[0], dsts[1], ... in turn

The same extension holds the SSD tier's verified record read in C (tiers/ssd.py `read_records`, which owns the
record format and keeps its Python reader for what this one refuses):

    read_records(fd, offsets, keys, payloads, sizes, ns_digest, limit) -> ([digest | None, ...], [(offset, errno)])
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def _load():
    setting = os.environ.get("KVPOOL_NATIVE_COPY", "1")
    if setting not in ("0", "1"):
        raise ValueError(f"KVPOOL_NATIVE_COPY must be 0 (two-pass copy) or 1 (one pass, the default), got {setting!r}")
    if setting == "0":
        return None, "KVPOOL_NATIVE_COPY=0"
    try:
        from kvpool import _copyhash
    except ImportError as exc:      # built without a C compiler
        return None, f"kvpool._copyhash is not built ({exc})"
    return _copyhash, ""


_native, REASON = _load()
_on = _native is not None
MIN_LEN = 241       # XXH3 hashes 240 bytes or fewer with other formulas; those are left to xxhash
STRIPE = 64
# A call that moves at least this many bytes stores them with streaming (non-temporal) stores: what it writes
# leaves the cache anyway, and such stores skip reading each destination line first. The bundled engine's 4,096-token
# load (256 x 720 KiB into the KV cache) took 34.9 ms with them against 42.0 ms without (torch's unchecked copy:
# 37.8 ms); 32 x 2 MiB gets were the same either way. Smaller calls keep what they copied in cache for its reader.
STREAM_MIN = 16 << 20


def simd() -> str:
    """"avx2" or "portable" (the one-pass copy in use, and which code runs it), "" when it is off or not built."""
    return _native.SIMD if _on else ""


def use(enabled: bool) -> bool:
    """Turn the one-pass copy on or off in this process; returns the previous setting. Turning it on where it is
    not built raises RuntimeError naming why."""
    global _on
    if enabled and _native is None:
        raise RuntimeError(f"the one-pass copy is not available: {REASON}")
    previous, _on = _on, bool(enabled)
    return previous


def copy(dst, src) -> int | None:
    n = len(src)
    if not _on or n < MIN_LEN or len(dst) != n:
        return None
    return _native.copy_xxh3(dst, src, stream=n >= STREAM_MIN)


def copy_many(dsts: Sequence, srcs: Sequence) -> list[int] | None:
    sizes = [len(s) for s in srcs]
    if not _on or (sizes and min(sizes) < MIN_LEN):
        return None
    return _native.copy_xxh3_many(dsts, srcs, stream=sum(sizes) >= STREAM_MIN)


def scatter(dst, src, starts, run: int, at: int = 0, *, total: int = 0) -> int | None:
    """`starts`: a uint64 buffer (numpy) of run offsets into dst, in src's order; `at` is added to each. `total`:
    the bytes the caller's whole load moves (one call per object), which decides the streaming stores."""
    if not _on or run % STRIPE or len(src) < MIN_LEN:
        return None
    return _native.scatter_xxh3(dst, src, starts, run, at, stream=max(total, len(src)) >= STREAM_MIN)


def copy_into(dsts: Sequence, src, *, total: int = 0) -> int | None:
    """`dsts`: writable buffers of whole 64-byte stripes that together hold exactly len(src) bytes; `total` as in
    `scatter`."""
    n = _nbytes(src)
    if not _on or n < MIN_LEN or any(_nbytes(d) % STRIPE for d in dsts):
        return None
    return _native.copy_xxh3_into(dsts, src, stream=max(total, n) >= STREAM_MIN)


def read_records(fd: int, offsets: Sequence, keys: Sequence, payloads: Sequence, sizes: Sequence | None = None,
                 ns_digest: bytes | None = None, limit: int = (1 << 64) - 1, *, trace: list | None = None):
    """The SSD records at `offsets` (a multiple of 4096, each record inside `limit` bytes of the file) of `keys`
    (16 bytes each) into `payloads` (writable buffers, `sizes[i]` bytes of each, or all of it), read and verified in
    one C call with the GIL released: ([payload digest or None (a miss), ...], [(offset, errno) of each record whose
    own read failed]). None where the one-pass copy is off or not built, or an argument is outside what the C reader
    takes (a payload of 240 bytes or fewer, an int that is not exactly int, a key that is not 16 bytes of bytes);
    the caller then reads with its Python reader, which names a bad argument. `trace`: a list that gets (offset,
    buffers) of each preadv made (tests check the plan by it)."""
    if not _on:
        return None
    return _native.read_records(fd, offsets, keys, payloads, sizes, ns_digest, limit, trace=trace)


def _nbytes(buf) -> int:
    nbytes = getattr(buf, "nbytes", None)    # numpy arrays, memoryviews: bytes, whatever their shape
    return len(buf) if nbytes is None else nbytes


__all__ = ["REASON", "MIN_LEN", "STREAM_MIN", "simd", "use", "copy", "copy_many", "scatter", "copy_into",
           "read_records"]
