"""kvpool: a tiered KV-cache pool for LLM inference.

Public API (stable): Namespace, block_keys, EmbeddedPool, PoolClient, PoolError.
Heavy pieces are imported lazily so `import kvpool` stays cheap and needs neither torch nor grpc.
"""

from kvpool.errors import PoolAuthError, PoolDataError, PoolError, PoolProtocolError, PoolTimeout, PoolUnavailable
from kvpool.keys import KEY_BYTES, BlockKey, Namespace, block_keys

__version__ = "0.1.0"

__all__ = ["Namespace", "block_keys", "BlockKey", "KEY_BYTES", "EmbeddedPool", "PoolClient", "PoolError",
           "PoolUnavailable", "PoolTimeout", "PoolDataError", "PoolProtocolError", "PoolAuthError", "__version__"]


def __getattr__(name: str):
    if name == "EmbeddedPool":
        from kvpool.embedded import EmbeddedPool

        return EmbeddedPool
    if name == "PoolClient":
        from kvpool.client import PoolClient

        return PoolClient
    raise AttributeError(f"module 'kvpool' has no attribute {name!r}")
