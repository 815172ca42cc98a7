"""HostIndex: a node's published index of its objects (DRAM extents, SSD records), read by same-host clients with no
RPC.

Why: a same-host client that has never read a key must ask the master where it is (a Lookup: ~400 us on 2 cores,
more than copying and hashing 32 x 64 KiB). The node publishes, in its arena file's index region (tiers/dram.py),
where each object the master told it of lives (an extent of its DRAM arena, or a record of its SSD data file, which
same-host clients open and read themselves: kvpool/transfer.py); a client that maps the arena finds a whole chain
there with one probe and reads it (DRAM through the read fence, SSD records with their own checks), and the master
hears of the get afterwards, off its path. The probe is
C where it is built (tiers/_hostprobe.c: a 32-key chain in ~5 us quiet and ~25 us inside a get, against 55-90 and
150-200 us for the numpy probe below, whose ~20 calls find their code and data evicted by the get's copies).

```
 region = slots x 64 bytes, buckets of WAYS = 4 slots (one 256-byte run); key k (16 bytes) lives in bucket b(k)
 slot  [k0 | k1 | offset | size | checksum | stamp | place | seal]     eight little-endian u64
        place = 0: a DRAM extent at `offset` of the arena; 1: an SSD record at `offset` of the node's data file
        seal = a 64-bit mix of the first seven words, never 0; 0 marks an empty slot
```

Who writes: only the node (`writer=True`), serialised by its caller: `publish` (the master's commit feed,
store/host_feed.py), `unpublish` (objects the master no longer has, learnt from a client's use report) and `clear`
(a removal, a registration with a master). A full bucket gives up its lowest stamp (the oldest write).

Readers never lock. A slot can be read while the node rewrites it; the seal is what makes that safe: a row is taken
only when its seal matches its words and its key is the one asked for, so a torn row (half the old entry, half the
new) is a miss, never another object's location under this key (a chance of 2^-64). Even a whole, current row only
says where the key's committed bytes were: the client copies them through the read fence (kvpool/fence.py), so an
extent evicted and reused since it was published is a miss too. The bytes a client returns are always the bytes
committed for that key.

Trust: the region is writable by every process that may map the arena (the node's user; the file is 0600), which
can already write the arena itself. What a forged row could do (name bytes that hash to a forged checksum) such a
process could do by writing the node's memory directly; the index adds no new power. Keys are the master's stored
keys, which are the client's keys only with authentication off: with it on (tenants' key spaces, store/tenants.py)
the master publishes nothing and clients use the Lookup path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

try:    # the same probe in C (tiers/_hostprobe.c): 5-10x faster with the caches cold, as they are inside a get
    from . import _hostprobe
except ImportError:     # built without a C compiler: the numpy probe below
    _hostprobe = None

WAYS = 4
SLOT_WORDS = 8
KEY_BYTES = 16
_SEAL = 7
_M = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F))     # the bucket's two multipliers
_WORD_MUL = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                      0x27D4EB2F165667C5, 0x94D049BB133111EB, 0xBF58476D1CE4E5B9], dtype=np.uint64)
_PLACE = 6
DRAM_ROW, SSD_ROW = 0, 1     # a row's place word: where its offset points (a DRAM row's is 0, as before SSD rows)
_ONE = np.uint64(1)
_ARANGE = np.arange(4096)
MIN_BUCKETS = 64


def _seal(rows: np.ndarray) -> np.ndarray:
    """The seal of rows (n, 8): words 0-6 each times its own odd constant, summed mod 2^64, | 1 (never 0). A DRAM
    row's place word is 0, so its seal is the six-word seal of the index before SSD rows; an older reader takes no
    SSD row (its seal covers six words). A row
    torn between entries of two keys carries its asked-for key's words with another entry's words or seal: the
    sums differ by differences of random 64-bit words (keys, checksums) times odd constants, equal with chance
    2^-64. A row torn between two entries of the same key names that key's committed bytes either way, and the read
    fence checks them."""
    return (rows[:, :_SEAL] * _WORD_MUL).sum(axis=1, dtype=np.uint64) | _ONE    # uint64 arrays wrap silently


def _key_words(keys: Sequence[bytes]) -> np.ndarray:
    """(n, 2) u64 of the keys; ValueError naming `keys[i]` for a key that is not 16 bytes."""
    joined = b"".join(keys)
    if len(joined) != KEY_BYTES * len(keys):
        i, k = next((i, k) for i, k in enumerate(keys) if len(k) != KEY_BYTES)
        raise ValueError(f"keys[{i}] must be {KEY_BYTES} bytes, got {len(k)}")
    return np.frombuffer(joined, dtype="<u8").reshape(-1, 2)


class HostIndex:
    """The index in `region` (a writable buffer of a power-of-two number of WAYS x 64-byte buckets), as its node
    (`writer`) or as a same-host reader. The writer keeps a mirror of which key holds which slot (its own dict), so
    publishing is a dict lookup per entry and three vectorised stores per batch. Counters (writer): `published`,
    `unpublished`, `replaced` (rows given up for room)."""

    def __init__(self, region: Any, *, writer: bool = False) -> None:
        words = np.frombuffer(region, dtype="<u8")
        buckets = words.size // (WAYS * SLOT_WORDS)
        if buckets < MIN_BUCKETS or words.size != buckets * WAYS * SLOT_WORDS or buckets & (buckets - 1):
            raise ValueError(f"region must hold a power-of-two number (>= {MIN_BUCKETS}) of "
                             f"{WAYS * SLOT_WORDS * 8}-byte buckets, got {words.nbytes} bytes")
        self._region = region
        self._rows = words.reshape(-1, SLOT_WORDS)
        self._buckets = self._rows.reshape(buckets, WAYS, SLOT_WORDS)
        self._shift = np.uint64(64 - (buckets.bit_length() - 1))      # >= 6 bits: at least 64 buckets
        self._probe_shift = int(self._shift)
        self.native_probe = _hostprobe is not None
        self.writer = writer
        self.published = 0
        self.unpublished = 0
        self.replaced = 0
        self._where: dict[bytes, int] = {}      # writer: key -> slot
        self._holder: list[bytes | None] = []   # writer: slot -> key
        self._stamps: list[int] = []            # writer: slot -> stamp of its last write
        self._stamp = 0
        if writer:
            self._mirror()

    @property
    def slots(self) -> int:
        return self._rows.shape[0]

    def _bucket_of(self, kw: np.ndarray) -> np.ndarray:
        """The top bits of k0 * M0 ^ k1 * M1: a product's top bits depend on every bit of its factor."""
        return ((kw[:, 0] * _M[0] ^ kw[:, 1] * _M[1]) >> self._shift).astype(np.intp)

    # ---------------------------------------------------------------- reader

    def find(self, keys: Sequence[bytes]) -> tuple[list[int], list[int], list[int], list[int]]:
        """(offsets, sizes, checksums, places) of the leading keys found, in order; stops at the first key not found.
        places[i]: DRAM_ROW (offsets[i] is in the arena) or SSD_ROW (a record at offsets[i] of the data file)."""
        if not keys:
            return [], [], [], []
        if self.native_probe:
            joined = b"".join(keys)
            if len(joined) == KEY_BYTES * len(keys):
                return _hostprobe.find(self._region, joined, self._probe_shift)
        kw = _key_words(keys)
        n = len(kw)
        rows = self._buckets[self._bucket_of(kw)]                      # a copy: each row is judged as read
        match = (rows[:, :, 0] == kw[:, :1]) & (rows[:, :, 1] == kw[:, 1:])
        picked = rows[_ARANGE[:n] if n <= len(_ARANGE) else np.arange(n), match.argmax(axis=1)]
        ok = (picked[:, _SEAL] == _seal(picked)) & (picked[:, 0] == kw[:, 0]) & (picked[:, 1] == kw[:, 1])
        hits = n if ok.all() else int(ok.argmin())
        if not hits:
            return [], [], [], []
        offsets, sizes, checksums = picked[:hits, 2:5].T.tolist()
        return offsets, sizes, checksums, picked[:hits, _PLACE].tolist()

    # ---------------------------------------------------------------- writer (the node)

    def publish(self, keys: Sequence[bytes], offsets: Sequence[int], sizes: Sequence[int],
                checksums: Sequence[int], places: Sequence[int] = ()) -> None:
        """keys[i] is committed at offsets[i] (sizes[i] bytes, xxh3_64 checksums[i]) of the DRAM arena, or of the
        SSD data file where places[i] is SSD_ROW (`places` empty: all DRAM). Validated whole first."""
        self._own()
        if not len(keys) == len(offsets) == len(sizes) == len(checksums):
            raise ValueError(f"offsets, sizes and checksums must have one entry per key ({len(keys)}), got "
                             f"{len(offsets)}, {len(sizes)}, {len(checksums)}")
        if len(places) not in (0, len(keys)):
            raise ValueError(f"places must be empty or have one entry per key ({len(keys)}), got {len(places)}")
        for i, v in enumerate(places):
            if isinstance(v, bool) or v not in (DRAM_ROW, SSD_ROW):
                raise ValueError(f"places[{i}] must be {DRAM_ROW} (DRAM) or {SSD_ROW} (SSD), got {v!r}")
        kw = _key_words(keys)
        for name, col in (("offsets", offsets), ("sizes", sizes), ("checksums", checksums)):
            for i, v in enumerate(col):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 1 << 64:
                    raise ValueError(f"{name}[{i}] must be an int in [0, 2**64), got {v!r}")
        if not len(keys):
            return
        buckets = self._bucket_of(kw).tolist()
        last: dict[int, int] = {}               # slot -> the entry written there (the batch's last one wins)
        for i, key in enumerate(keys):
            key = bytes(key)
            slot = self._slot_for(key, buckets[i])
            self._stamp += 1
            self._stamps[slot] = self._stamp
            last[slot] = i
        slots = np.fromiter(last.keys(), dtype=np.intp, count=len(last))
        picked = list(last.values())
        new = np.zeros((len(picked), SLOT_WORDS), dtype="<u8")
        new[:, :2] = kw[picked]
        new[:, 2] = [offsets[i] for i in picked]
        new[:, 3] = [sizes[i] for i in picked]
        new[:, 4] = [checksums[i] for i in picked]
        new[:, 5] = [self._stamps[s] for s in last]
        if len(places):
            new[:, _PLACE] = [places[i] for i in picked]
        new[:, _SEAL] = _seal(new)
        rows = self._rows
        rows[slots, _SEAL] = 0                  # readers see empty slots while the words change
        rows[slots, :_SEAL] = new[:, :_SEAL]
        rows[slots, _SEAL] = new[:, _SEAL]
        self.published += len(keys)

    def _slot_for(self, key: bytes, bucket: int) -> int:
        """This key's slot, else an empty one of its bucket, else the bucket's oldest (counted `replaced`)."""
        slot = self._where.get(key)
        if slot is not None:
            return slot
        base = bucket * WAYS
        holder = self._holder
        ways = range(base, base + WAYS)
        slot = next((s for s in ways if holder[s] is None), -1)
        if slot < 0:
            slot = min(ways, key=self._stamps.__getitem__)
            del self._where[holder[slot]]
            self.replaced += 1
        holder[slot] = key
        self._where[key] = slot
        return slot

    def unpublish(self, keys: Sequence[bytes]) -> int:
        """Forget these keys (those present): how many were."""
        self._own()
        _key_words(keys)
        slots = [s for s in (self._where.pop(bytes(k), None) for k in keys) if s is not None]
        for s in slots:
            self._holder[s] = None
        if slots:
            idx = np.array(slots, dtype=np.intp)
            self._rows[idx, _SEAL] = 0
            self._rows[idx] = 0
        self.unpublished += len(slots)
        return len(slots)

    def clear(self) -> None:
        """Forget everything (seals first: no reader takes a row from then on)."""
        self._own()
        self._rows[:, _SEAL] = 0
        self._rows[...] = 0
        self._where.clear()
        self._holder[:] = [None] * self.slots

    def __len__(self) -> int:
        """Valid rows now (a scan: for tests and stats, not the read path)."""
        return int((self._rows[:, _SEAL] == _seal(self._rows)).sum())

    def _mirror(self) -> None:
        """The writer's dict of the valid rows already in the region (none in a new arena)."""
        self._holder = [None] * self.slots
        self._stamps = self._rows[:, 5].tolist()
        self._stamp = max(self._stamps, default=0)
        for s in np.flatnonzero(self._rows[:, _SEAL] == _seal(self._rows)).tolist():
            key = self._rows[s, :2].tobytes()
            self._holder[s] = key
            self._where[key] = s

    def _own(self) -> None:
        if not self.writer:
            raise ValueError("only the node that owns the arena writes its host index")
