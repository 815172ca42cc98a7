"""Frozen, validated configs of the master and of a storage node, and the flat config of the embedded pool.

All three load through `kvpool.config.load_config` (defaults < YAML/TOML file < KVPOOL_* env < kwargs). An invalid
value raises ValueError naming the field and what would be valid; nothing else in store/ re-validates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.tiers.policy import POLICY_NAMES as _POLICIES


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


def _check_hbm(hbm_bytes: int, hbm_device: int) -> None:
    """HBM is a tier only where a CUDA device is: asking for one elsewhere is a config error, caught before start."""
    if hbm_bytes > 0:
        from kvpool.tiers.gpu import cuda_available
        if not cuda_available():
            raise ValueError(f"hbm_bytes={hbm_bytes} asks for an HBM tier but no CUDA device is present "
                             "(set hbm_bytes=0)")
    if not isinstance(hbm_device, int) or isinstance(hbm_device, bool) or hbm_device < 0:
        raise ValueError(f"hbm_device must be an integer >= 0 (CUDA device index), got {hbm_device!r}")


def _check_policy(policy: str) -> None:
    if policy not in _POLICIES:
        raise ValueError(f"policy must be one of {list(_POLICIES)}, got {policy!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MasterConfig:
    max_object_bytes: int = 64 << 20
    max_batch_keys: int = 65536      # one RPC carries at most this many keys
    lease_ttl_s: float = 30.0        # a read lease ends by itself after this
    grant_ttl_s: float = 30.0        # an uncommitted write grant is reclaimed after this
    node_ttl_s: float = 10.0         # a node silent this long is dropped (nodes registered with expires=False never)
    promote_on_hit: bool = True      # an SSD hit is moved to DRAM when DRAM has (or can make) room
    policy: str = "lru"
    grant_secret: bytes = b""        # HMAC key for grant tokens; empty = random per master process

    def __post_init__(self) -> None:
        _check_nonneg_int(self, "max_object_bytes", "max_batch_keys")
        if self.max_object_bytes == 0:
            raise ValueError("max_object_bytes must be > 0, got 0")
        if self.max_batch_keys == 0:
            raise ValueError("max_batch_keys must be > 0, got 0")
        _check_positive(self, "lease_ttl_s", "grant_ttl_s", "node_ttl_s")
        if not isinstance(self.promote_on_hit, bool):
            raise ValueError(f"promote_on_hit must be true or false, got {self.promote_on_hit!r}")
        _check_policy(self.policy)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    node_id: str = "node-0"
    dram_bytes: int = 256 << 20
    ssd_path: str | None = None      # directory of the SSD file; None = no SSD tier
    ssd_bytes: int = 0
    shm_dir: str = "/dev/shm"
    share_dram: bool = False         # keep the /dev/shm file linked so same-host clients can attach it
    hbm_bytes: int = 0               # device memory reserved as the fastest tier; > 0 needs a CUDA device
    hbm_device: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ValueError(f"node_id must be a non-empty string, got {self.node_id!r}")
        _check_nonneg_int(self, "dram_bytes", "ssd_bytes", "hbm_bytes")
        _check_hbm(self.hbm_bytes, self.hbm_device)
        if self.ssd_path is not None and self.ssd_bytes == 0:
            raise ValueError(f"ssd_bytes must be > 0 when ssd_path is set (ssd_path={self.ssd_path!r})")


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddedConfig:
    """Everything `EmbeddedPool` takes, flat, so one file or one set of KVPOOL_* variables configures it."""

    dram_bytes: int = 256 << 20
    ssd_path: str | None = None
    ssd_bytes: int = 0
    max_object_bytes: int = 64 << 20
    lease_ttl_s: float = 30.0
    grant_ttl_s: float = 30.0
    promote_on_hit: bool = True
    policy: str = "lru"
    shm_dir: str = "/dev/shm"
    node_id: str = "local"
    hbm_bytes: int = 0
    hbm_device: int = 0

    def __post_init__(self) -> None:
        # Build both parts now so a bad value fails here, naming its field.
        self.master_config()
        self.node_config()

    def master_config(self) -> MasterConfig:
        return MasterConfig(max_object_bytes=self.max_object_bytes, lease_ttl_s=self.lease_ttl_s,
                            grant_ttl_s=self.grant_ttl_s, promote_on_hit=self.promote_on_hit, policy=self.policy)

    def node_config(self) -> NodeConfig:
        return NodeConfig(node_id=self.node_id, dram_bytes=self.dram_bytes, ssd_path=self.ssd_path,
                          ssd_bytes=self.ssd_bytes, shm_dir=self.shm_dir, share_dram=False,
                          hbm_bytes=self.hbm_bytes, hbm_device=self.hbm_device)
