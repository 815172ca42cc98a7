"""The bundled paged-attention engine: `LLM`, `LLMEngine`, `SamplingParams`, `EngineConfig`, `KVConnectorBase`.

Imported lazily so `import kvpool.engine_adapter.config` (used by `kvpool config check`) needs no torch.
"""

_EXPORTS = {
    "LLM": "kvpool.engine_adapter.llm",
    "LLMEngine": "kvpool.engine_adapter.llm_engine",
    "RequestOutput": "kvpool.engine_adapter.llm_engine",
    "SamplingParams": "kvpool.engine_adapter.sampling",
    "EngineConfig": "kvpool.engine_adapter.config",
    "KVConnectorBase": "kvpool.hooks",
    "EngineInfo": "kvpool.hooks",
    "EngineServer": "kvpool.engine_adapter.server",
    "default_model_path": "kvpool.engine_adapter.model_files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvpool.engine_adapter' has no attribute {name!r}")
