"""Open the pool a connector config names: an in-process EmbeddedPool or a PoolClient to a master."""

from __future__ import annotations

from kvpool.connector.config import ConnectorConfig


def open_pool(config: ConnectorConfig):
    if config.pool == "embedded":
        from kvpool.embedded import EmbeddedPool

        return EmbeddedPool(dram_bytes=config.embedded_dram_bytes, ssd_path=config.embedded_ssd_path,
                            ssd_bytes=config.embedded_ssd_bytes)
    from kvpool.client import PoolClient

    return PoolClient(config.pool, transport=config.transport, timeout=config.load_timeout_s, retries=0,
                      credentials=config.credentials(), verify_threads=config.verify_threads)
