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
the default of every read (`PoolClient(verify="all")`).

Since 2026-11-27 (night) the default is one pass (kvpool/copyhash.py, kvpool/_copyhash.c, a C extension built by
`pip install`): each 64-byte stripe is loaded once, stored to the destination and folded into XXH3 from the same
register, so the check is arithmetic the core does while it waits for memory. The digest is xxh3_64 of the bytes
stored (what landed, exactly as before), and the caller's thread does it all: no helper thread, no second core.
bench/verify_pipeline.py, 32 objects per get from master + node processes, 9 interleaved rounds, ratio to memcpy
at 2 MiB / 512 KiB / 64 KiB: one pass 1.00x / 0.89x / 0.71x, against 0.83x / 0.61x / 0.66x for the helper thread and
0.75x / 0.63x / 0.67x for one thread (the same get with no check at all, which asks the master: 0.88x / 0.63x /
0.34x). The two-pass paths below remain where the extension is not built (no C compiler), for objects of 240 bytes
or fewer, and with KVPOOL_NATIVE_COPY=0 or copyhash.use(False).

A read of many objects (`copy_verified_many`, at least PIPELINE_MIN bytes) moves the hash off the copying thread: a
helper thread hashes each CHUNK once its copy has landed while the caller copies the next one (numpy's copy and
xxh3 both release the GIL). The check is the same (the destination's bytes, hashed after their copy); it costs a
second core instead of time. bench/verify_pipeline.py (master + node processes, 32 objects per get, medians of 25
interleaved rounds, 2026-11-26, shared 2-core Xeon), ratio to memcpy, helper / one thread / no check at all:
    2 MiB    0.81x / 0.65x / 0.88x        1 MiB    0.76x / 0.63x / 0.85x        512 KiB  0.63x / 0.60x / 0.71x
    256 KiB (8 MiB per call) 0.52x / 0.53x: no gain once a call's bytes stay in cache, hence PIPELINE_MIN.
A hand-off per CHUNK beat 2 and 4 MiB (0.83x / 0.81x / 0.77x at 2 MiB); 512 KiB chunks were no better.
`verify_many` does the same for extents a caller copies out of itself (acquire_many's verify(): the direct
transfer's queued loads, CUDA or layer-wise): the helper hashes about half the bytes while the caller hashes the
rest; 256 x 720 KiB (a 4,096-token prompt of SmolLM2) in-process: 11.2 ms against 21.0 ms on one thread. The vLLM
worker feeds a HashPipe the vLLM pages it has just written (ExtentRead.verify_landed: the copy itself is checked, as
copy_verified's): bench/vllm_load.py, 32 x 5.6 MiB, 0.54x memcpy against 0.40x for its extents hashed after each
copy. The bundled engine's CPU load does the same on its own thread (kernels/kv_transfer.py, scatter_blocks with
hash_landed): its blocks land as 60 runs of 12 KiB, so a helper's hand-offs cost more than they overlap (torch's copy
already uses both cores); bench/verify_pipeline.py prints what that check costs over the extent hashed after each
block's copy.
`PoolClient(verify_threads=0)` keeps everything on the calling thread. Tried and not kept: hashing the TCP data
channel's received pieces on the helper (a HashPipe fed through recv_exact's hasher argument): 0.77x / 0.92x of
hashing them on the receiving thread at 512 KiB / 2 MiB (15 interleaved rounds): on 2 cores the node's sender, the
receiver and the helper are three busy threads, and the receiver's own hash of a just-received piece is cheap (it
is in cache).

The write side adds two cheap checks that cut the harm a late writer can do, without being the guarantee:
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
import os
import queue
import threading
import time
from collections.abc import Sequence

import numpy as np
import xxhash

from kvpool import copyhash

# 1 MiB: hashed from L2/L3 right after its copy. Not smaller: below ~512 KiB glibc copies with `rep movsb`, which on
# this AMD EPYC ran 3-4x slower between page-aligned buffers (the arena's extents are page-aligned).
CHUNK = 1 << 20
DEADLINE_MARGIN = 0.1     # fraction of a grant's lifetime kept as margin (clock rate error, time to start the copy)
MAX_MARGIN_S = 1.0


def copy_verified(dst: memoryview, src: memoryview, checksum: int) -> bool:
    """Copy `src` into `dst` (equal lengths) and say whether the bytes that landed in `dst` hash to `checksum`.
    False = `dst` holds something other than the committed object: the caller must treat it as a miss."""
    landed = copyhash.copy(dst, src)
    if landed is not None:
        return landed == checksum
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


def copy_hashed(dst: memoryview, src: memoryview) -> int:
    """Copy `src` into `dst` (equal lengths) and return the xxh3_64 of the bytes that landed in `dst`: a writer's
    checksum to commit, taken in the same pass as its copy where the one-pass copy is on."""
    landed = copyhash.copy(dst, src)
    if landed is not None:
        return landed
    dst[:] = src
    return xxhash.xxh3_64_intdigest(dst)


# Below this many bytes in one call the copied bytes are still in cache when the calling thread hashes them, and
# the helper's hand-offs (a thread wake-up, numpy's per-object copy call) cost more than the overlap saves.
PIPELINE_MIN = 8 * CHUNK
# Bytes copied per hand-off to the helper: fewer wake-ups against a longer tail hashed after the last copy.
HANDOFF = CHUNK


class _HashHelper:
    """One daemon thread per process that hashes destination chunks the caller has finished copying, while the
    caller copies the next ones: xxh3 and numpy's copy both release the GIL, so the two run on two cores. Pieces
    are hashed in the order they were queued (one thread, one FIFO), so a streaming hasher sees its object's chunks
    in order. Started on first use and again in a forked child (a fork keeps no threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._queue: queue.SimpleQueue | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()   # a fork taken while another thread held it would keep it held forever

    def submit(self, pieces: list, done: queue.SimpleQueue) -> None:
        q = self._queue
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    q = queue.SimpleQueue()
                    threading.Thread(target=self._run, args=(q,), name="kvpool-verify", daemon=True).start()
                    self._queue, self._pid = q, os.getpid()
                q = self._queue
        q.put((pieces, done))

    @staticmethod
    def _run(q: queue.SimpleQueue) -> None:
        while True:
            pieces, done = q.get()
            try:
                for hasher, view in pieces:
                    hasher.update(view)
            except BaseException as exc:  # reported to the caller, which raises it; this thread goes on
                done.put(exc)
            else:
                done.put(None)


_helper = _HashHelper()


class HashPipe:
    """Pieces of objects to hash on the helper thread, in the order they are added, HANDOFF bytes per hand-off.
    `finish()` waits until every queued piece is hashed (then the hashers' digests are final) and raises the
    helper's error, if any; call it exactly once, also when the caller fails."""

    __slots__ = ("_done", "_handed", "_pieces", "_pending")

    def __init__(self) -> None:
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._handed = 0
        self._pieces: list = []
        self._pending = 0

    def add(self, hasher, view: memoryview) -> None:
        self._pieces.append((hasher, view))
        self._pending += len(view)
        if self._pending >= HANDOFF:
            self._hand_off()

    def _hand_off(self) -> None:
        _helper.submit(self._pieces, self._done)
        self._handed += 1
        self._pieces, self._pending = [], 0

    def finish(self) -> None:
        if self._pieces:
            self._hand_off()
        errors = [err for err in (self._done.get() for _ in range(self._handed)) if err is not None]
        self._handed = 0
        if errors:
            raise errors[0]


def copy_verified_many(dsts: Sequence[memoryview], srcs: Sequence[memoryview], checksums: Sequence[int], *,
                       pipeline: bool = True) -> list[bool]:
    """`copy_verified` of several objects in one call: entry j says whether dsts[j] hashes to checksums[j] after
    the copy. With `pipeline` and at least PIPELINE_MIN bytes in all, this thread copies (numpy, GIL released) while
    the helper thread hashes what has already landed (a HashPipe): the same check over the same destination bytes,
    each hashed only after its copy finished, so the guarantee is copy_verified's. Where the one-pass copy is on
    (kvpool/copyhash.py) every object is copied and hashed in one pass on this thread instead, the GIL released
    once for the whole call. Every pair's lengths are checked before any byte moves."""
    if len(dsts) != len(srcs) or len(srcs) != len(checksums):
        raise ValueError(f"dsts, srcs and checksums differ in length ({len(dsts)}, {len(srcs)}, {len(checksums)})")
    for dst, src in zip(dsts, srcs):
        if len(dst) != len(src):
            raise ValueError(f"destination of {len(dst)} bytes for a source of {len(src)}")
    landed = copyhash.copy_many(dsts, srcs)
    if landed is not None:
        return [got == c for got, c in zip(landed, checksums)]
    if not pipeline or sum(len(s) for s in srcs) < PIPELINE_MIN:
        return [copy_verified(d, s, c) for d, s, c in zip(dsts, srcs, checksums)]
    hashers = [xxhash.xxh3_64() for _ in srcs]
    pipe = HashPipe()
    try:
        for hasher, dst, src in zip(hashers, dsts, srcs):
            for pos in range(0, len(src), CHUNK):
                part = dst[pos:pos + CHUNK]
                np.copyto(np.frombuffer(part, np.uint8), np.frombuffer(src[pos:pos + CHUNK], np.uint8))
                pipe.add(hasher, part)
    finally:
        pipe.finish()   # all hashed: nothing in flight when this returns or raises
    return [hasher.intdigest() == c for hasher, c in zip(hashers, checksums)]


def verify_many(views: Sequence[memoryview], checksums: Sequence[int], *, pipeline: bool = True) -> list[bool]:
    """Whether each view hashes to its checksum now: the read fence on extents a caller copied out of itself (after
    its copy, kvpool/transfer.py check_mapped). With `pipeline` and at least PIPELINE_MIN bytes, the helper thread
    hashes about half the bytes (handed on as they add up) while this thread hashes the rest: two cores."""
    if len(views) != len(checksums):
        raise ValueError(f"views and checksums differ in length ({len(views)}, {len(checksums)})")
    if not pipeline or sum(len(v) for v in views) < PIPELINE_MIN:
        return [xxhash.xxh3_64_intdigest(v) == c for v, c in zip(views, checksums)]
    helped: dict[int, xxhash.xxh3_64] = {}
    mine: list[int] = []
    helper_bytes = my_bytes = 0
    pipe = HashPipe()
    try:
        for j, view in enumerate(views):
            if helper_bytes <= my_bytes:
                helped[j] = hasher = xxhash.xxh3_64()
                pipe.add(hasher, view)
                helper_bytes += len(view)
            else:
                mine.append(j)
                my_bytes += len(view)
        digests = {j: xxhash.xxh3_64_intdigest(views[j]) for j in mine}
    finally:
        pipe.finish()
    digests.update((j, h.intdigest()) for j, h in helped.items())
    return [digests[j] == c for j, c in enumerate(checksums)]


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


__all__ = ["copy_verified", "copy_verified_many", "copy_hashed", "verify_many", "HashPipe", "write_deadline", "now",
           "CHUNK", "PIPELINE_MIN"]
