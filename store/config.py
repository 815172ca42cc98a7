"""Every process config of the pool, composed from field groups so that each field is defined (and validated)
exactly once.

    group                     fields                                               used by
    MasterConfig              max_object_bytes max_batch_keys lease_ttl_s          Master (the pool's rules)
                              grant_ttl_s node_ttl_s suspect_after_s
                              reload_grace_s promote_on_hit policy max_namespaces
                              write_behind write_behind_s pin_max_fraction
                              max_tombstones max_tenant_tombstones
    NodeConfig                node_id dram_bytes ssd_path ssd_bytes shm_dir        StorageNode (a node's tiers)
                              share_dram hbm_bytes hbm_device ssd_fsync_s
    MasterServerFields        redis_url redis_prefix node_rpc_timeout_s            the master process
                              list_limit http_listen control_listen
                              control_max_connections control_idle_timeout_s
    NodeServerFields          data_listen advertise_host rpc_timeout_s             the node process
                              metrics_listen data_idle_timeout_s
                              data_max_connections stop_flush_s
                              register_drain_s
    Liveness                  heartbeat_s                                          both (the node beats, the master
                                                                                   tells nodes the interval)
    PeerAuthFields            auth_node_tokens auth_cert_roles                     both: what nodes and the master
                              auth_reload_interval_s                               accept from (and present to) peers
    AuthFields                PeerAuthFields + auth_admin_tokens                   the master: every role's tokens
                              auth_client_tokens auth_viewer_tokens
    TlsFields                 tls_cert tls_key tls_ca tls_require_client_cert      both: gRPC (and the node's data
                              tls_server_name tls_data_channel                     channel) over TLS
    TenantQuotas              tenant_quotas                                        the master: bytes per tenant
    TrafficRecording          record_directory record_max_file_bytes               the master: record lookups and
                              record_duration_s record_max_files                   puts from the start (off: "")

    process config            = groups (+ the fields only it has: where it listens, its worker threads)
    MasterServerConfig        MasterServerFields + AuthFields + TlsFields + TenantQuotas + TrafficRecording
                              + Liveness + MasterConfig + listen, workers
    NodeServerConfig          NodeServerFields + PeerAuthFields + TlsFields + Liveness + NodeConfig + master, listen,
                              workers
    UpConfig (`kvpool up`)    every group + listen, node_listen
    EmbeddedConfig            MasterConfig + NodeConfig + TrafficRecording

Secrets never are config values: a token setting is a list of `file:PATH` / `env:NAME` sources (store/auth), so a
flag, a config file or `kvpool config check --json` shows where a token is, never the token.

A process config IS an instance of each of its groups (`isinstance(cfg, MasterConfig)`), so `Master(cfg)` takes a
MasterServerConfig directly; `project(Group, cfg)` cuts a group out where a plain one is wanted. Every group
validates its own fields in a cooperative `__post_init__`; an invalid value raises ValueError naming the field and
what would be valid. All of them load through `kvpool.config.load_config` (defaults < YAML/TOML file < KVPOOL_* env
< kwargs). A default may differ per process (a node process shares its DRAM arena, the embedded pool does not): the
process class redeclares the default, never the validation.

Why one module of ~550 lines: the groups compose into one another (a process config is a subclass of each), so
every field's single definition, its validation and the table above stay in one place; splitting them by group
would put the cooperative `__post_init__` chain across files.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from kvpool.tiers.policy import POLICY_NAMES as _POLICIES

T = TypeVar("T")
MAX_OBJECT_BYTES = 0xFFFFFFFF   # the index's u32 size column (store/index.py MAX_SIZE)

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_MULT = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
              "tb": 10**12, "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30,
              "gib": 1 << 30, "ti": 1 << 40, "tib": 1 << 40}


def parse_size(value: Any, field: str) -> int:
    """'256MiB', '4G', '1024', 1024 -> bytes. Raises ValueError naming `field`."""
    if isinstance(value, bool):
        raise ValueError(f"{field}: expected a size like 256MiB, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return int(float(m.group(1)) * _SIZE_MULT[(m.group(2) or "").lower()])
    raise ValueError(f"{field}: expected a size like 256MiB or an integer byte count, got {value!r}")


def project(cls: type[T], source: Any, **extra: Any) -> T:
    """An instance of group/config `cls` with every field of it taken from `source` (plus `extra`)."""
    values = {f.name: getattr(source, f.name) for f in dataclasses.fields(cls) if hasattr(source, f.name)}
    values.update(extra)
    return cls(**values)


def _check_nonneg_int(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0 (bytes), got {value!r}")


def _check_positive(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a number > 0, got {value!r}")


def _check_seconds(obj, *names: str) -> None:
    """A duration that may be 0 (finite, not negative)."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")


def _check_positive_int(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be an int > 0, got {value!r}")


def _check_address(obj, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if optional and value == "":
            continue
        if not isinstance(value, str) or ":" not in value:
            raise ValueError(f"{name} must be host:port{' or empty' if optional else ''}, got {value!r}")


class _Group:
    """The end of the cooperative `__post_init__` chain of the field groups."""

    def __post_init__(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------- groups


@dataclass(frozen=True, kw_only=True)
class MasterConfig(_Group):
    """How the master runs the pool."""

    max_object_bytes: int = 64 << 20
    max_batch_keys: int = 65536      # one RPC carries at most this many keys
    lease_ttl_s: float = 30.0        # a read lease ends by itself after this
    grant_ttl_s: float = 30.0        # an uncommitted write grant is reclaimed after this
    node_ttl_s: float = 10.0         # a node silent this long is dropped (nodes registered with expires=False never)
    suspect_after_s: float = 0.0     # a node silent this long gets no new placement (0 = node_ttl_s / 2)
    reload_grace_s: float = 0.0      # a node reloaded from Redis may take this long to register (0 = max(30, 3 ttl))
    promote_on_hit: bool = True      # an SSD hit is moved to DRAM when DRAM has (or can make) room
    policy: str = "lru"
    max_namespaces: int = 256        # namespace labels counted apart (stats, metric series); later ones: "(other)"
    # Inclusive SSD tier: an object put on DRAM/HBM of a node with an SSD gets its SSD extent at once and its bytes
    # are copied there within about write_behind_s (store/writebehind.py), so a restart keeps what DRAM held. The
    # pool then holds as many objects as its SSDs; every put is written to SSD once (bench/write_behind.py). Only
    # nodes whose SSD is at least twice their DRAM (+ HBM) get copies (store/copies.py); the others stay exclusive.
    write_behind: bool = True
    write_behind_s: float = 0.2      # period of the write-behind copier: the lag of a copy behind its commit
    # Retention hints (a put's pin_s, store/retention.py): a tenant's pinned payload bytes stay within this share of
    # the pool's capacity (auth off: the whole pool is one tenant); pins past it are ignored and counted. 0 = none.
    pin_max_fraction: float = 0.5
    # Removal tombstones (store/tombstones.py): removed keys remembered so a node that was away does not bring them
    # back (~100 bytes of master memory each); beyond this many the oldest fold into 2^20 time slots by key (8 MiB):
    # a reported record written before its key's slot is not re-adopted.
    max_tombstones: int = 100_000
    # The same per tenant key space (a tenant's removals, auth on), folded into that space's own 2^17 slots (1 MiB):
    # a tenant that removes many keys it never stored costs only its own older records, never another's.
    max_tenant_tombstones: int = 10_000

    def __post_init__(self) -> None:
        _check_nonneg_int(self, "max_object_bytes", "max_batch_keys")
        for name in ("max_tombstones", "max_tenant_tombstones"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1 (removed keys remembered), got {value!r}")
        value = self.pin_max_fraction
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ValueError(f"pin_max_fraction must be a share of the pool's capacity in [0, 1] (0 = no retention "
                             f"hints honoured), got {value!r}")
        if isinstance(self.max_namespaces, bool) or not isinstance(self.max_namespaces, int) \
                or self.max_namespaces < 2:
            raise ValueError(f"max_namespaces must be an int >= 2, got {self.max_namespaces!r}")
        if self.max_object_bytes == 0:
            raise ValueError("max_object_bytes must be > 0, got 0")
        if self.max_object_bytes > MAX_OBJECT_BYTES:
            raise ValueError(f"max_object_bytes must be <= {MAX_OBJECT_BYTES} (4 GiB - 1: the index's u32 size "
                             f"column), got {self.max_object_bytes}")
        if self.max_batch_keys == 0:
            raise ValueError("max_batch_keys must be > 0, got 0")
        _check_positive(self, "lease_ttl_s", "grant_ttl_s", "node_ttl_s")
        for name in ("suspect_after_s", "reload_grace_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a number of seconds >= 0 (0 = the default), got {value!r}")
        if self.suspect_after_s >= self.node_ttl_s:
            raise ValueError(f"suspect_after_s ({self.suspect_after_s}) must be below node_ttl_s ({self.node_ttl_s}): "
                             "a node stops getting new objects before it is dropped")
        if not isinstance(self.promote_on_hit, bool):
            raise ValueError(f"promote_on_hit must be true or false, got {self.promote_on_hit!r}")
        if self.policy not in _POLICIES:
            raise ValueError(f"policy must be one of {list(_POLICIES)}, got {self.policy!r}")
        if not isinstance(self.write_behind, bool):
            raise ValueError(f"write_behind must be true or false, got {self.write_behind!r}")
        _check_positive(self, "write_behind_s")
        super().__post_init__()

    @property
    def suspect_s(self) -> float:
        """Heartbeat silence after which a node gets no new placement (its objects are still served)."""
        return self.suspect_after_s or self.node_ttl_s / 2

    @property
    def grace_s(self) -> float:
        """How long a node known only from the journal may take to register with a restarted master."""
        return self.reload_grace_s or max(30.0, 3 * self.node_ttl_s)


@dataclass(frozen=True, kw_only=True)
class NodeConfig(_Group):
    """A storage node's tiers."""

    node_id: str = "node-0"
    dram_bytes: int = 256 << 20
    ssd_path: str | None = None      # directory of the SSD file; None = no SSD tier
    ssd_bytes: int = 0
    shm_dir: str = "/dev/shm"
    share_dram: bool = False         # same-host clients map the /dev/shm arena and read the SSD file
    hbm_bytes: int = 0               # device memory reserved as the fastest tier; > 0 needs a CUDA device
    hbm_device: int = 0
    # SSD writes reach the disk (fdatasync) at most this long after they are made; 0 = at the end of every write
    # batch. A clean stop syncs. A killed process loses nothing it wrote (the page cache outlives it); a power
    # loss or kernel crash loses at most the last ssd_fsync_s of writes (a torn record is then a miss).
    ssd_fsync_s: float = 1.0

    def __post_init__(self) -> None:
        if self.ssd_path in ("", "none", "None"):
            object.__setattr__(self, "ssd_path", None)
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ValueError(f"node_id must be a non-empty string, got {self.node_id!r}")
        _check_nonneg_int(self, "dram_bytes", "ssd_bytes", "hbm_bytes")
        if not isinstance(self.hbm_device, int) or isinstance(self.hbm_device, bool) or self.hbm_device < 0:
            raise ValueError(f"hbm_device must be an integer >= 0 (CUDA device index), got {self.hbm_device!r}")
        if self.hbm_bytes > 0:
            # HBM is a tier only where a CUDA device is: asking for one elsewhere is a config error, caught here.
            from kvpool.tiers.gpu import unavailable_reason

            if unavailable_reason() is not None:
                raise ValueError(f"hbm_bytes={self.hbm_bytes} asks for an HBM tier but no CUDA device is present "
                                 f"(set hbm_bytes=0): {unavailable_reason()}")
        if self.ssd_path is not None and self.ssd_bytes == 0:
            raise ValueError(f"ssd_bytes must be > 0 when ssd_path is set (ssd_path={self.ssd_path!r})")
        if not isinstance(self.share_dram, bool):
            raise ValueError(f"share_dram must be true or false, got {self.share_dram!r}")
        if not isinstance(self.ssd_fsync_s, (int, float)) or isinstance(self.ssd_fsync_s, bool) \
                or not self.ssd_fsync_s >= 0:
            raise ValueError(f"ssd_fsync_s must be a number >= 0 (seconds; 0 = after every write batch), "
                             f"got {self.ssd_fsync_s!r}")
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class MasterServerFields(_Group):
    redis_url: str | None = None      # None = in-memory metadata (lost with the process)
    redis_prefix: str = "kvpool"
    node_rpc_timeout_s: float = 5.0   # deadline of master -> node control calls (demote/promote/drop)
    list_limit: int = 1000
    http_listen: str = ""             # host:port of the dashboard + /metrics ("" = none)
    control_listen: str = ""          # the control channel (store/control_channel.py): "" = the master's listen
                                      # host, any free port; "off" = none (clients use gRPC for every call)
    control_max_connections: int = 1024
    control_idle_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _check_positive(self, "node_rpc_timeout_s")
        if self.control_listen not in ("", "off") and (not isinstance(self.control_listen, str)
                                                       or ":" not in self.control_listen):
            raise ValueError(f"control_listen must be host:port, empty (the master's host, any free port) or 'off', "
                             f"got {self.control_listen!r}")
        _check_positive_int(self, "control_max_connections")
        _check_positive(self, "control_idle_timeout_s")
        _check_positive_int(self, "list_limit")
        _check_address(self, "http_listen", optional=True)
        if not isinstance(self.redis_prefix, str) or not self.redis_prefix:
            raise ValueError(f"redis_prefix must be a non-empty string, got {self.redis_prefix!r}")
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class NodeServerFields(_Group):
    data_listen: str = ""             # raw TCP data channel; "" = the node's listen host, any free port
    advertise_host: str = ""          # host clients dial; "" = the node's listen host
    rpc_timeout_s: float = 5.0        # deadline of node -> master calls (register, report, heartbeat)
    metrics_listen: str = ""          # host:port of the node's /metrics ("" = none)
    data_idle_timeout_s: float = 60.0  # a data connection silent this long (half-open, stalled peer) is closed
    data_max_connections: int = 256   # data connections served at once (a thread each); more are refused
    stop_flush_s: float = 60.0        # a clean stop first has the master copy this node's DRAM to its SSD, this long
    register_drain_s: float = 1.0     # registering again, writes in flight may finish this long; the rest are cut

    def __post_init__(self) -> None:
        _check_address(self, "data_listen", "metrics_listen", optional=True)
        _check_positive(self, "rpc_timeout_s", "data_idle_timeout_s", "stop_flush_s")
        _check_positive_int(self, "data_max_connections")
        _check_seconds(self, "register_drain_s")
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class Liveness(_Group):
    heartbeat_s: float = 1.0          # a node's heartbeat interval (the master tells nodes its own at registration)

    def __post_init__(self) -> None:
        _check_positive(self, "heartbeat_s")
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class PeerAuthFields(_Group):
    """The cluster's node tokens: a node accepts them from the master (Demote/Promote/Drop), the master accepts them
    from nodes (RegisterNode/Heartbeat/ReportObjects), and each presents the first entry of the first source to the
    other. `auth_cert_roles`: a verified client certificate (mutual TLS) names the caller when it sends no token."""

    auth_node_tokens: tuple[str, ...] = ()
    auth_cert_roles: bool = False
    auth_reload_interval_s: float = 1.0

    def __post_init__(self) -> None:
        _normalise_auth(self, ("auth_node_tokens",))
        super().__post_init__()
        self.auth_config()  # syntax and sources checked at start, each error naming its auth_* field

    def auth_config(self):
        """The store.auth.AuthConfig of this process (its `enabled` is False when nothing is configured)."""
        from kvpool.store.auth import AuthConfig

        return _prefixed("auth_", lambda: AuthConfig(
            node_tokens=self.auth_node_tokens, admin_tokens=getattr(self, "auth_admin_tokens", ()),
            client_tokens=getattr(self, "auth_client_tokens", ()),
            viewer_tokens=getattr(self, "auth_viewer_tokens", ()), cert_roles=self.auth_cert_roles,
            reload_interval_s=self.auth_reload_interval_s))

    def token_store(self):
        """A loaded store.auth.TokenStore, or None with auth off (ValueError naming the field for a bad source)."""
        from kvpool.store.auth import TokenStore

        cfg = self.auth_config()
        if not cfg.enabled or not (cfg.node_tokens or cfg.admin_tokens or cfg.client_tokens or cfg.viewer_tokens):
            return None
        return _prefixed("auth_", lambda: TokenStore(cfg))

    def peer_token(self):
        """The token this process presents to its peers (a store.auth.TokenSource), or None."""
        from kvpool.store.auth import TokenSource

        if not self.auth_node_tokens:
            return None
        return _prefixed("", lambda: TokenSource(self.auth_node_tokens[0], field="auth_node_tokens[0]",
                                                  reload_interval_s=self.auth_reload_interval_s))


@dataclass(frozen=True, kw_only=True)
class AuthFields(PeerAuthFields):
    """The master's token sources of the other roles (store/auth/config.py has the file format)."""

    auth_admin_tokens: tuple[str, ...] = ()
    auth_client_tokens: tuple[str, ...] = ()     # entries TENANT:TOKEN
    auth_viewer_tokens: tuple[str, ...] = ()     # read-only: Stats and the dashboard

    def __post_init__(self) -> None:
        _normalise_auth(self, ("auth_admin_tokens", "auth_client_tokens", "auth_viewer_tokens"))
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class TlsFields(_Group):
    """TLS for gRPC (server and the channels to peers) and the node's data channel; store/tls.py. All empty = off."""

    tls_cert: str = ""                  # this process's certificate chain (PEM)
    tls_key: str = ""                   # its private key (PEM, unencrypted: servers start unattended)
    tls_ca: str = ""                    # CA bundle that verifies peers (and client certificates)
    tls_require_client_cert: bool = False   # mutual TLS: callers must present a certificate of tls_ca
    tls_server_name: str = ""           # name to check in a peer's certificate instead of the address dialled
    tls_data_channel: bool = True       # a node serves its TCP data channel over TLS too (when TLS is on)

    def __post_init__(self) -> None:
        if not isinstance(self.tls_data_channel, bool):
            raise ValueError(f"tls_data_channel must be true or false, got {self.tls_data_channel!r}")
        self.tls_config()
        super().__post_init__()

    def tls_config(self):
        """A store.tls.TlsConfig, or None with TLS off (ValueError naming the tls_* field)."""
        from kvpool.store.tls import TlsConfig

        return _prefixed("tls_", lambda: TlsConfig.maybe(
            cert=self.tls_cert, key=self.tls_key, ca=self.tls_ca, require_client_cert=self.tls_require_client_cert,
            server_name=self.tls_server_name))


@dataclass(frozen=True, kw_only=True)
class TenantQuotas(_Group):
    """Bytes each tenant may hold (payload bytes; auth on: the tenant of the client credential). Text form
    `acme:dram=1GiB,total=4GiB;*:total=1GiB` ("*" = every tenant not named; 0 or absent = no limit), or in a
    config file a mapping {tenant: {dram_bytes, total_bytes}}. Kept as the canonical text."""

    tenant_quotas: str = ""

    def __post_init__(self) -> None:
        from kvpool.store.tenants import Quota, format_quotas, parse_quotas

        value = self.tenant_quotas
        if isinstance(value, dict):
            table = {}
            for tenant, limits in value.items():
                if not isinstance(limits, dict) or set(limits) - {"dram_bytes", "total_bytes"}:
                    raise ValueError(f"tenant_quotas.{tenant}: expected {{dram_bytes: SIZE, total_bytes: SIZE}}")
                table[str(tenant)] = Quota(**{k: parse_size(v, f"tenant_quotas.{tenant}.{k}")
                                              for k, v in limits.items()})
            value = format_quotas(table)
        if not isinstance(value, str):
            raise ValueError(f"tenant_quotas: expected TENANT:dram=SIZE,total=SIZE;... , got {value!r}")
        object.__setattr__(self, "tenant_quotas", format_quotas(parse_quotas(value)))
        super().__post_init__()

    def quotas(self) -> dict:
        """{tenant: store.tenants.Quota} ("*" = the default)."""
        from kvpool.store.tenants import parse_quotas

        return parse_quotas(self.tenant_quotas)


@dataclass(frozen=True, kw_only=True)
class TrafficRecording(_Group):
    """Record the master's lookups and puts from its start (store/recorder.py; at run time: `kvpool trace record`).
    Keys as 64-bit ids only: no KV bytes, no token ids. The directory is checked (created, writable) at start."""

    record_directory: str = ""                # "" = off (the default)
    record_max_file_bytes: int = 64 << 20     # a Parquet file is closed (and a new one started) past this size
    record_duration_s: float = 0.0            # stop after this long; 0 = while the master runs
    record_max_files: int = 0                 # keep only the newest N closed files; 0 = all

    def __post_init__(self) -> None:
        from kvpool.store.recorder import check_values

        if not isinstance(self.record_directory, str):
            raise ValueError(f"record_directory must be a path or empty (off), got {self.record_directory!r}")
        _prefixed("record_", lambda: check_values(self.record_max_file_bytes, self.record_duration_s,
                                                   self.record_max_files))
        super().__post_init__()

    def check_recording(self) -> None:
        """The configured directory is (made) writable: ValueError naming record_directory otherwise."""
        if self.record_directory:
            from kvpool.store.recorder import check_args

            _prefixed("record_", lambda: check_args(self.record_directory, self.record_max_file_bytes,
                                                     self.record_duration_s, self.record_max_files))

    def start_recording(self, master) -> None:
        """Start the configured recording on `master` (nothing when off); ValueError naming the record_* field."""
        if self.record_directory:
            _prefixed("record_", lambda: master.start_recording(
                self.record_directory, max_file_bytes=self.record_max_file_bytes,
                duration_s=self.record_duration_s, max_files=self.record_max_files))


def _normalise_auth(obj, names: tuple[str, ...]) -> None:
    from kvpool.store.auth.config import split_sources

    for name in names:
        object.__setattr__(obj, name, _prefixed("", lambda: split_sources(getattr(obj, name), name)))
    if not isinstance(obj.auth_cert_roles, bool):
        raise ValueError(f"auth_cert_roles must be true or false, got {obj.auth_cert_roles!r}")


def _prefixed(prefix: str, build):
    """`build()`, with a ValueError's message prefixed so it names this config's field (auth_node_tokens[0]: ...)."""
    try:
        return build()
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith(prefix) else prefix + msg) from None


# ---------------------------------------------------------------------------------------------- processes


@dataclass(frozen=True, kw_only=True)
class MasterServerConfig(MasterServerFields, AuthFields, TlsFields, TenantQuotas, TrafficRecording, Liveness,
                         MasterConfig):
    """The `kvpool master` process."""

    listen: str = "127.0.0.1:50051"
    workers: int = 16

    def __post_init__(self) -> None:
        _check_address(self, "listen")
        _check_positive_int(self, "workers")
        super().__post_init__()
        if self.heartbeat_s >= self.node_ttl_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be below node_ttl_s ({self.node_ttl_s}), "
                             "or every node is dropped between two heartbeats")


@dataclass(frozen=True, kw_only=True)
class NodeServerConfig(NodeServerFields, PeerAuthFields, TlsFields, Liveness, NodeConfig):
    """The `kvpool node` process."""

    master: str = "127.0.0.1:50051"
    listen: str = "127.0.0.1:50052"   # gRPC NodeService
    workers: int = 8
    share_dram: bool = True           # same-host clients map the arena, read SSD records themselves

    def __post_init__(self) -> None:
        _check_address(self, "listen", "master")
        _check_positive_int(self, "workers")
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class UpConfig(MasterServerFields, NodeServerFields, AuthFields, TlsFields, TenantQuotas, TrafficRecording, Liveness,
               MasterConfig, NodeConfig):
    """`kvpool up`: a master and one node in one process; every field of both processes, but where each listens
    (`listen` is the master's, `node_listen` the node's) and their worker threads."""

    listen: str = "127.0.0.1:50051"       # the master: what clients and `kvpool status` dial
    node_listen: str = ""                 # "" = the master's host, any free port
    node_id: str = "local"
    ssd_path: str | None = "/var/tmp/kvpool"
    ssd_bytes: int = 1 << 30
    share_dram: bool = True
    http_listen: str = "127.0.0.1:8080"   # dashboard + /metrics; "" = none; taken port = warning, pool still starts

    def __post_init__(self) -> None:
        _check_address(self, "listen")
        _check_address(self, "node_listen", optional=True)
        super().__post_init__()
        if self.ssd_path is None and self.ssd_bytes:
            object.__setattr__(self, "ssd_bytes", 0)  # `--ssd-path none` turns the SSD tier off whatever its size
        if self.auth_config().enabled and not (self.auth_node_tokens or self.auth_cert_roles):
            raise ValueError("auth_node_tokens: with authentication on, `kvpool up`'s node registers with a node "
                             "token: name the cluster's node token file (file:PATH)")
        self.master_server_config()
        self.node_server_config("127.0.0.1:1")

    def master_server_config(self) -> MasterServerConfig:
        return project(MasterServerConfig, self)

    def node_server_config(self, master_address: str) -> NodeServerConfig:
        host = self.listen.rsplit(":", 1)[0]
        return project(NodeServerConfig, self, master=master_address, listen=self.node_listen or f"{host}:0")


@dataclass(frozen=True, kw_only=True)
class EmbeddedConfig(TrafficRecording, MasterConfig, NodeConfig):
    """Everything `EmbeddedPool` takes, flat, so one file or one set of KVPOOL_* variables configures it."""

    node_id: str = "local"

    def master_config(self) -> MasterConfig:
        return project(MasterConfig, self)

    def node_config(self) -> NodeConfig:
        return project(NodeConfig, self)


__all__ = ["MasterConfig", "NodeConfig", "MasterServerFields", "NodeServerFields", "Liveness", "PeerAuthFields",
           "AuthFields", "TlsFields", "TenantQuotas", "TrafficRecording", "MasterServerConfig", "NodeServerConfig",
           "UpConfig", "EmbeddedConfig", "project", "parse_size"]
