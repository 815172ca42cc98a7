from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HBM: _ClassVar[Tier]
    DRAM: _ClassVar[Tier]
    SSD: _ClassVar[Tier]

class PutStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_STATUS_UNSPECIFIED: _ClassVar[PutStatus]
    STORED: _ClassVar[PutStatus]
    EXISTS: _ClassVar[PutStatus]
    NO_SPACE: _ClassVar[PutStatus]

class CommitStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMIT_STATUS_UNSPECIFIED: _ClassVar[CommitStatus]
    COMMITTED: _ClassVar[CommitStatus]
    EXPIRED: _ClassVar[CommitStatus]

class MigrateStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MIGRATE_STATUS_UNSPECIFIED: _ClassVar[MigrateStatus]
    MOVING: _ClassVar[MigrateStatus]
    GONE: _ClassVar[MigrateStatus]
    NO_ROOM: _ClassVar[MigrateStatus]
    BUSY: _ClassVar[MigrateStatus]
HBM: Tier
DRAM: Tier
SSD: Tier
PUT_STATUS_UNSPECIFIED: PutStatus
STORED: PutStatus
EXISTS: PutStatus
NO_SPACE: PutStatus
COMMIT_STATUS_UNSPECIFIED: CommitStatus
COMMITTED: CommitStatus
EXPIRED: CommitStatus
MIGRATE_STATUS_UNSPECIFIED: MigrateStatus
MOVING: MigrateStatus
GONE: MigrateStatus
NO_ROOM: MigrateStatus
BUSY: MigrateStatus

class TierCapacity(_message.Message):
    __slots__ = ("tier", "capacity_bytes", "path")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    tier: Tier
    capacity_bytes: int
    path: str
    def __init__(self, tier: _Optional[_Union[Tier, str]] = ..., capacity_bytes: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class NodeEndpoint(_message.Message):
    __slots__ = ("node_id", "host_id", "data_address", "control_address", "tiers", "ssd_record_overhead", "alignment", "incarnation", "data_tls", "ssd_index_rows", "dram_pages", "move_drops", "removes_keys", "reports_ssd", "write_keys", "writer_claims")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    SSD_RECORD_OVERHEAD_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DATA_TLS_FIELD_NUMBER: _ClassVar[int]
    SSD_INDEX_ROWS_FIELD_NUMBER: _ClassVar[int]
    DRAM_PAGES_FIELD_NUMBER: _ClassVar[int]
    MOVE_DROPS_FIELD_NUMBER: _ClassVar[int]
    REMOVES_KEYS_FIELD_NUMBER: _ClassVar[int]
    REPORTS_SSD_FIELD_NUMBER: _ClassVar[int]
    WRITE_KEYS_FIELD_NUMBER: _ClassVar[int]
    WRITER_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    host_id: str
    data_address: str
    control_address: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierCapacity]
    ssd_record_overhead: int
    alignment: int
    incarnation: str
    data_tls: bool
    ssd_index_rows: bool
    dram_pages: str
    move_drops: bool
    removes_keys: bool
    reports_ssd: bool
    write_keys: bool
    writer_claims: bool
    def __init__(self, node_id: _Optional[str] = ..., host_id: _Optional[str] = ..., data_address: _Optional[str] = ..., control_address: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TierCapacity, _Mapping]]] = ..., ssd_record_overhead: _Optional[int] = ..., alignment: _Optional[int] = ..., incarnation: _Optional[str] = ..., data_tls: _Optional[bool] = ..., ssd_index_rows: _Optional[bool] = ..., dram_pages: _Optional[str] = ..., move_drops: _Optional[bool] = ..., removes_keys: _Optional[bool] = ..., reports_ssd: _Optional[bool] = ..., write_keys: _Optional[bool] = ..., writer_claims: _Optional[bool] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node", "claimed_starts", "claimed_ends")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_STARTS_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_ENDS_FIELD_NUMBER: _ClassVar[int]
    node: NodeEndpoint
    claimed_starts: _containers.RepeatedScalarFieldContainer[int]
    claimed_ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[_Union[NodeEndpoint, _Mapping]] = ..., claimed_starts: _Optional[_Iterable[int]] = ..., claimed_ends: _Optional[_Iterable[int]] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("token_secret", "heartbeat_interval_s", "node_ttl_s", "epoch", "master_time_us", "write_key")
    TOKEN_SECRET_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    NODE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIME_US_FIELD_NUMBER: _ClassVar[int]
    WRITE_KEY_FIELD_NUMBER: _ClassVar[int]
    token_secret: bytes
    heartbeat_interval_s: float
    node_ttl_s: float
    epoch: int
    master_time_us: int
    write_key: bytes
    def __init__(self, token_secret: _Optional[bytes] = ..., heartbeat_interval_s: _Optional[float] = ..., node_ttl_s: _Optional[float] = ..., epoch: _Optional[int] = ..., master_time_us: _Optional[int] = ..., write_key: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "epoch", "claimed_starts", "claimed_ends")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_STARTS_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_ENDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    epoch: int
    claimed_starts: _containers.RepeatedScalarFieldContainer[int]
    claimed_ends: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., epoch: _Optional[int] = ..., claimed_starts: _Optional[_Iterable[int]] = ..., claimed_ends: _Optional[_Iterable[int]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("reregister", "master_time_us")
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIME_US_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    master_time_us: int
    def __init__(self, reregister: _Optional[bool] = ..., master_time_us: _Optional[int] = ...) -> None: ...

class ReportObjectsRequest(_message.Message):
    __slots__ = ("node_id", "keys", "namespaces", "tiers", "offsets", "sizes", "checksums", "corrupt", "last", "written_us")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    WRITTEN_US_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespaces: _containers.RepeatedScalarFieldContainer[bytes]
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    corrupt: int
    last: bool
    written_us: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node_id: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., namespaces: _Optional[_Iterable[bytes]] = ..., tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., corrupt: _Optional[int] = ..., last: _Optional[bool] = ..., written_us: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportObjectsResponse(_message.Message):
    __slots__ = ("adopted", "known", "dropped", "dropped_keys")
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_KEYS_FIELD_NUMBER: _ClassVar[int]
    adopted: int
    known: int
    dropped: int
    dropped_keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, adopted: _Optional[int] = ..., known: _Optional[int] = ..., dropped: _Optional[int] = ..., dropped_keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DrainNodeResponse(_message.Message):
    __slots__ = ("objects_dropped",)
    OBJECTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    objects_dropped: int
    def __init__(self, objects_dropped: _Optional[int] = ...) -> None: ...

class FlushNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class FlushNodeResponse(_message.Message):
    __slots__ = ("copied", "left")
    COPIED_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    copied: int
    left: int
    def __init__(self, copied: _Optional[int] = ..., left: _Optional[int] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("namespace", "block_tokens", "keys", "sizes", "client_host_id", "namespace_label", "pin_s")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_LABEL_FIELD_NUMBER: _ClassVar[int]
    PIN_S_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    block_tokens: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    client_host_id: str
    namespace_label: str
    pin_s: float
    def __init__(self, namespace: _Optional[bytes] = ..., block_tokens: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ..., client_host_id: _Optional[str] = ..., namespace_label: _Optional[str] = ..., pin_s: _Optional[float] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("statuses", "grant_ids", "node_index", "tiers", "offsets", "sizes", "tokens", "nodes", "expires_unix_ms", "ttl_ms", "record_keys")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    GRANT_IDS_FIELD_NUMBER: _ClassVar[int]
    NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    RECORD_KEYS_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[PutStatus]
    grant_ids: _containers.RepeatedScalarFieldContainer[int]
    node_index: _containers.RepeatedScalarFieldContainer[int]
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[bytes]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeEndpoint]
    expires_unix_ms: int
    ttl_ms: int
    record_keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, statuses: _Optional[_Iterable[_Union[PutStatus, str]]] = ..., grant_ids: _Optional[_Iterable[int]] = ..., node_index: _Optional[_Iterable[int]] = ..., tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[bytes]] = ..., nodes: _Optional[_Iterable[_Union[NodeEndpoint, _Mapping]]] = ..., expires_unix_ms: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., record_keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PutCommitRequest(_message.Message):
    __slots__ = ("grant_ids", "checksums")
    GRANT_IDS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    grant_ids: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, grant_ids: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ...) -> None: ...

class PutCommitResponse(_message.Message):
    __slots__ = ("statuses",)
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[CommitStatus]
    def __init__(self, statuses: _Optional[_Iterable[_Union[CommitStatus, str]]] = ...) -> None: ...

class PutAbortRequest(_message.Message):
    __slots__ = ("grant_ids",)
    GRANT_IDS_FIELD_NUMBER: _ClassVar[int]
    grant_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, grant_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PutAbortResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: int
    def __init__(self, aborted: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("namespace", "block_tokens", "keys", "lease", "client_host_id", "namespace_label", "expect_sizes", "prefill_s_per_token", "mapped_nodes", "release_lease_ids", "uses", "optimistic", "unpublish_misses", "index_stale", "count_only", "continued")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_LABEL_FIELD_NUMBER: _ClassVar[int]
    EXPECT_SIZES_FIELD_NUMBER: _ClassVar[int]
    PREFILL_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAPPED_NODES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    OPTIMISTIC_FIELD_NUMBER: _ClassVar[int]
    UNPUBLISH_MISSES_FIELD_NUMBER: _ClassVar[int]
    INDEX_STALE_FIELD_NUMBER: _ClassVar[int]
    COUNT_ONLY_FIELD_NUMBER: _ClassVar[int]
    CONTINUED_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    block_tokens: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    lease: bool
    client_host_id: str
    namespace_label: str
    expect_sizes: _containers.RepeatedScalarFieldContainer[int]
    prefill_s_per_token: float
    mapped_nodes: _containers.RepeatedScalarFieldContainer[str]
    release_lease_ids: _containers.RepeatedScalarFieldContainer[int]
    uses: int
    optimistic: bool
    unpublish_misses: bool
    index_stale: bool
    count_only: bool
    continued: bool
    def __init__(self, namespace: _Optional[bytes] = ..., block_tokens: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., lease: _Optional[bool] = ..., client_host_id: _Optional[str] = ..., namespace_label: _Optional[str] = ..., expect_sizes: _Optional[_Iterable[int]] = ..., prefill_s_per_token: _Optional[float] = ..., mapped_nodes: _Optional[_Iterable[str]] = ..., release_lease_ids: _Optional[_Iterable[int]] = ..., uses: _Optional[int] = ..., optimistic: _Optional[bool] = ..., unpublish_misses: _Optional[bool] = ..., index_stale: _Optional[bool] = ..., count_only: _Optional[bool] = ..., continued: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("hits", "lease_id", "node_index", "tiers", "offsets", "sizes", "checksums", "tokens", "nodes", "expires_unix_ms", "record_keys", "released")
    HITS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RECORD_KEYS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    hits: int
    lease_id: int
    node_index: _containers.RepeatedScalarFieldContainer[int]
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[bytes]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeEndpoint]
    expires_unix_ms: int
    record_keys: _containers.RepeatedScalarFieldContainer[bytes]
    released: bool
    def __init__(self, hits: _Optional[int] = ..., lease_id: _Optional[int] = ..., node_index: _Optional[_Iterable[int]] = ..., tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[bytes]] = ..., nodes: _Optional[_Iterable[_Union[NodeEndpoint, _Mapping]]] = ..., expires_unix_ms: _Optional[int] = ..., record_keys: _Optional[_Iterable[bytes]] = ..., released: _Optional[bool] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_ids", "corrupt_keys")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_KEYS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    corrupt_keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, lease_ids: _Optional[_Iterable[int]] = ..., corrupt_keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class ContainsRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ContainsResponse(_message.Message):
    __slots__ = ("present",)
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    present: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, present: _Optional[_Iterable[bool]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class ObjectInfo(_message.Message):
    __slots__ = ("key", "namespace", "node_id", "tier", "offset", "size", "checksum", "last_access_unix", "leases", "tenant")
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCESS_UNIX_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    namespace: bytes
    node_id: str
    tier: Tier
    offset: int
    size: int
    checksum: int
    last_access_unix: float
    leases: int
    tenant: str
    def __init__(self, key: _Optional[bytes] = ..., namespace: _Optional[bytes] = ..., node_id: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., checksum: _Optional[int] = ..., last_access_unix: _Optional[float] = ..., leases: _Optional[int] = ..., tenant: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("namespace", "start_after", "limit", "node_id", "tenant")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    start_after: bytes
    limit: int
    node_id: str
    tenant: str
    def __init__(self, namespace: _Optional[bytes] = ..., start_after: _Optional[bytes] = ..., limit: _Optional[int] = ..., node_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("objects", "next_start_after")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_START_AFTER_FIELD_NUMBER: _ClassVar[int]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectInfo]
    next_start_after: bytes
    def __init__(self, objects: _Optional[_Iterable[_Union[ObjectInfo, _Mapping]]] = ..., next_start_after: _Optional[bytes] = ...) -> None: ...

class InspectRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class InspectResponse(_message.Message):
    __slots__ = ("found", "objects")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    found: _containers.RepeatedScalarFieldContainer[bool]
    objects: _containers.RepeatedCompositeFieldContainer[ObjectInfo]
    def __init__(self, found: _Optional[_Iterable[bool]] = ..., objects: _Optional[_Iterable[_Union[ObjectInfo, _Mapping]]] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("namespace", "idle_seconds", "all")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    namespace: bytes
    idle_seconds: float
    all: bool
    def __init__(self, namespace: _Optional[bytes] = ..., idle_seconds: _Optional[float] = ..., all: _Optional[bool] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("evicted",)
    EVICTED_FIELD_NUMBER: _ClassVar[int]
    evicted: int
    def __init__(self, evicted: _Optional[int] = ...) -> None: ...

class BeginDrainRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class BeginDrainResponse(_message.Message):
    __slots__ = ("objects", "pending")
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    objects: int
    pending: int
    def __init__(self, objects: _Optional[int] = ..., pending: _Optional[int] = ...) -> None: ...

class MigrateStartRequest(_message.Message):
    __slots__ = ("keys", "node_id", "cursor", "limit", "max_bytes")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    node_id: str
    cursor: int
    limit: int
    max_bytes: int
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., node_id: _Optional[str] = ..., cursor: _Optional[int] = ..., limit: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class MigrateStartResponse(_message.Message):
    __slots__ = ("statuses", "move_ids", "read_id", "src_node_index", "src_tiers", "src_offsets", "src_tokens", "dst_node_index", "dst_tiers", "dst_offsets", "dst_tokens", "sizes", "checksums", "namespaces", "nodes", "expires_unix_ms", "keys", "next_cursor", "ttl_ms")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    MOVE_IDS_FIELD_NUMBER: _ClassVar[int]
    READ_ID_FIELD_NUMBER: _ClassVar[int]
    SRC_NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SRC_TIERS_FIELD_NUMBER: _ClassVar[int]
    SRC_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SRC_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DST_NODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    DST_TIERS_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedScalarFieldContainer[MigrateStatus]
    move_ids: _containers.RepeatedScalarFieldContainer[int]
    read_id: int
    src_node_index: _containers.RepeatedScalarFieldContainer[int]
    src_tiers: _containers.RepeatedScalarFieldContainer[Tier]
    src_offsets: _containers.RepeatedScalarFieldContainer[int]
    src_tokens: _containers.RepeatedScalarFieldContainer[bytes]
    dst_node_index: _containers.RepeatedScalarFieldContainer[int]
    dst_tiers: _containers.RepeatedScalarFieldContainer[Tier]
    dst_offsets: _containers.RepeatedScalarFieldContainer[int]
    dst_tokens: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    namespaces: _containers.RepeatedScalarFieldContainer[bytes]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeEndpoint]
    expires_unix_ms: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    next_cursor: int
    ttl_ms: int
    def __init__(self, statuses: _Optional[_Iterable[_Union[MigrateStatus, str]]] = ..., move_ids: _Optional[_Iterable[int]] = ..., read_id: _Optional[int] = ..., src_node_index: _Optional[_Iterable[int]] = ..., src_tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., src_offsets: _Optional[_Iterable[int]] = ..., src_tokens: _Optional[_Iterable[bytes]] = ..., dst_node_index: _Optional[_Iterable[int]] = ..., dst_tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., dst_offsets: _Optional[_Iterable[int]] = ..., dst_tokens: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., namespaces: _Optional[_Iterable[bytes]] = ..., nodes: _Optional[_Iterable[_Union[NodeEndpoint, _Mapping]]] = ..., expires_unix_ms: _Optional[int] = ..., keys: _Optional[_Iterable[bytes]] = ..., next_cursor: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class MigrateCommitRequest(_message.Message):
    __slots__ = ("move_ids", "checksums")
    MOVE_IDS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    move_ids: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, move_ids: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ...) -> None: ...

class MigrateCommitResponse(_message.Message):
    __slots__ = ("moved",)
    MOVED_FIELD_NUMBER: _ClassVar[int]
    moved: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, moved: _Optional[_Iterable[bool]] = ...) -> None: ...

class MigrateAbortRequest(_message.Message):
    __slots__ = ("move_ids",)
    MOVE_IDS_FIELD_NUMBER: _ClassVar[int]
    move_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, move_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class MigrateAbortResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: int
    def __init__(self, aborted: _Optional[int] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("control_port", "instance", "control_tls", "nodes")
    CONTROL_PORT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    CONTROL_TLS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    control_port: int
    instance: bytes
    control_tls: bool
    nodes: _containers.RepeatedCompositeFieldContainer[NodeEndpoint]
    def __init__(self, control_port: _Optional[int] = ..., instance: _Optional[bytes] = ..., control_tls: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[NodeEndpoint, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class WriteChunk(_message.Message):
    __slots__ = ("grant_id", "tier", "offset", "size", "expires_unix_ms", "token", "data", "key", "namespace")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    grant_id: int
    tier: Tier
    offset: int
    size: int
    expires_unix_ms: int
    token: bytes
    data: bytes
    key: bytes
    namespace: bytes
    def __init__(self, grant_id: _Optional[int] = ..., tier: _Optional[_Union[Tier, str]] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ..., token: _Optional[bytes] = ..., data: _Optional[bytes] = ..., key: _Optional[bytes] = ..., namespace: _Optional[bytes] = ...) -> None: ...

class WriteResponse(_message.Message):
    __slots__ = ("written",)
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    written: int
    def __init__(self, written: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("lease_id", "tier", "offset", "size", "expires_unix_ms", "token", "chunk_bytes", "key")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    tier: Tier
    offset: int
    size: int
    expires_unix_ms: int
    token: bytes
    chunk_bytes: int
    key: bytes
    def __init__(self, lease_id: _Optional[int] = ..., tier: _Optional[_Union[Tier, str]] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ..., token: _Optional[bytes] = ..., chunk_bytes: _Optional[int] = ..., key: _Optional[bytes] = ...) -> None: ...

class ReadChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class MoveRequest(_message.Message):
    __slots__ = ("keys", "namespaces", "sizes", "checksums", "src_tiers", "src_offsets", "dst_tiers", "dst_offsets", "drops", "incarnation")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    SRC_TIERS_FIELD_NUMBER: _ClassVar[int]
    SRC_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DST_TIERS_FIELD_NUMBER: _ClassVar[int]
    DST_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DROPS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    namespaces: _containers.RepeatedScalarFieldContainer[bytes]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    src_tiers: _containers.RepeatedScalarFieldContainer[Tier]
    src_offsets: _containers.RepeatedScalarFieldContainer[int]
    dst_tiers: _containers.RepeatedScalarFieldContainer[Tier]
    dst_offsets: _containers.RepeatedScalarFieldContainer[int]
    drops: DropRequest
    incarnation: str
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., namespaces: _Optional[_Iterable[bytes]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., src_tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., src_offsets: _Optional[_Iterable[int]] = ..., dst_tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., dst_offsets: _Optional[_Iterable[int]] = ..., drops: _Optional[_Union[DropRequest, _Mapping]] = ..., incarnation: _Optional[str] = ...) -> None: ...

class MoveResponse(_message.Message):
    __slots__ = ("ok",)
    OK_FIELD_NUMBER: _ClassVar[int]
    ok: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, ok: _Optional[_Iterable[bool]] = ...) -> None: ...

class DropRequest(_message.Message):
    __slots__ = ("keys", "tiers", "offsets", "sizes", "objects_removed", "removed_keys_only", "removed_keys", "incarnation")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_KEYS_ONLY_FIELD_NUMBER: _ClassVar[int]
    REMOVED_KEYS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    objects_removed: bool
    removed_keys_only: bool
    removed_keys: _containers.RepeatedScalarFieldContainer[bytes]
    incarnation: str
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., objects_removed: _Optional[bool] = ..., removed_keys_only: _Optional[bool] = ..., removed_keys: _Optional[_Iterable[bytes]] = ..., incarnation: _Optional[str] = ...) -> None: ...

class DropResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: int
    def __init__(self, dropped: _Optional[int] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("keys", "offsets", "sizes", "checksums", "gone", "tiers", "incarnation")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    gone: _containers.RepeatedScalarFieldContainer[bytes]
    tiers: _containers.RepeatedScalarFieldContainer[Tier]
    incarnation: str
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ..., offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., gone: _Optional[_Iterable[bytes]] = ..., tiers: _Optional[_Iterable[_Union[Tier, str]]] = ..., incarnation: _Optional[str] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("published",)
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    published: int
    def __init__(self, published: _Optional[int] = ...) -> None: ...

class StartRecordingRequest(_message.Message):
    __slots__ = ("directory", "max_file_bytes", "duration_s", "max_files")
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MAX_FILES_FIELD_NUMBER: _ClassVar[int]
    directory: str
    max_file_bytes: int
    duration_s: float
    max_files: int
    def __init__(self, directory: _Optional[str] = ..., max_file_bytes: _Optional[int] = ..., duration_s: _Optional[float] = ..., max_files: _Optional[int] = ...) -> None: ...

class StopRecordingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecordingStatus(_message.Message):
    __slots__ = ("recording", "directory", "files", "rows", "dropped", "duration_s", "elapsed_s", "max_file_bytes", "max_files")
    RECORDING_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    MAX_FILE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_FILES_FIELD_NUMBER: _ClassVar[int]
    recording: bool
    directory: str
    files: _containers.RepeatedScalarFieldContainer[str]
    rows: int
    dropped: int
    duration_s: float
    elapsed_s: float
    max_file_bytes: int
    max_files: int
    def __init__(self, recording: _Optional[bool] = ..., directory: _Optional[str] = ..., files: _Optional[_Iterable[str]] = ..., rows: _Optional[int] = ..., dropped: _Optional[int] = ..., duration_s: _Optional[float] = ..., elapsed_s: _Optional[float] = ..., max_file_bytes: _Optional[int] = ..., max_files: _Optional[int] = ...) -> None: ...
