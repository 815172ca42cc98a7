"""`TokenStore`: the master's (or a node's) table of accepted tokens, matched in constant time, reloaded on change.

The table holds SHA-256 digests, never the tokens. `identify(token)` hashes the presented token and compares it
with EVERY entry by `hmac.compare_digest`, keeping the match without leaving the loop early, so the time taken
says neither whether nor where a token matched (fixed-length digests also hide the token's length). The cost is one
SHA-256 plus one ~0.1 us comparison per configured token (bench/security.py measures the whole interceptor).

Reloading (rotation without restart): `identify` first asks the SourceWatch whether a check is due (one clock
read); at most every `reload_interval_s` one thread stats the token files and, if one changed, reloads the whole
table and swaps it in one assignment. A reload that fails (file missing, bad entry, duplicate token) keeps the
previous table and logs an error, once per distinct error; it is retried when a file changes again.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from typing import Callable, Mapping

from kvpool.store.auth.config import AuthConfig, Identity, digest, load_entries
from kvpool.store.auth.sources import SourceWatch

log = logging.getLogger(__name__)


class TokenStore:
    def __init__(self, config: AuthConfig, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._env = env
        entries, texts = load_entries(config, env)  # raises ValueError naming the field: the process must not start
        self._table: tuple[tuple[bytes, Identity], ...] = tuple(entries)
        self._watch = SourceWatch([s for _, s in config.sources()], interval_s=config.reload_interval_s,
                                  clock=clock, wall=wall)
        self._watch.mark(texts)
        self._lock = threading.Lock()
        self._last_error = ""
        self.version = 1  # +1 each time a reload changed the table (tests and logs read it)

    def __len__(self) -> int:
        return len(self._table)

    def identify(self, token: str | bytes) -> Identity | None:
        """The identity `token` names, or None. Checks for changed token files first when a check is due."""
        if self._watch.due():
            self._maybe_reload()
        d = digest(token)
        found = None
        for entry, ident in self._table:  # no early exit: every entry is compared
            if hmac.compare_digest(entry, d):
                found = ident
        return found

    def _maybe_reload(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # another thread is checking; this call uses the current table
        try:
            if self._watch.due() and self._watch.changed():
                self._reload_locked()
        finally:
            self._lock.release()

    def reload(self) -> bool:
        """Re-read every source now (e.g. on SIGHUP); True if the table changed. Errors keep the old table."""
        with self._lock:
            return self._reload_locked()

    def _reload_locked(self) -> bool:
        try:
            entries, texts = load_entries(self.config, self._env)
        except ValueError as exc:
            self._watch.mark({})  # retried when a file changes again, not on every check
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                log.error("token reload failed, keeping the previous %d token(s): %s", len(self._table), exc)
            return False
        self._watch.mark(texts)
        self._last_error = ""
        table = tuple(entries)
        if sorted(table, key=lambda e: e[0]) == sorted(self._table, key=lambda e: e[0]):
            return False
        self._table = table
        self.version += 1
        log.info("tokens reloaded: %d accepted (version %d)", len(table), self.version)
        return True
