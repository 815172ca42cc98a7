"""Connector configuration: one frozen, validated record, loadable from YAML/TOML and KVPOOL_* environment variables.

Example (connector.yaml):

    pool: 127.0.0.1:50051      # or "embedded" for an in-process pool (single instance only)
    block_tokens: 16
    save_policy: write_through # write_through | after_n_hits | off
    save_after_hits: 2         # with after_n_hits: save a block once its prefix was requested this many times
    load_timeout_s: 2.0
    retry_after_s: 5.0         # after a pool fault, recompute without asking the pool for this long
    min_hit_tokens: 32         # shorter pool hits are recomputed
    load_policy: auto          # auto (load only when faster than recompute) | always
    tenant: default
    auth_token: file:/etc/kvpool/client.token   # pool with authentication on (or KVPOOL_AUTH_TOKEN); never the token
    tls_ca: /etc/kvpool/tls/ca.pem              # pool with TLS (tls_cert + tls_key too for mutual TLS)
    transfer: auto             # auto (= direct) | staged | direct (connector/direct.py)
    layerwise_load: auto       # auto (on with direct on CUDA) | on | off: load layer i+1 while layer i computes
    pin_host_memory: true      # CUDA engines: register the pool memory mapped here as pinned (DMA)
    pin_s: 0                   # retention hint of every save (seconds; 0 = none); a request overrides it with
                               # kv_transfer_params {"pin_s": N} (bundled engine and vLLM alike)
    warm_start: true           # connect at engine start and map + prefault the same-host nodes' arenas in the
                               # background (PoolClient.warm), so the first request pays no connection or page faults

With authentication on the pool takes the tenant from the token (`auth_token`), not from `tenant`: `tenant` still
goes into the namespace (so two tenants' keys differ even before the master scopes them).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from kvpool.config import load_config
from kvpool.pool import pin_seconds

log = logging.getLogger(__name__)


class SavePolicy(str, enum.Enum):
    WRITE_THROUGH = "write_through"
    AFTER_N_HITS = "after_n_hits"
    OFF = "off"


class LoadPolicy(str, enum.Enum):
    AUTO = "auto"
    ALWAYS = "always"


class TransferMode(str, enum.Enum):
    AUTO = "auto"          # direct (on CPU too: one copy, checked after it; measured faster than staged)
    STAGED = "staged"      # through the connector's staging tensor: get_many_into / put_many
    DIRECT = "direct"      # straight between the cache and the pool's memory (reserve_many / acquire_many)


class LayerwiseMode(str, enum.Enum):
    AUTO = "auto"          # on where the transfer is direct and the cache is on CUDA
    ON = "on"
    OFF = "off"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorConfig:
    pool: str = "embedded"
    block_tokens: int = 16
    save_policy: SavePolicy = SavePolicy.WRITE_THROUGH
    save_after_hits: int = 2
    load_timeout_s: float = 2.0
    retry_after_s: float = 5.0          # after a pool fault, skip the pool this long (a dead pool costs nothing)
    min_hit_tokens: int = 16
    load_policy: LoadPolicy = LoadPolicy.AUTO
    tenant: str = "default"
    save_queue_blocks: int = 1024
    load_chunk_blocks: int = 64          # SSD/TCP blocks staged per load read (same-host DRAM: the whole hit in one
                                         # read); its staging reserved at start (CPU: 2 x 64 x 720 KiB)
    transport: str = "auto"
    embedded_dram_bytes: int = 256 << 20
    embedded_ssd_path: str | None = None
    embedded_ssd_bytes: int = 0
    auth_token: str = ""                 # file:PATH or env:NAME; "" = KVPOOL_AUTH_TOKEN if set, else none
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_server_name: str = ""
    transfer: TransferMode = TransferMode.AUTO
    layerwise_load: LayerwiseMode = LayerwiseMode.AUTO
    pin_host_memory: bool = True
    pin_s: float = 0.0                   # retention hint of the blocks this connector saves (kvpool store/retention.py)
    warm_start: bool = True              # connect + map/prefault same-host arenas at attach, in a thread
    verify_threads: int = 1              # 1: a helper thread hashes landed chunks of a big same-host read; 0: none

    def __post_init__(self) -> None:
        def fix(name: str, enum_cls: type[enum.Enum]) -> None:
            value = getattr(self, name)
            if not isinstance(value, enum_cls):
                try:
                    object.__setattr__(self, name, enum_cls(str(value).lower().replace("-", "_")))
                except ValueError:
                    choices = ", ".join(m.value for m in enum_cls)
                    raise ValueError(f"{name} must be one of {choices}, got {value!r}") from None

        fix("save_policy", SavePolicy)
        fix("load_policy", LoadPolicy)
        fix("transfer", TransferMode)
        fix("layerwise_load", LayerwiseMode)
        if self.layerwise_load is LayerwiseMode.ON and self.transfer is TransferMode.STAGED:
            raise ValueError("layerwise_load=on needs transfer=direct or auto (a staged load is copied whole before "
                             "the forward pass); set layerwise_load=off or transfer=direct")
        pin_seconds(self.pin_s)  # ValueError naming pin_s
        for name in ("pin_host_memory", "warm_start"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.pool, str) or not self.pool:
            raise ValueError("pool must be 'embedded' or a master address host:port")
        if self.pool != "embedded":
            host, _, port = self.pool.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"pool must be 'embedded' or host:port, got {self.pool!r}")
        for name in ("block_tokens", "save_after_hits", "save_queue_blocks", "load_chunk_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("min_hit_tokens", "embedded_dram_bytes", "embedded_ssd_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("load_timeout_s", "retry_after_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if isinstance(self.verify_threads, bool) or self.verify_threads not in (0, 1) \
                or not isinstance(self.verify_threads, int):
            raise ValueError(f"verify_threads must be 0 or 1 (a helper thread hashing same-host reads while the next "
                             f"chunk copies), got {self.verify_threads!r}")
        if not isinstance(self.tenant, str) or not self.tenant:
            raise ValueError("tenant must be a non-empty string")
        if self.transport not in ("auto", "tcp"):
            raise ValueError("transport must be auto (shared memory on the same host, else TCP) or tcp, "
                             f"got {self.transport!r}")
        if self.pool != "embedded":
            self.credentials()  # a bad source or certificate file fails here, naming the field

    def credentials(self):
        """kvpool.credentials.Credentials of a remote pool (ValueError naming auth_token / tls_*)."""
        from kvpool.credentials import credentials_of

        return credentials_of(self.auth_token, ca=self.tls_ca, cert=self.tls_cert, key=self.tls_key,
                              server_name=self.tls_server_name)

    @classmethod
    def load(cls, path: str | None = None, **overrides) -> "ConnectorConfig":
        """File < KVPOOL_* environment < keyword overrides."""
        return load_config(cls, path, **overrides)


def request_pin_s(request, default: float, logged: set[str]) -> float:
    """The retention hint of a request's saves: its kv_transfer_params["pin_s"] (bundled engine and vLLM requests
    both carry the attribute), else `default` (ConnectorConfig.pin_s). A bad value falls back to `default` and is
    logged once: a caller's mistake in a hint must not cost the request anything."""
    params = getattr(request, "kv_transfer_params", None)
    if not isinstance(params, dict) or "pin_s" not in params:
        return default
    try:
        return pin_seconds(params["pin_s"], "kv_transfer_params.pin_s")
    except ValueError as exc:
        if "pin_s" not in logged:
            logged.add("pin_s")
            log.warning("kvpool connector: %s; using pin_s=%s from the connector config", exc, default)
        return default
