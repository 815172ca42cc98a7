"""Grant and lease tokens: what lets a node check, without asking the master, that a remote writer or reader
was given exactly this extent.

The master hands every node a secret at registration and signs each write grant / read location with it:

    token = HMAC-SHA256(secret, kind | id | tier | offset | size | expires_unix_ms)[:16]

kind is b"W" (write grant, id = grant_id) or b"R" (read lease, id = lease_id). The node recomputes the MAC from
the request's own fields, so a writer that changes offset, size, tier or expiry gets PERMISSION_DENIED, and so
does one whose grant has expired. 16 bytes of an HMAC-SHA256 is ample against forgery and keeps frames small.
Same-host clients that map the arena are trusted at the host level and bypass tokens (they could write the
file anyway).

Write grants to a node that says `write_keys` (nodes since 2026-12-07) are signed with a key of its registration
instead (`NodeState.write_key`, random, handed to it as RegisterNodeResponse.write_key): new whenever the master
starts tracking the node afresh, i.e. when the node process restarted, when the master had dropped it, and when the
master process itself restarted (on Redis too, whose shared secret stays). A writer that stalled across such a
change holds a grant of an extent that the master now places from scratch, perhaps under another object already
committed; its write is refused there, and that object stays whole. A node that registers again with the master
that still knows it (the same process, told to register again) keeps its key: grants given meanwhile stay good.
Read tokens keep the shared secret: a restarted master's reads are served before its nodes have found it (a stale
read is harmless, every read is checked against its checksum), and it places nothing on a node until then. A
staged write (SSD, HBM) is checked again when its last byte has arrived, before it is written.
"""

from __future__ import annotations

import hmac
import struct
import time

TOKEN_BYTES = 16
WRITE = b"W"
READ = b"R"
_FIELDS = struct.Struct("<cQBQQQ")


class TokenError(Exception):
    """A token is forged, used outside its extent, or expired. Maps to PERMISSION_DENIED."""


def now_ms() -> int:
    return int(time.time() * 1000)


def sign(secret: bytes, kind: bytes, ident: int, tier: int, offset: int, size: int, expires_ms: int) -> bytes:
    msg = _FIELDS.pack(kind, ident, tier, offset, size, expires_ms)
    return hmac.digest(secret, msg, "sha256")[:TOKEN_BYTES]


def verify(secret: bytes, kind: bytes, ident: int, tier: int, offset: int, size: int, expires_ms: int,
           token: bytes, *, now: int | None = None) -> None:
    """Raise TokenError (naming the field) unless `token` signs exactly these fields and has not expired."""
    if len(token) != TOKEN_BYTES:
        raise TokenError(f"token: expected {TOKEN_BYTES} bytes, got {len(token)}")
    expected = sign(secret, kind, ident, tier, offset, size, expires_ms)
    if not hmac.compare_digest(expected, token):
        raise TokenError("token: does not match the grant (forged, or offset/size/tier/expiry altered)")
    if (now_ms() if now is None else now) > expires_ms:
        raise TokenError(f"expires_unix_ms: {'grant' if kind == WRITE else 'lease'} expired")
