"""Zero-staging access to pool objects: the caller copies straight into and out of the bytes the pool holds.

    put_many(keys, buffers)                caller buffer ──pool's memcpy──▶ extent                   (one copy)
    reserve_many(keys, sizes) -> ExtentWrite  grants, then w.buffers[i] IS the granted extent
        caller's own copy (e.g. a GPU engine's D2H DMA) ──▶ w.buffers[i]
        w.commit()                         xxh3_64 of the bytes in place ─▶ commit: visible to readers
    acquire_many(keys, sizes) -> ExtentRead   a read lease, then r.buffers[i] IS the object's extent
                                           (max_staged=n: at most n staged entries, the read ends before the
                                           next; r.staging_full says it did)
        r.buffers[i] ──caller's own copy (e.g. H2D DMA into the engine's KV blocks)──▶
        r.verify()                         xxh3_64 of the extents against the committed checksums (the same-host
                                           fence, kvpool/fence.py): the leading run that matches stays in r.count
                                           (r.verify_entry(i): the same for entry i, right after copying it;
                                           r.verify_landed(i, digest): the caller hashed its own copy of entry i,
                                           where r.needs_check(i) says the read wants one; r.verify_copy(i, digest)
                                           picks between the two)
        r.release()                        ends the lease: the extents may be reused from then on

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

from typing import Any, Callable, Sequence

Staging = Callable[[int], Any]


def default_staging(nbytes: int) -> memoryview:
    return memoryview(bytearray(nbytes))


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
                 "_landed", "_checked", "_release", "_released")

    def __init__(self, keys: Sequence[bytes], buffers: list[Any], direct: list[bool], tiers: list[str],
                 verify: Callable[[int], int], release: Callable[[], None],
                 verify_one: Callable[[int], bool] | None = None,
                 landed: Callable[[int, int], bool] | None = None, checked: frozenset[int] = frozenset(),
                 pipeline: bool = False, staging_full: bool = False) -> None:
        """`checked`: the entries the read fence covers (direct extents of a peer's arena); `landed(i, digest)`
        judges a caller's hash of its copy of one of them. `pipeline`: the pool hashes on a helper thread
        (PoolClient(verify_threads=1)), so a caller hashing its own copies may too (kvpool/fence.py HashPipe).
        `staging_full`: the read ended at `count` only because acquire_many's `max_staged` entries were staged;
        the key at `count` was a hit too (not a miss, not a bad read): acquire again from there for the rest."""
        if checked and landed is None:
            raise ValueError("checked entries need a landed(i, digest) judge")
        self.keys = list(keys)
        self.count = len(buffers)
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

    def release(self) -> None:
        """End the lease (idempotent). The buffers must not be used afterwards."""
        if not self._released:
            self._released = True
            self._release()

    def __enter__(self) -> ExtentRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["ExtentRead", "ExtentWrite", "Staging", "default_staging"]
