"""RedisMetadata: the master's write-through journal in a real redis-server, so a restarted master, or a standby
taking over, reloads every committed object and node registration.

Layout under one prefix (default "kvpool"), binary keys and values, no per-object Redis key:

    <p>:obj:<node_id>   HASH  16-byte block key -> 41-byte packed record (below)
    <p>:nodes           HASH  node_id -> JSON of NodeInfo
    <p>:endpoints       HASH  node_id -> opaque bytes (the master server's NodeEndpoint message)
    <p>:secret          STRING the pool's token secret (SET NX: the first master picks it, every later one reuses it)

    record = ns_digest 16s | tier B | offset Q | size Q | checksum Q      (little endian, 41 bytes)

Why hashes per node: a Redis top-level key costs ~70 bytes of overhead on its own; a hash field costs ~ its
bytes plus ~20, so 1M objects take ~90 MB of Redis instead of ~160 MB. One hash per node makes "drop a node" one
UNLINK instead of a scan. Writes are pipelined in chunks of `batch` commands' worth of fields: a 1,000-key commit is
one round trip. Durability is whatever the redis-server is configured for (appendonly for restart safety).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import struct
from collections import defaultdict
from typing import Iterable

import redis

from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

_REC = struct.Struct("<16sBQQQ")
_CHUNK = 4096


class RedisMetadata:
    """MetadataBackend over redis-server. `url` like redis://127.0.0.1:6379/0."""

    persistent = True

    def __init__(self, url: str, *, prefix: str = "kvpool", timeout: float = 5.0) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must look like redis://host:port/db, got {url!r}")
        if not prefix or ":" in prefix:
            raise ValueError(f"prefix must be a non-empty string without ':', got {prefix!r}")
        self.url = url
        self._p = prefix
        self._r = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                       decode_responses=False)
        self._r.ping()  # fail at start, naming the URL, rather than on the first commit
        self._nodes_key = f"{prefix}:nodes"
        self._endpoints_key = f"{prefix}:endpoints"
        self._secret_key = f"{prefix}:secret"

    def _obj_key(self, node_id: str) -> str:
        return f"{self._p}:obj:{node_id}"

    # ---------------------------------------------------------------- objects
    def put_objects(self, records: Iterable[ObjectRecord]) -> None:
        by_node: dict[str, dict[bytes, bytes]] = defaultdict(dict)
        for r in records:
            by_node[r.node_id][bytes(r.key)] = _REC.pack(r.ns_digest, int(r.tier), r.offset, r.size, r.checksum)
        if not by_node:
            return
        pipe = self._r.pipeline(transaction=False)
        for node_id, mapping in by_node.items():
            items = list(mapping.items())
            for i in range(0, len(items), _CHUNK):
                pipe.hset(self._obj_key(node_id), mapping=dict(items[i:i + _CHUNK]))
        pipe.execute()

    def delete_objects(self, keys: Iterable[bytes]) -> None:
        keys = [bytes(k) for k in keys]
        if not keys:
            return
        # The caller knows keys, not nodes: delete from every node's hash (nodes are few; one HDEL each per chunk).
        node_ids = self._node_ids()
        pipe = self._r.pipeline(transaction=False)
        for node_id in node_ids:
            for i in range(0, len(keys), _CHUNK):
                pipe.hdel(self._obj_key(node_id), *keys[i:i + _CHUNK])
        pipe.execute()

    def load_objects(self) -> list[ObjectRecord]:
        out: list[ObjectRecord] = []
        for node_id in self._node_ids():
            for key, value in self._r.hscan_iter(self._obj_key(node_id), count=_CHUNK):
                ns, tier, offset, size, checksum = _REC.unpack(value)
                out.append(ObjectRecord(key=key, ns_digest=ns, node_id=node_id, tier=Tier(tier), offset=offset,
                                        size=size, checksum=checksum))
        return out

    def count_objects(self) -> int:
        node_ids = self._node_ids()
        pipe = self._r.pipeline(transaction=False)
        for node_id in node_ids:
            pipe.hlen(self._obj_key(node_id))
        return sum(pipe.execute()) if node_ids else 0

    # ---------------------------------------------------------------- nodes
    def _node_ids(self) -> list[str]:
        # Object hashes of nodes that were never registered (should not happen) are found by the scan too.
        ids = {k.decode() for k in self._r.hkeys(self._nodes_key)}
        prefix = f"{self._p}:obj:".encode()
        ids.update(k[len(prefix):].decode() for k in self._r.scan_iter(match=prefix + b"*", count=1000))
        return sorted(ids)

    def put_node(self, info: NodeInfo) -> None:
        self._r.hset(self._nodes_key, info.node_id, json.dumps(dataclasses.asdict(info)))

    def delete_node(self, node_id: str) -> None:
        pipe = self._r.pipeline(transaction=False)
        pipe.hdel(self._nodes_key, node_id)
        pipe.hdel(self._endpoints_key, node_id)
        pipe.unlink(self._obj_key(node_id))
        pipe.execute()

    def load_nodes(self) -> list[NodeInfo]:
        return [NodeInfo(**json.loads(v)) for _, v in sorted(self._r.hgetall(self._nodes_key).items())]

    def put_node_endpoint(self, node_id: str, data: bytes) -> None:
        """Extra per-node bytes the master server needs to route clients (addresses, host id)."""
        self._r.hset(self._endpoints_key, node_id, data)

    def load_node_endpoints(self) -> dict[str, bytes]:
        return {k.decode(): v for k, v in self._r.hgetall(self._endpoints_key).items()}

    def shared_secret(self) -> bytes:
        """The pool's token secret: created once, then the same for every master that uses this Redis."""
        self._r.set(self._secret_key, secrets.token_bytes(32), nx=True)
        return self._r.get(self._secret_key)

    def close(self) -> None:
        self._r.close()
