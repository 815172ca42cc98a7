"""`TokenStore`: the master's (or a node's) table of accepted tokens, matched in constant time, reloaded on change.

The table never holds a token: it maps keyed-BLAKE2b-256(k, token) -> Identity, where k is 32 random bytes drawn
when the store is made, which never leaves it. `identify(token)` hashes the presented token under k and looks the
result up in a dict. That is the constant-time comparison that matters: the only steps whose time depends on secret
data are the hash-table probe and the byte comparison of keyed-hash outputs, and an attacker who does not know k
cannot relate those outputs to their guesses, so a timing difference says nothing about how close a guess is to a
real token (nor about its length: every digest is 32 bytes). The cost is one keyed hash whatever the number of
tokens. `hmac.compare_digest` against every configured token would be safe too, but its cost grows with the tenants
(bench/security.py prints `TokenStore.identify` for 3 and 1,002 tokens beside such a scan).

Reloading (rotation without restart): `identify` first asks the SourceWatch whether a check is due (one clock
read); at most every `reload_interval_s` one thread stats the token files and, if one changed, reloads the whole
table (under the same key) and swaps it in one assignment. Other calls go on with the current table meanwhile; one
whose token that table does not know waits for the check and looks again (`identify`). A reload that fails (file
missing, bad entry, duplicate token) keeps the previous table and logs an error, once per distinct error; it is
retried when a file changes again.
"""

from __future__ import annotations

import logging
import os
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
        self._key = os.urandom(32)
        # raises ValueError naming the field: a process must not start on a bad table
        self._table, texts = load_entries(config, env, key=self._key)
        self._watch = SourceWatch([s for _, s in config.sources()], interval_s=config.reload_interval_s,
                                  clock=clock, wall=wall)
        self._watch.mark(texts)
        self._lock = threading.Lock()
        self._last_error = ""
        self.version = 1  # +1 each time a reload changed the table (tests and logs read it)

    def __len__(self) -> int:
        return len(self._table)

    def tenants(self) -> set[str]:
        """The tenants the client tokens name (the master knows their key tags before their first call)."""
        return {ident.tenant for ident in self._table.values() if ident.tenant}

    def identify(self, token: str | bytes) -> Identity | None:
        """The identity `token` names, or None. Checks for changed token files first when a check is due.

        A token the table does not know waits for a check another thread is making (this call skipped it: the lock
        was taken) and, if a check is still due, makes it, then looks again: a token added to its file before the
        call is never refused because another call was reloading at that moment. Known tokens never wait."""
        if self._watch.due():
            self._maybe_reload()
        d = digest(self._key, token)
        ident = self._table.get(d)
        if ident is None and self._watch.files:
            self._maybe_reload(wait=True)
            ident = self._table.get(d)
        return ident

    def _maybe_reload(self, *, wait: bool = False) -> None:
        """Reload if a check is due and a file changed. A check another thread is making: `wait` False, this call
        goes on with the current table; True, it waits for that check (then makes its own if one is still due)."""
        if not self._lock.acquire(blocking=wait):
            return
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
            table, texts = load_entries(self.config, self._env, key=self._key)
        except ValueError as exc:
            self._watch.mark({})  # retried when a file changes again, not on every check
            if str(exc) != self._last_error:
                self._last_error = str(exc)
                log.error("token reload failed, keeping the previous %d token(s): %s", len(self._table), exc)
            return False
        self._watch.mark(texts)
        self._last_error = ""
        if table == self._table:
            return False
        self._table = table
        self.version += 1
        log.info("tokens reloaded: %d accepted (version %d)", len(table), self.version)
        return True
