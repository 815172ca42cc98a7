"""Zero-staging access to pool objects: the caller copies straight into and out of the bytes the pool holds.

    put_many(keys, buffers)                caller buffer ──pool's memcpy──▶ extent                   (one copy)
    reserve_many(keys, sizes) -> ExtentWrite  grants, then w.buffers[i] IS the granted extent
        caller's own copy (e.g. a GPU engine's D2H DMA) ──▶ w.buffers[i]
        w.commit()                         xxh3_64 of the bytes in place ─▶ commit: visible to readers
    acquire_many(keys, sizes) -> ExtentRead   a read lease, then r.buffers[i] IS the object's extent
                                           (max_staged=n: at most n staged entries, the read ends before the
                                           next; r.staging_full says it did; lease=False: a caller that checks
                                           each direct entry after copying it may get them unpinned, with no
                                           master round trip, where a same-host node's host index has the chain)
        r.buffers[i] ──caller's own copy (e.g. H2D DMA into the engine's KV blocks)──▶
        r.verify()                         xxh3_64 of the extents against the committed checksums (the same-host
                                           fence, kvpool/fence.py): the leading run that matches stays in r.count
                                           (r.verify_entry(i): the same for entry i, right after copying it;
                                           r.verify_landed(i, digest): the caller hashed its own copy of entry i,
                                           where r.needs_check(i) says the read wants one; r.verify_copy(i, digest)
                                           picks between the two)
        r.release()                        ends the lease: the extents may be reused from then on
        r.rest(staging, max_staged)        a read that ended at staging_full goes on under the same lease (no
                                           second lookup); the lease ends when every read made from it is released

Which entries are direct (`direct[i]`): DRAM extents of a node on this host whose arena is mapped here (PoolClient),
or of the in-process node (EmbeddedPool); and, in an EmbeddedPool with an HBM tier, an HBM hit is handed out as the
device extent itself (a CuPy array: torch takes it through DLPack, no host hop). Every other entry (another host,
SSD, a remote node's HBM) goes through a staging buffer from `staging(nbytes)` (default bytearray): the pool fills
it (reads, verified as they arrive) or sends it at commit (writes). Pass a pinned allocator and those copies are DMA
too. With `pin_host_memory()` the mapped arenas themselves are registered with CUDA in this process.

Contract: read buffers are the pool's memory, never write into them; use nothing after `release()` / `commit()` /
`abort()`. A write not committed before its grant's lifetime is failed ("no_space"), never committed late.
Both records are context managers: leaving one releases (read) or aborts (write, when not committed).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

Staging = Callable[[int], Any]


def default_staging(nbytes: int) -> memoryview:
    return memoryview(bytearray(nbytes))


def staging_of(staging: object) -> Staging:
    """acquire_many's, reserve_many's and ExtentRead.rest's `staging`: None (default_staging) or a callable
    nbytes -> writable buffer (ValueError naming it)."""
    if staging is None:
        return default_staging
    if not callable(staging):
        raise ValueError(f"staging must be a callable nbytes -> writable buffer, got {type(staging).__name__}")
    return staging


def check_max_staged(max_staged: object) -> None:
    """acquire_many's and ExtentRead.rest's `max_staged`: None or an int >= 0 (ValueError naming it)."""
    if max_staged is not None and (isinstance(max_staged, bool) or not isinstance(max_staged, int) or max_staged < 0):
        raise ValueError(f"max_staged must be None or an int >= 0, got {max_staged!r}")


# A read goes on under its lease (ExtentRead.rest) only while the lease has at least this long to run; closer to its
# end the rest is looked up again under a lease of its own, so no read is made on tokens about to expire.
REST_MARGIN_S = 2.0


class SharedLease:
    """One read lease held by an ExtentRead and the reads `rest()` made from it: `end` runs once, when the last of
    them lets go (thread-safe: a prefetch thread may take the rest while the engine thread copies the first)."""

    __slots__ = ("_end", "_holders", "_lock")

    def __init__(self, end: Callable[[], None]) -> None:
        self._end, self._holders, self._lock = end, 1, threading.Lock()

    def join(self) -> None:
        """One more holder (ValueError once the lease has ended)."""
        with self._lock:
            if not self._holders:
                raise ValueError("the read's lease has ended")
            self._holders += 1

    def leave(self) -> None:
        """One holder fewer; the last one ends the lease."""
        with self._lock:
            if not self._holders:
                return
            self._holders -= 1
            last = not self._holders
        if last:
            self._end()


class ExtentWrite:
    """Grants for a batch of puts. `statuses[i]`: "granted" (write `buffers[i]`, then commit), "exists" or
    "no_space" (`buffers[i]` is None)."""

    __slots__ = ("keys", "statuses", "buffers", "direct", "_commit", "_abort", "_done")

    def __init__(self, keys: Sequence[bytes], statuses: list[str], buffers: list[Any], direct: list[bool],
                 commit: Callable[[], list[str]], abort: Callable[[], None]) -> None:
        self.keys, self.statuses, self.buffers, self.direct = list(keys), statuses, buffers, direct
        self._commit, self._abort, self._done = commit, abort, False

    @property
    def granted(self) -> list[int]:
        return [i for i, s in enumerate(self.statuses) if s == "granted"]

    def commit(self) -> list[str]:
        """Checksum and commit every granted entry; one put_many-style status per key ("stored" | "exists" |
        "no_space": a grant that expired or a node that died meanwhile). Once only."""
        if self._done:
            raise ValueError("this ExtentWrite was already committed or aborted")
        self._done = True
        return self._commit()

    def abort(self) -> None:
        """Free every granted extent without committing (idempotent; a no-op after commit)."""
        if not self._done:
            self._done = True
            self._abort()

    def __enter__(self) -> ExtentWrite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


class ExtentRead:
    """The leading `count` hits of a lookup, held by one read lease until `release()`."""

    __slots__ = ("keys", "count", "buffers", "direct", "tiers", "pipeline", "staging_full", "_verify", "_verify_one",
                 "_landed", "_checked", "_release", "_released", "_span", "_rest")

    def __init__(self, keys: Sequence[bytes], buffers: list[Any], direct: list[bool], tiers: list[str],
                 verify: Callable[[int], int], release: Callable[[], None],
                 verify_one: Callable[[int], bool] | None = None,
                 landed: Callable[[int, int], bool] | None = None, checked: frozenset[int] = frozenset(),
                 pipeline: bool = False, staging_full: bool = False,
                 rest: Callable[[Staging, int | None], ExtentRead] | None = None) -> None:
        """`checked`: the entries the read fence covers (direct extents of a peer's arena); `landed(i, digest)`
        judges a caller's hash of its copy of one of them. `pipeline`: the pool hashes on a helper thread
        (PoolClient(verify_threads=1)), so a caller hashing its own copies may too (kvpool/fence.py HashPipe).
        `staging_full`: the read ended at `count` only because acquire_many's `max_staged` entries were staged;
        the key at `count` was a hit too (not a miss, not a bad read): `rest()` reads on from there.
        `rest(staging, max_staged)`: the pool's read of the hits after this one's (see `rest`); None: this read
        cannot be gone on from (`rest` refuses; the caller acquires the remaining keys itself)."""
        if checked and landed is None:
            raise ValueError("checked entries need a landed(i, digest) judge")
        self.keys = list(keys)
        self.count = len(buffers)
        self._span = self.count
        self._rest = rest
        self.buffers, self.direct, self.tiers = buffers, direct, tiers
        self._verify, self._release, self._released = verify, release, False
        self._verify_one = verify_one
        self._landed, self._checked = landed, checked
        self.pipeline = pipeline
        self.staging_full = staging_full

    def verify(self) -> int:
        """Check the direct buffers' bytes now against the committed checksums (what the pool's `verify` mode asks
        for); the first mismatch ends the run: `count` shrinks to the leading verified entries, the bad key is
        reported at release so the pool forgets it. Returns the new `count`. Staged buffers were checked as they
        arrived."""
        if self._released:
            raise ValueError("this ExtentRead was released")
        self.count = self._verify(self.count)
        return self.count

    def verify_entry(self, i: int) -> bool:
        """`verify()` for entry i alone, for a caller that copies entry by entry: call it right after copying
        `buffers[i]` out, while its bytes are still in cache (one pass over memory for copy and check, not two).
        False: `count` shrinks to i (the entries before it stay; the bad key is reported at release)."""
        if self._released:
            raise ValueError("this ExtentRead was released")
        if not 0 <= i < self.count:
            raise ValueError(f"i: {i} is outside the read's {self.count} entries")
        ok = self._verify_one(i) if self._verify_one is not None else self._verify(i + 1) > i
        if not ok:
            self.count = i
        return ok

    def needs_check(self, i: int) -> bool:
        """Whether the read fence covers entry i: a direct extent in a peer's shared arena (staged entries were
        checked as they arrived; an EmbeddedPool's extents are in-process, under the lease)."""
        return i in self._checked

    def verify_landed(self, i: int, digest: int) -> bool:
        """`verify_entry(i)` by the caller's own hash: `digest` is xxh3_64 of entry i's bytes as they landed in the
        caller's copy, in the object's byte order (e.g. a streaming hasher fed each piece right after its copy,
        while it is in cache). It checks what the caller holds, not the extent after the copy, so a change to the
        extent during the copy is caught even if undone. False: `count` shrinks to i, the key is reported at
        release. Entries that `needs_check` says are not covered are accepted as they are."""
        if self._released:
            raise ValueError("this ExtentRead was released")
        if not 0 <= i < self.count:
            raise ValueError(f"i: {i} is outside the read's {self.count} entries")
        if i not in self._checked:
            return True
        ok = self._landed(i, digest)
        if not ok:
            self.count = i
        return ok

    def verify_copy(self, i: int, digest: int | None) -> bool:
        """The fence for entry i once the caller copied it: `verify_landed(i, digest)` where the caller hashed its copy
        (`digest`, for the entries `needs_check` names), else `verify_entry(i)` (the extent hashed now, or nothing
        for entries checked as they arrived). The judge a copy loop that hashes what landed hands each entry to."""
        return self.verify_landed(i, digest) if digest is not None else self.verify_entry(i)

    def rest(self, *, staging: Staging | None = None, max_staged: int | None = None) -> ExtentRead:
        """The hits after this read's entries, as acquire_many(keys[count:], ..., staging=, max_staged=) would hand
        them out, but under this read's lease: no second lookup (no master round trip; the pool counts the hit
        once). For a read that ended at `staging_full` with every entry good (ValueError otherwise, naming why):
        a caller with one ring of staging rows reads a long hit ring by ring. This read stays valid; the lease
        ends when it and every read made from it are released (each its own `release()`). Close to the lease's
        end (REST_MARGIN_S) the rest is looked up again instead, under a lease of its own. A read taken with no
        lease (acquire_many(lease=False) from a host index) goes on from the same index rows, unpinned too."""
        if self._released:
            raise ValueError("this ExtentRead was released")
        if not self.staging_full:
            raise ValueError("rest: this read did not end at staging_full; its hit ends at its last entry")
        if self.count < self._span:
            raise ValueError(f"rest: entry {self.count} of this read failed its check; the hit ends there")
        staging = staging_of(staging)
        check_max_staged(max_staged)
        if self._rest is None:
            raise ValueError("rest: this read cannot go on under its lease")
        return self._rest(staging, max_staged)

    def release(self) -> None:
        """End the lease (idempotent). The buffers must not be used afterwards."""
        if not self._released:
            self._released = True
            self._release()

    def __enter__(self) -> ExtentRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["REST_MARGIN_S", "ExtentRead", "ExtentWrite", "SharedLease", "Staging", "check_max_staged",
           "default_staging", "staging_of"]
