"""Tenants: every object belongs to one tenant, and each tenant's keys live in a key space of their own.

With authentication on, the master takes a client's tenant from its credential (store/auth), never from a request,
and stores the client's key k under

    stored = tag(tenant) || AES-128-ECB_{K(tenant)}(k)[4:]           16 bytes, like every key downstream

K(tenant) and tag(tenant) are derived from the master's token secret (one secret per pool, shared by every master
through Redis), so:
  * equal key bytes of two tenants are unrelated stored keys: a tenant-B client with tenant A's exact keys misses,
    and can neither remove nor inspect A's objects: it can only name keys of its own space;
  * nobody without the secret computes another tenant's stored keys, so a client cannot plant an SSD record that
    a node restart would re-adopt as another tenant's object (it writes its own records' headers);
  * the 4-byte tag tells which tenant an SSD record or a journalled object belongs to when it is re-adopted.
Nodes, SSD record headers, the journal and the admin commands see stored keys only; a client learns the stored keys
of its grants and hits from the replies (`record_keys`), for the SSD record headers it writes.

Tenant "" (id 0) is the unscoped space: every object when auth is off (keys stored as given, today's behaviour and
cost), and with auth on whatever belongs to no known tenant (objects from before auth was on, unknown tags); only
admins address it. With the memory metadata backend the secret, hence every stored key, is new at each master
start: SSD records re-reported after a master restart then belong to no tenant (misses, evicted as room is
needed). Use Redis (which keeps the secret) where a master restart must keep the tenants' SSD objects.

Cost: one AES call per batch plus one slice per key (~0.2 us per key in CPython); nothing with auth off.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

log = logging.getLogger(__name__)

UNSCOPED = 0
MAX_TENANTS = 0xFFFF  # the index stores the id as u16
TAG_BYTES = 4
DEFAULT_QUOTA = "*"   # the quota-table entry for every tenant not named


@dataclass(slots=True, frozen=True)
class Quota:
    """Bytes a tenant may hold (payload bytes of its objects, pending ones included); 0 = no limit."""

    dram_bytes: int = 0
    total_bytes: int = 0

    @property
    def limited(self) -> bool:
        return bool(self.dram_bytes or self.total_bytes)


@dataclass(slots=True)
class TenantCounters:
    """What happened to one tenant's puts because of its quota (cumulative since the master started)."""

    quota_evictions: int = 0     # its own objects evicted to stay within its total quota
    quota_demotions: int = 0     # its own objects moved DRAM -> SSD to stay within its DRAM quota
    no_space: int = 0            # puts refused: nothing of its own could go


class _Scope:
    __slots__ = ("tag", "_tag_array", "_enc")

    def __init__(self, secret: bytes, name: str) -> None:
        raw = name.encode()
        self.tag = hashlib.blake2b(raw, key=secret[:64], person=b"kvpool-tag", digest_size=TAG_BYTES).digest()
        self._tag_array = np.frombuffer(self.tag, dtype=np.uint8)
        key = hashlib.blake2b(raw, key=secret[:64], person=b"kvpool-scope", digest_size=16).digest()
        # ECB is the right mode here: each 16-byte key is one independent block (a keyed permutation), and one
        # encryptor serves every call (it keeps no state between blocks; the master calls under its lock).
        self._enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()

    def stored(self, keys: Sequence[bytes]) -> list[bytes]:
        # One AES call for the batch; the tag written over each block's first 4 bytes in one numpy step, so each
        # stored key is a single slice (one allocation) of one buffer.
        blocks = np.frombuffer(self._enc.update(b"".join(keys)), dtype=np.uint8).reshape(-1, 16).copy()
        blocks[:, :TAG_BYTES] = self._tag_array
        raw = blocks.tobytes()
        return [raw[i:i + 16] for i in range(0, len(raw), 16)]


class Tenants:
    """Tenant names <-> small ids, their key scopes, quotas and counters. Owned by the Master (under its lock)."""

    def __init__(self, secret: bytes, quotas: Mapping[str, Quota] | None = None) -> None:
        """`quotas`: tenant name -> Quota; the entry "*" applies to every tenant not listed."""
        if not secret:
            raise ValueError("secret: tenants need the master's token secret to derive their key spaces")
        self._secret = bytes(secret)
        self._names: list[str] = [""]
        self._ids: dict[str, int] = {"": UNSCOPED}
        self._scopes: list[_Scope | None] = [None]
        self._by_tag: dict[bytes, int] = {}
        self.counters: list[TenantCounters] = [TenantCounters()]
        quotas = dict(quotas or {})
        default = quotas.pop(DEFAULT_QUOTA, None)
        self._quotas = quotas   # an entry without limits exempts its tenant from the default
        self._default = default if default is not None and default.limited else None
        self.limited: list[Quota | None] = [None]   # per id; None = no quota
        for name in self._quotas:
            self.intern(name)

    @property
    def has_quotas(self) -> bool:
        return any(q.limited for q in self._quotas.values()) or self._default is not None

    def __len__(self) -> int:
        return len(self._names)

    def names(self) -> list[str]:
        return list(self._names)

    def intern(self, name: str) -> int:
        tid = self._ids.get(name)
        if tid is not None:
            return tid
        if not isinstance(name, str):
            raise ValueError(f"tenant: expected a name, got {name!r}")
        if len(self._names) > MAX_TENANTS:
            raise ValueError(f"tenant: more than {MAX_TENANTS} tenants in one master")
        tid = len(self._names)
        scope = _Scope(self._secret, name)
        if scope.tag in self._by_tag:
            # Isolation does not depend on the tag (the keyed permutation does); only re-adoption after a node
            # restart attributes this tenant's SSD records to the first tenant of the tag.
            log.warning("tenants %r and %r share a key tag: SSD records re-adopted after a node restart count for %r",
                        self._names[self._by_tag[scope.tag]], name, self._names[self._by_tag[scope.tag]])
        else:
            self._by_tag[scope.tag] = tid
        self._names.append(name)
        self._ids[name] = tid
        self._scopes.append(scope)
        self.counters.append(TenantCounters())
        quota = self._quotas.get(name, self._default)
        self.limited.append(quota if quota is not None and quota.limited else None)
        return tid

    def id_of(self, name: str) -> int:
        """The id of a known tenant, or -1."""
        return self._ids.get(name, -1)

    def name(self, tid: int) -> str:
        return self._names[tid]

    def stored_keys(self, tid: int, keys: Sequence[bytes]) -> Sequence[bytes]:
        """The keys `tid`'s objects are indexed under (the caller's own keys for the unscoped space)."""
        scope = self._scopes[tid]
        return keys if scope is None or not keys else scope.stored(keys)

    def owner_of(self, stored_key: bytes) -> int:
        """The tenant a stored key belongs to by its tag (UNSCOPED when no known tenant has it)."""
        return self._by_tag.get(bytes(stored_key[:TAG_BYTES]), UNSCOPED)

    def quota(self, tid: int) -> Quota | None:
        return self.limited[tid]


def parse_quotas(text: str, field: str = "tenant_quotas") -> dict[str, Quota]:
    """`acme:dram=1GiB,total=4GiB;beta:total=512MiB;*:total=1GiB` -> {tenant: Quota} ("*" = every other tenant).
    ValueError naming `field` and the entry."""
    from kvpool.store.config import parse_size

    out: dict[str, Quota] = {}
    for n, entry in enumerate(e.strip() for e in text.split(";")):
        if not entry:
            continue
        tenant, sep, limits = entry.rpartition(":")
        where = f"{field}[{n}] ({entry!r})"
        if not sep or not tenant:
            raise ValueError(f"{where}: expected TENANT:dram=SIZE,total=SIZE")
        if tenant in out:
            raise ValueError(f"{where}: tenant {tenant!r} is listed twice")
        values = {"dram": 0, "total": 0}
        for part in (p.strip() for p in limits.split(",")):
            name, eq, size = part.partition("=")
            if not eq or name not in values:
                raise ValueError(f"{where}: expected dram=SIZE and/or total=SIZE, got {part!r}")
            values[name] = parse_size(size.strip(), f"{where} {name}")
            if values[name] < 0:
                raise ValueError(f"{where}: {name} must be >= 0")
        q = Quota(dram_bytes=values["dram"], total_bytes=values["total"])
        if q.total_bytes and q.dram_bytes > q.total_bytes:
            raise ValueError(f"{where}: dram ({q.dram_bytes}) is above total ({q.total_bytes})")
        out[tenant] = q
    return out


def format_quotas(quotas: Mapping[str, Quota]) -> str:
    """The canonical text of a quota table (what `parse_quotas` reads back)."""
    return ";".join(f"{t}:dram={q.dram_bytes},total={q.total_bytes}" for t, q in sorted(quotas.items()))


__all__ = ["Tenants", "Quota", "TenantCounters", "UNSCOPED", "parse_quotas", "format_quotas"]
