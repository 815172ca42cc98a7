"""The vLLM connector's configuration: vLLM's `kv_connector_extra_config` dict mapped onto the ordinary
`ConnectorConfig`, plus the few knobs only the vLLM adapter has. vLLM-free, so unit tests cover it without vLLM.

    --kv-transfer-config '{"kv_connector": "KVPoolConnector",
                           "kv_connector_module_path": "kvpool.engine_adapter.vllm.connector",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"pool": "127.0.0.1:50051", "tenant": "team-a",
                                                         "lookup_timeout_s": 0.25, "min_hit_tokens": 128}}'

Precedence, later wins: ConnectorConfig defaults < `config_file` (YAML/TOML) < KVPOOL_* environment < the extra
config's own fields. Every error names the field as `kv_connector_extra_config.<field>` and is raised while vLLM
starts, never later.

Rules that differ from the bundled engine's connector:
- `pool` must be a master address (`kvpool up` prints it). "embedded" cannot work: vLLM builds the connector twice, in
  the engine-core process (scheduler side) and in each worker process, so an in-process pool would be a private,
  empty pool per process, and the scheduler would never see what the worker saved.
- `block_tokens` is vLLM's `--block-size` (the CPU backend wants a multiple of 32, default 128); a different value
  is refused rather than silently ignored, since one pool object is exactly one vLLM block.
- `lookup_timeout_s` is the scheduler side's deadline: its prefix lookup runs inside vLLM's scheduling loop, so a
  slow pool must cost every other request in the batch at most this long. `load_timeout_s` is the worker's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from kvpool.config import load_config
from kvpool.connector.config import ConnectorConfig

PREFIX = "kv_connector_extra_config"
_EMBEDDED_ONLY = ("embedded_dram_bytes", "embedded_ssd_path", "embedded_ssd_bytes")


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmConnectorConfig:
    connector: ConnectorConfig
    lookup_timeout_s: float = 0.25      # scheduler-side prefix lookup deadline (it blocks vLLM's scheduler)
    model_fingerprint: str = ""         # "" = digest of the model folder's files (vllm_layout.model_fingerprint)
    model_name: str = ""                # "" = vLLM's served model name

    def __post_init__(self) -> None:
        value = self.lookup_timeout_s
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{PREFIX}.lookup_timeout_s must be > 0 seconds, got {value!r}")
        for name in ("model_fingerprint", "model_name"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{PREFIX}.{name} must be a string, got {getattr(self, name)!r}")

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None, *, block_size: int,
                          env: Mapping[str, str] | None = None) -> "VllmConnectorConfig":
        """Validate everything before building anything; ValueError naming `kv_connector_extra_config.<field>`."""
        if extra is None:
            extra = {}
        if not isinstance(extra, Mapping):
            raise ValueError(f"{PREFIX} must be a JSON object, got {type(extra).__name__}")
        own = {f.name for f in dataclasses.fields(cls)} - {"connector"}
        base = {f.name for f in dataclasses.fields(ConnectorConfig)}
        fields: dict[str, Any] = {}
        mine: dict[str, Any] = {}
        config_file = None
        for key, value in extra.items():
            name = str(key).replace("-", "_")
            if name == "config_file":
                config_file = value
            elif name in own:
                mine[name] = value
            elif name in _EMBEDDED_ONLY:
                raise ValueError(f"{PREFIX}.{name}: embedded-pool settings do not apply under vLLM (the pool must "
                                 f"be a master address)")
            elif name in base:
                fields[name] = value
            else:
                valid = sorted((base | own | {"config_file"}) - set(_EMBEDDED_ONLY))
                raise ValueError(f"{PREFIX}.{key}: unknown field; valid fields: {', '.join(valid)}")
        if "block_tokens" in fields and fields["block_tokens"] != block_size:
            raise ValueError(f"{PREFIX}.block_tokens is {fields['block_tokens']!r} but vLLM's --block-size is "
                             f"{block_size}: one pool block is one vLLM block; drop block_tokens or make them equal")
        fields["block_tokens"] = block_size
        try:
            connector = load_config(ConnectorConfig, config_file, env=env, **fields)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{PREFIX}.{exc}") from None
        if connector.pool == "embedded":
            raise ValueError(f"{PREFIX}.pool must be a kvpool master address host:port (`kvpool up` prints it), not "
                             f"'embedded': vLLM runs the connector in separate scheduler and worker processes, and "
                             f"an in-process pool would be private to each")
        return cls(connector=connector, **mine)
