"""The same-host fence: no reader ever returns bytes other than the committed object's, whatever a stalled peer does.

A same-host client copies straight into and out of a node's mapped /dev/shm arena, so nothing stands between it
and the bytes. Any process can stall at any instruction for any time (GC pause, SIGSTOP, a frozen VM):

    reader   its lease expires mid-stall; the extent is freed and handed to another object; it wakes up and copies
             that object's bytes
    writer   its grant expires mid-stall; the extent goes to another object, which commits; it wakes up and copies
             its own bytes over that object. Nothing stops a write that stalls after its last check (between a
             deadline check and the memcpy, or inside the memcpy), so a late write can always land.

Candidates, measured on bench/pool_remote.py (same-host get of 2 MiB objects, ratio to a plain memcpy in the same
run; `--verify` selects the read side; the figures of the commit that chose this are in its message):

    re-check the lease deadline after the copy   ~free, but covers stalled readers only: a late writer changes an
                                                 extent under a reader whose lease is perfectly valid
    generation stamp per extent, read before     cheap, but needs every writer (clients, the node's own copies, drain
      and after the copy                         moves) to stamp in the right order, and x86 store ordering that the
                                                 non-temporal stores of a large memcpy do not give; Python cannot fence
    quarantine freed extents                     a stall has no bound: any quarantine can be outlived
    verify every copy against the committed      one xxh3_64 pass over the bytes actually returned: correct whatever
      xxh3_64                                    happened to the extent, by whom, for how long (a forged match needs a
                                                 64-bit hash collision)

Chosen: the last, fused with the copy: `copy_verified` copies CHUNK bytes and hashes that chunk of the destination
while it is still in cache (xxh3 runs at ~30 GB/s from cache here, against ~5-8 GB/s for the memcpy itself), so an
object larger than the cache costs one pass over DRAM, not two (32 MiB objects: ~0.7-0.85x of a bare memcpy fused,
~0.5-0.7x hash-after-copy); at 2 MiB the destination is still cached after the copy and both cost ~20%. It is
the default of every read (`PoolClient(verify="all")`). The write side adds two cheap checks that cut
the harm a late writer can do, without being the guarantee:
  * `write_deadline`: a writer starts no copy after its grant's lifetime (PutStartResponse.ttl_ms, counted from
    before the request on this process's monotonic clock, minus a margin), so a client that stalled before its copy
    never writes late;
  * after its copies, the writer asks the arena owner's lock (`DramArena.owner_alive`, the node's flock) whether
    the node still lives: nothing is committed into a dead node's arena (issue 11 item 2).
A late write that still lands turns the object it hit into a miss at its next read, counted in the reader's
`checksum_failures` and reported (ReleaseRequest.corrupt_keys) so the master forgets the object (`dram_corrupt`)
and the next put of its key restores it.
"""

from __future__ import annotations

import math
import time

import xxhash

# 1 MiB: hashed from L2/L3 right after its copy. Not smaller: below ~512 KiB glibc copies with `rep movsb`, which on
# this AMD EPYC ran 3-4x slower between page-aligned buffers (the arena's extents are page-aligned).
CHUNK = 1 << 20
DEADLINE_MARGIN = 0.1     # fraction of a grant's lifetime kept as margin (clock rate error, time to start the copy)
MAX_MARGIN_S = 1.0


def copy_verified(dst: memoryview, src: memoryview, checksum: int) -> bool:
    """Copy `src` into `dst` (equal lengths) and say whether the bytes that landed in `dst` hash to `checksum`.
    False = `dst` holds something other than the committed object: the caller must treat it as a miss."""
    n = len(src)
    if n <= CHUNK:
        dst[:] = src
        return xxhash.xxh3_64_intdigest(dst) == checksum
    h = xxhash.xxh3_64()
    for pos in range(0, n, CHUNK):
        end = pos + CHUNK
        part = dst[pos:end]
        part[:] = src[pos:end]
        h.update(part)
    return h.intdigest() == checksum


def write_deadline(sent_at: float, ttl_ms: int) -> float:
    """The monotonic time after which a writer whose request left at `sent_at` (time.monotonic(), taken before the
    PutStart/MigrateStart call) must not start a copy under grants that live `ttl_ms` from the master's answer.
    The master answered after `sent_at`, so the grant outlives this deadline by at least the margin. ttl_ms 0 (a
    master that does not say) = no deadline."""
    if not ttl_ms:
        return math.inf
    ttl = ttl_ms / 1000.0
    return sent_at + ttl - min(ttl * DEADLINE_MARGIN, MAX_MARGIN_S)


def now() -> float:
    return time.monotonic()


__all__ = ["copy_verified", "write_deadline", "now", "CHUNK"]
