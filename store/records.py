"""Plain records that cross the master's boundary: what goes into and comes out of every `Master` method.

Each record maps 1:1 onto a protobuf message of the distributed pool (issue 3), so nothing here holds a callable,
a lock or a numpy array: only str, bytes, int, float, bool, enums and lists of those.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

from kvpool.tiers.types import Location, Tier

__all__ = ["PutStatus", "NsRef", "Grant", "PutStartResult", "LookupResult", "ReportResult", "ObjectRecord", "NodeInfo", "Location",
           "Registered", "Tier", "NO_NS"]


class PutStatus(str, enum.Enum):
    STORED = "stored"
    EXISTS = "exists"
    NO_SPACE = "no_space"


@dataclass(slots=True, frozen=True)
class NsRef:
    """What the master needs to know about a namespace: its digest (stored with SSD records), a label for stats, and
    block_tokens so hits can be counted in tokens. block_tokens=0 means "count keys only"."""

    digest: bytes = b"\x00" * 16
    label: str = ""
    block_tokens: int = 0

    @classmethod
    def of(cls, ns) -> "NsRef":
        """From a `kvpool.Namespace` (duck-typed so store/ does not import the public package)."""
        return cls(digest=ns.digest, label=f"{ns.model}/{ns.tenant}", block_tokens=ns.block_tokens)


NO_NS = NsRef()


@dataclass(slots=True, frozen=True)
class Grant:
    """Permission to write `size` bytes at `location` until `expires_at`; `token` is an HMAC a remote node checks."""

    grant_id: int
    key: bytes
    location: Location
    expires_at: float
    token: bytes = b""


@dataclass(slots=True)
class PutStartResult:
    """One per key of a put_start batch: a grant when status is STORED (meaning "go ahead"), else None."""

    status: PutStatus
    grant: Grant | None = None


@dataclass(slots=True)
class LookupResult:
    """Leading hits of a lookup, as columns (one entry per hit; what LookupResponse carries, built once). With a
    lease: where each hit is now (`node_ids`, `tiers` as ints, `offsets`, `sizes`), its committed checksum, a read
    token per hit if the master signs, and `lease_id` to release; without one (or with no hits) `lease_id` is 0 and
    the columns are empty."""

    hits: int
    lease_id: int = 0
    expires_at: float = 0.0
    node_ids: list[str] = field(default_factory=list)
    tiers: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    tokens: list[bytes] = field(default_factory=list)
    record_keys: list[bytes] = field(default_factory=list)   # a tenant's hits: the keys they are stored under
    released: bool = False      # the lookup also ended the caller's finished leases (Master.lookup `release`)

    @property
    def locations(self) -> list[Location]:
        """One Location per hit, built on demand (tests, tools); the data path reads the columns."""
        return [Location(n, Tier(t), o, z) for n, t, o, z in zip(self.node_ids, self.tiers, self.offsets, self.sizes)]


@dataclass(slots=True)
class ReportResult:
    """Outcome of a node reporting the objects it found on its SSD (ReportObjectsResponse)."""

    adopted: int = 0
    known: int = 0
    dropped_keys: list[bytes] = field(default_factory=list)


@dataclass(slots=True, frozen=True)
class ObjectRecord:
    """One committed object as persisted by a metadata backend, reported by a node's SSD scan, or listed."""

    key: bytes
    ns_digest: bytes
    node_id: str
    tier: Tier
    offset: int
    size: int
    checksum: int
    tenant: str = ""        # the owner (admin listings); "" = the unscoped space
    pinned_until: float = 0.0  # end of its retention hint, master-clock seconds (journalled; 0 = not pinned)
    written_us: int = 0     # a reported SSD record's write time, master clock µs (tiers/ssd.py; 0 = unknown)


@dataclass(slots=True, frozen=True)
class NodeInfo:
    """A storage node as registered with the master. Capacities are of the node's tiers (0 = tier absent).
    `ssd_record_overhead` is the bytes an SSD record adds to its payload (header), so the master can allocate SSD
    extents for a node it reaches only through RPCs."""

    node_id: str
    address: str = ""
    dram_bytes: int = 0
    ssd_bytes: int = 0
    ssd_record_overhead: int = 0
    alignment: int = 4096
    dram_path: str = ""
    incarnation: str = ""   # random per node process start: same value on re-registration = the node kept its DRAM
    hbm_bytes: int = 0      # device memory tier (only on a node with a CUDA device)
    # its host index takes SSD records (nodes since 2026-11-28; else DRAM rows only). Said at each registration, never
    # journalled (`persisted`): a master rolled back to an older version still loads the nodes a newer one stored
    ssd_index_rows: bool = field(default=False, metadata={"persist": False})
    # its DRAM arena's pages in words (tiers/dram.py page_kind), "" without a DRAM tier; said at each registration
    dram_pages: str = field(default="", metadata={"persist": False})
    # its demote erases the drops it is given before the moves (nodes since 2026-12-05; else a drop call goes first);
    # said at each registration
    move_drops: bool = field(default=False, metadata={"persist": False})
    # at a removal its host index forgets the removed keys only (nodes since 2026-12-06; else it clears it and the
    # master publishes again what the node still holds); said at each registration
    removes_keys: bool = field(default=False, metadata={"persist": False})
    # after registering it reports its SSD records and marks the last batch (nodes since 2026-12-06): nothing new is
    # placed on it until then, or for at most MasterConfig.grace_s; said at each registration
    reports_ssd: bool = field(default=False, metadata={"persist": False})
    # it checks write grants with the key its registration hands it (RegisterNodeResponse.write_key; nodes since
    # 2026-12-07, store/tokens.py; else they are signed with the master's secret); said at each registration
    write_keys: bool = field(default=False, metadata={"persist": False})
    # its heartbeats name the DRAM ranges same-host writers may be copying into (tiers/writer_claims.py; nodes since
    # 2026-12-07 evening that share their arena): the master frees an expired DRAM grant there only once unclaimed
    writer_claims: bool = field(default=False, metadata={"persist": False})

    def persisted(self) -> dict:
        """The fields a metadata store keeps (JSON-able), without what a node says anew each time it registers."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("persist", True)}


@dataclass(slots=True, frozen=True)
class Registered:
    """What a node's registration answers it: its epoch, and the key the master signs its write grants with (b"":
    none of its own, they are signed with the master's secret: a master that signs nothing, or a node that does not
    say `write_keys`). The key is new whenever the master starts tracking the node afresh (a new node process, a node
    it had dropped, a master process of its own), so a grant of before does not verify at the node now."""

    epoch: int
    write_key: bytes = b""
