"""Where secrets come from: `file:PATH` or `env:NAME`, never a literal value, and noticing when a file changes.

A token in a config value ends up in shell history, in `ps` (flags), in `kvpool config check --json` output and in
crash reports; a path or a variable name does not. So every credential setting is a *source*:

    file:/etc/kvpool/admin.token     re-read when the file changes (rotation without restart)
    env:KVPOOL_ADMIN_TOKEN           read once: a process's environment does not change under it

`SourceWatch` decides cheaply whether any file source changed: at most one `os.stat` per file per
`interval_s` (the caller's clock), comparing (device, inode, size, mtime_ns). File mtimes come from the kernel's
coarse clock (a few ms), so two same-size writes in one tick look identical; a file whose mtime is less than
`RACY_S` old is therefore "racily clean" (git's term) and is re-read and compared by content until it ages. Replace
token files atomically (write a temporary file, then rename; Kubernetes Secret volumes swap a symlink), so a
reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

RACY_S = 2.0


@dataclass(slots=True, frozen=True)
class Source:
    """One parsed `file:PATH` / `env:NAME` setting; `field` names it in errors (e.g. "node_tokens[1]")."""

    kind: str   # "file" | "env"
    where: str  # the path or the variable name
    field: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.where}"


def parse_source(text: object, field: str) -> Source:
    """`file:PATH` or `env:NAME` -> Source; anything else is refused without echoing it (it may be a secret)."""
    if not isinstance(text, str):
        raise ValueError(f"{field}: expected file:PATH or env:NAME, got a {type(text).__name__}")
    kind, sep, where = text.strip().partition(":")
    if sep and kind == "file" and where:
        return Source("file", where, field)
    if sep and kind == "env" and where and all(c.isalnum() or c == "_" for c in where):
        return Source("env", where, field)
    raise ValueError(f"{field}: expected file:PATH or env:NAME (the value is not shown: it may be a secret); "
                     "put tokens in a file or an environment variable, never in a config value or on a command line")


def read_source(src: Source, env: Mapping[str, str] | None = None) -> str:
    """The text behind a source; ValueError naming the field if the file or the variable is missing."""
    if src.kind == "env":
        value = (os.environ if env is None else env).get(src.where)
        if value is None:
            raise ValueError(f"{src.field}: environment variable {src.where} is not set")
        return value
    try:
        with open(src.where, "rb") as f:
            data = f.read(1 << 20)
    except FileNotFoundError:
        raise ValueError(f"{src.field}: file {src.where} not found") from None
    except OSError as exc:
        raise ValueError(f"{src.field}: cannot read {src.where}: {exc.strerror}") from None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{src.field}: {src.where} is not ASCII text") from None


def _stamp(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class SourceWatch:
    """Tells whether the file sources changed since `mark()`; stats them at most once per `interval_s`.

    `due()` is the per-call check (one clock read while not due). `changed()` stats, and re-reads racily clean
    files. `mark(contents)` records what was last loaded. Not thread-safe: the owner serialises calls to
    `changed()`/`mark()` (see TokenStore), `due()` may race harmlessly.
    """

    def __init__(self, sources: Sequence[Source], *, interval_s: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.files = [s for s in sources if s.kind == "file"]
        self.interval_s = interval_s
        self._clock = clock
        self._wall = wall
        self._next = clock() + interval_s
        self._stamps: list[tuple[int, int, int, int] | None] = [None] * len(self.files)
        self._digests: list[bytes] = [b""] * len(self.files)

    def due(self) -> bool:
        return bool(self.files) and self._clock() >= self._next

    def mark(self, contents: Mapping[Source, str]) -> None:
        """Remember the stamp and content digest of every file as just loaded (`contents[src]` = its text)."""
        for i, src in enumerate(self.files):
            self._stamps[i] = _stamp(src.where)
            text = contents.get(src)
            self._digests[i] = hashlib.sha256(text.encode()).digest() if text is not None else b""
        self._next = self._clock() + self.interval_s

    def changed(self) -> bool:
        self._next = self._clock() + self.interval_s
        wall_ns = int(self._wall() * 1e9)
        for i, src in enumerate(self.files):
            stamp = _stamp(src.where)
            if stamp != self._stamps[i]:
                return True
            if stamp is not None and wall_ns - stamp[3] < RACY_S * 1e9:
                try:
                    with open(src.where, "rb") as f:
                        if hashlib.sha256(f.read(1 << 20)).digest() != self._digests[i]:
                            return True
                except OSError:
                    return True
        return False
