"""RedisMetadata: the master's write-through journal in a real redis-server, so a restarted master, or a standby
taking over, reloads every committed object and node registration.

Layout under one prefix (default "kvpool"), binary keys and values, no per-object Redis key:

    <p>:obj:<node_id>   HASH  16-byte block key -> 41-byte packed record (below)
    <p>:nodes           HASH  node_id -> JSON of NodeInfo
    <p>:endpoints       HASH  node_id -> opaque bytes (the master server's NodeEndpoint message)
    <p>:secret          STRING the pool's token secret (SET NX: the first master picks it, every later one reuses it)
    <p>:tomb:keys       HASH  16-byte stored key -> u64 time (µs) of its last removal   } removal tombstones
    <p>:tomb:ns         HASH  16-byte namespace digest -> u64 time of its last evict    } (store/tombstones.py)
    <p>:tomb:floor      STRING the floor's time (decimal µs)                             }
    <p>:tomb:tkeys      HASH  16-byte stored key -> u64 time of a tenant's last removal  } (its key space: the key's
    <p>:tomb:buckets    HASH  scope (b"" or a tenant's 4-byte tag) + u32 BE slot -> u64  }  first 4 bytes; folded
                              newest time folded into that slot                          }  tombstones' slots)

    record = ns_digest 16s | tier B | offset Q | size Q | checksum Q      (little endian, 41 bytes)
             [| pinned_until d]   only for an object with a retention hint (49 bytes; its end, master-clock seconds)

Why hashes per node: a Redis top-level key costs ~70 bytes of overhead on its own; a hash field costs ~ its
bytes plus ~20, so 1M objects take ~90 MB of Redis instead of ~160 MB. One hash per node makes "drop a node" one
UNLINK instead of a scan. Writes are pipelined in chunks of `batch` commands' worth of fields: a 1,000-key commit is
one round trip. Durability is whatever the redis-server is configured for (appendonly for restart safety).

Fail-over (Redis Sentinel): `redis+sentinel://[:password@]host:port[,host:port...]/service[/db][?options]` asks the
sentinels for the current master of `service` on every (re)connection. A write that meets a dead or demoted master
is retried until `failover_timeout_s` (default 15 s) has passed, so a fail-over stalls the master's calls for its
duration instead of failing them. Options:
    wait_replicas=N       after each write, WAIT until N replicas have it (`wait_timeout_ms`, default 1000): an
                          acknowledged put then survives a fail-over; fewer replicas in time fails the write
                          (MetadataUnavailable: the RPC answers UNAVAILABLE and the client does not count it stored).
                          With N replicas required, writes stop while fewer are connected. 0 (default): writes are
                          replicated asynchronously and the last ones before a fail-over can be lost.
    failover_timeout_s=S  how long a write keeps retrying through a fail-over
Any failure that outlasts the retries is raised as MetadataUnavailable (store/metadata.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import secrets
import struct
from collections import defaultdict
from typing import Iterable
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from kvpool.store.metadata import MetadataUnavailable
from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.store.tombstones import TombstoneChanges, TombstoneState
from kvpool.tiers.types import Tier

log = logging.getLogger(__name__)

_REC = struct.Struct("<16sBQQQ")
_PIN = struct.Struct("<d")
_TIME = struct.Struct("<Q")         # a tombstone's time, µs
_CHUNK = 4096
SENTINEL_SCHEME = "redis+sentinel://"
_RETRY_ON = [redis.ConnectionError, redis.TimeoutError]


def _unavailable(method):
    """Redis failures that outlast the retries leave as MetadataUnavailable (UNAVAILABLE on the wire)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError) as exc:
            raise MetadataUnavailable(f"redis {self.url_for_logs}: {type(exc).__name__}: {exc}") from exc

    return wrapper


def parse_sentinel_url(url: str) -> dict:
    """redis+sentinel://[:password@]host:port[,host:port...]/service[/db][?wait_replicas=N&wait_timeout_ms=M
    &failover_timeout_s=S] -> {"sentinels", "service", "db", "password", "wait_replicas", "wait_timeout_ms",
    "failover_timeout_s"}; ValueError naming what is wrong."""
    parts = urlsplit(url)
    hosts = parts.netloc.rsplit("@", 1)[-1]
    password = unquote(parts.netloc.rsplit("@", 1)[0].split(":", 1)[-1]) if "@" in parts.netloc else None
    sentinels = []
    for hp in filter(None, hosts.split(",")):
        host, sep, port = hp.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"redis_url: sentinel {hp!r} must be host:port ({url!r})")
        sentinels.append((host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError(f"redis_url must look like redis+sentinel://host:port[,host:port]/service[/db], got {url!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query, strict_parsing=False).items()}
    unknown = set(query) - {"wait_replicas", "wait_timeout_ms", "failover_timeout_s"}
    if unknown:
        raise ValueError(f"redis_url: unknown option(s) {sorted(unknown)} (wait_replicas, wait_timeout_ms, "
                         "failover_timeout_s)")
    try:
        out = {"sentinels": sentinels, "service": path[0], "db": int(path[1]) if len(path) == 2 else 0,
               "password": password, "wait_replicas": int(query.get("wait_replicas", 0)),
               "wait_timeout_ms": int(query.get("wait_timeout_ms", 1000)),
               "failover_timeout_s": float(query.get("failover_timeout_s", 15.0))}
    except ValueError:
        raise ValueError(f"redis_url: wait_replicas / wait_timeout_ms must be integers, failover_timeout_s a "
                         f"number, got {parts.query!r}") from None
    if out["wait_replicas"] < 0 or out["wait_timeout_ms"] <= 0 or not 0 < out["failover_timeout_s"] < math.inf:
        raise ValueError(f"redis_url: wait_replicas >= 0, wait_timeout_ms > 0, failover_timeout_s > 0, "
                         f"got {parts.query!r}")
    return out


class RedisMetadata:
    """MetadataBackend over redis-server. `url` like redis://127.0.0.1:6379/0."""

    persistent = True

    def __init__(self, url: str, *, prefix: str = "kvpool", timeout: float = 5.0) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://", SENTINEL_SCHEME)):
            raise ValueError(f"redis_url must look like redis://host:port/db or "
                             f"redis+sentinel://host:port[,host:port]/service[/db], got {url!r}")
        if not prefix or ":" in prefix:
            raise ValueError(f"prefix must be a non-empty string without ':', got {prefix!r}")
        self.url = url
        self.url_for_logs = url.split("@")[-1]
        self._p = prefix
        self._wait_replicas = 0
        self._wait_timeout_ms = 0
        if url.startswith(SENTINEL_SCHEME):
            from redis.sentinel import Sentinel

            cfg = parse_sentinel_url(url)
            self._wait_replicas, self._wait_timeout_ms = cfg["wait_replicas"], cfg["wait_timeout_ms"]
            # Through a fail-over: reconnect (asking the sentinels where the master is now) with a back-off of up to
            # 0.5 s, for about failover_timeout_s.
            retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), math.ceil(cfg["failover_timeout_s"] / 0.5) + 4)
            self._sentinel = Sentinel(cfg["sentinels"], socket_timeout=timeout, socket_connect_timeout=timeout,
                                      sentinel_kwargs={"socket_timeout": timeout})
            self._r = self._sentinel.master_for(cfg["service"], db=cfg["db"], password=cfg["password"],
                                                socket_timeout=timeout, socket_connect_timeout=timeout,
                                                decode_responses=False, retry=retry, retry_on_error=_RETRY_ON)
        else:
            self._sentinel = None
            self._r = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                           decode_responses=False)
        self._r.ping()  # fail at start, naming the URL, rather than on the first commit
        self._nodes_key = f"{prefix}:nodes"
        self._endpoints_key = f"{prefix}:endpoints"
        self._secret_key = f"{prefix}:secret"
        self._tomb_keys = f"{prefix}:tomb:keys"
        self._tomb_ns = f"{prefix}:tomb:ns"
        self._tomb_floor = f"{prefix}:tomb:floor"
        self._tomb_tkeys = f"{prefix}:tomb:tkeys"
        self._tomb_buckets = f"{prefix}:tomb:buckets"

    def _obj_key(self, node_id: str) -> str:
        return f"{self._p}:obj:{node_id}"

    def _replicated(self) -> None:
        """With wait_replicas: the writes so far reached that many replicas (WAIT), else MetadataUnavailable."""
        if self._wait_replicas:
            n = self._r.wait(self._wait_replicas, self._wait_timeout_ms)
            if n < self._wait_replicas:
                raise MetadataUnavailable(f"redis {self.url_for_logs}: a write reached {n} of {self._wait_replicas} "
                                          f"replica(s) within {self._wait_timeout_ms} ms (wait_replicas)")

    # ---------------------------------------------------------------- objects
    @_unavailable
    def put_objects(self, records: Iterable[ObjectRecord]) -> None:
        by_node: dict[str, dict[bytes, bytes]] = defaultdict(dict)
        for r in records:
            value = _REC.pack(r.ns_digest, int(r.tier), r.offset, r.size, r.checksum)
            by_node[r.node_id][bytes(r.key)] = value + _PIN.pack(r.pinned_until) if r.pinned_until else value
        if not by_node:
            return
        pipe = self._r.pipeline(transaction=False)
        for node_id, mapping in by_node.items():
            items = list(mapping.items())
            for i in range(0, len(items), _CHUNK):
                pipe.hset(self._obj_key(node_id), mapping=dict(items[i:i + _CHUNK]))
        pipe.execute()
        self._replicated()

    @_unavailable
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
        self._replicated()

    @_unavailable
    def load_objects(self) -> list[ObjectRecord]:
        out: list[ObjectRecord] = []
        for node_id in self._node_ids():
            for key, value in self._r.hscan_iter(self._obj_key(node_id), count=_CHUNK):
                ns, tier, offset, size, checksum = _REC.unpack_from(value)
                pin = _PIN.unpack_from(value, _REC.size)[0] if len(value) == _REC.size + _PIN.size else 0.0
                out.append(ObjectRecord(key=key, ns_digest=ns, node_id=node_id, tier=Tier(tier), offset=offset,
                                        size=size, checksum=checksum, pinned_until=pin))
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

    @_unavailable
    def put_node(self, info: NodeInfo) -> None:
        self._r.hset(self._nodes_key, info.node_id, json.dumps(info.persisted()))
        self._replicated()

    @_unavailable
    def delete_node(self, node_id: str) -> None:
        pipe = self._r.pipeline(transaction=False)
        pipe.hdel(self._nodes_key, node_id)
        pipe.hdel(self._endpoints_key, node_id)
        pipe.unlink(self._obj_key(node_id))
        pipe.execute()
        self._replicated()

    @_unavailable
    def delete_node_objects(self, node_id: str) -> None:
        """Every object record of a node, in one call (its hash): a node that left or restarted."""
        self._r.unlink(self._obj_key(node_id))
        self._replicated()

    @_unavailable
    def load_nodes(self) -> list[NodeInfo]:
        known = {f.name for f in dataclasses.fields(NodeInfo)}
        nodes = []
        for _, v in sorted(self._r.hgetall(self._nodes_key).items()):
            stored = json.loads(v)
            # fields a newer master stored that this version does not know are dropped (a rollback keeps working)
            nodes.append(NodeInfo(**{k: x for k, x in stored.items() if k in known}))
        return nodes

    # ---------------------------------------------------------------- removal tombstones
    @_unavailable
    def put_tombstones(self, changes: TombstoneChanges) -> None:
        """One pipeline: deletions, upserts (a fold slot's time only grows), then the floor."""
        pipe = self._r.pipeline(transaction=False)
        for name, gone, upserts in ((self._tomb_keys, changes.gone_keys, changes.keys),
                                    (self._tomb_ns, changes.gone_namespaces, changes.namespaces),
                                    (self._tomb_tkeys, changes.gone_scoped, changes.scoped),
                                    (self._tomb_buckets, (), changes.buckets)):
            gone = list(gone)
            for i in range(0, len(gone), _CHUNK):
                pipe.hdel(name, *gone[i:i + _CHUNK])
            items = [(k, _TIME.pack(t)) for k, t in upserts.items()]
            for i in range(0, len(items), _CHUNK):
                pipe.hset(name, mapping=dict(items[i:i + _CHUNK]))
        if changes.floor is not None:
            pipe.set(self._tomb_floor, changes.floor)
        pipe.execute()
        self._replicated()

    @_unavailable
    def load_tombstones(self) -> TombstoneState:
        state = TombstoneState()
        for name, table in ((self._tomb_keys, state.keys), (self._tomb_ns, state.namespaces),
                            (self._tomb_tkeys, state.scoped), (self._tomb_buckets, state.buckets)):
            for k, v in self._r.hscan_iter(name, count=_CHUNK):
                table[k] = _TIME.unpack(v)[0]
        floor = self._r.get(self._tomb_floor)
        state.floor = int(floor) if floor is not None else 0
        return state

    @_unavailable
    def put_node_endpoint(self, node_id: str, data: bytes) -> None:
        """Extra per-node bytes the master server needs to route clients (addresses, host id)."""
        self._r.hset(self._endpoints_key, node_id, data)
        self._replicated()

    @_unavailable
    def load_node_endpoints(self) -> dict[str, bytes]:
        return {k.decode(): v for k, v in self._r.hgetall(self._endpoints_key).items()}

    @_unavailable
    def shared_secret(self) -> bytes:
        """The pool's token secret: created once, then the same for every master that uses this Redis."""
        self._r.set(self._secret_key, secrets.token_bytes(32), nx=True)
        self._replicated()
        return self._r.get(self._secret_key)

    def close(self) -> None:
        self._r.close()
        if self._sentinel is not None:
            for s in self._sentinel.sentinels:
                s.close()
