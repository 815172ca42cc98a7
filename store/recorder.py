"""Traffic recorder: the master's lookups and puts, captured under its lock at the cost of one deque append, written
to rolling Parquet files (store/traffic.py) by a writer thread that never takes the master's lock.

    Master.lookup / put_start ──(lock held)── recorder.lookup(...) / recorder.put(...)   append one tuple
                                                        │  deque (bounded: max_buffered_rows, then rows are
                                                        ▼  dropped and counted, never blocking the master)
    writer thread ──every flush_s── TrafficWriter.record(...) ── traffic-<UTC>-<seq>.parquet in `directory`

Off costs nothing: the master holds `recorder = None` and checks that one attribute. What a row holds: the keys the
master indexed (with tenants, the stored keys, already opaque), as 64-bit ids; hits and hits per tier; tokens. No KV
bytes, no token ids. Ops: `lookup` (a read under a lease: the pool's policy saw a use), `probe` (a lookup without a
lease: `lookup_prefix`, no policy touch), `put` (a put_start: the chain offered, `hits` = keys granted). The row's
time is the master clock's, made strictly increasing in call order (+1 us on a tie or a clock step back), so a
reader that sorts by time replays the calls in the order the master saw them: a replay through the master's own code
(kvpool/planner.py) at the pool's capacity and policy then makes the same decisions and gets the same hits.

The recording ends after `duration_s` (0 = when stopped) or at `stop()`; the files are complete once `stop()`
returns (or `done` is set). pyarrow is imported only when a recording starts.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

log = logging.getLogger(__name__)

OP_LOOKUP, OP_PROBE, OP_PUT = "lookup", "probe", "put"      # = store/traffic.py's (which imports pyarrow)
DEFAULT_MAX_FILE_BYTES = 64 << 20
MAX_BUFFERED_ROWS = 1 << 20


@dataclass(slots=True)
class RecordingStatus:
    """What StartRecording / StopRecording answer (and `kvpool trace record` prints)."""

    recording: bool = False
    directory: str = ""
    files: list[str] = field(default_factory=list)   # files closed so far (complete, readable)
    rows: int = 0                                     # rows written to files
    dropped: int = 0                                  # rows lost because the writer fell behind (buffer full)
    duration_s: float = 0.0                           # 0 = until stopped
    elapsed_s: float = 0.0
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_files: int = 0

    def as_dict(self) -> dict:
        return {"recording": self.recording, "directory": self.directory, "files": list(self.files),
                "rows": self.rows, "dropped": self.dropped, "duration_s": self.duration_s,
                "elapsed_s": round(self.elapsed_s, 3), "max_file_bytes": self.max_file_bytes,
                "max_files": self.max_files}


def check_values(max_file_bytes, duration_s, max_files) -> None:
    """The numeric arguments of a recording (ValueError naming the field); no side effect (config files use it)."""
    if isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int) or max_file_bytes < 1:
        raise ValueError(f"max_file_bytes must be an int >= 1 (bytes per file before it rolls), got {max_file_bytes!r}")
    if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not 0 <= duration_s < math.inf:
        raise ValueError(f"duration_s must be a number of seconds >= 0 (0 = until stopped), got {duration_s!r}")
    if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 0:
        raise ValueError(f"max_files must be an int >= 0 (0 = keep every file), got {max_files!r}")


def check_args(directory, max_file_bytes, duration_s, max_files) -> Path:
    """Validate a recording's arguments (ValueError naming the field) and that `directory` is writable (created if
    missing). Nothing else is touched."""
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise ValueError(f"directory must be a non-empty path, got {directory!r}")
    check_values(max_file_bytes, duration_s, max_files)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError("directory: recording traffic needs pyarrow on the master: pip install 'kvpool[trace]'") \
            from None
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".kvpool-write-check-{os.getpid()}-{threading.get_ident()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"directory {str(path)!r} is not writable by the master: {exc.strerror or exc}") from None
    return path


class Recorder:
    """One recording. `lookup` / `put` are called by the master with its lock held; everything else is not."""

    def __init__(self, directory, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, duration_s: float = 0.0,
                 max_files: int = 0, flush_s: float = 0.5, max_buffered_rows: int = MAX_BUFFERED_ROWS,
                 on_end: Callable[["Recorder"], None] | None = None) -> None:
        """Validates (ValueError naming the field) before anything starts; `start()` starts the writer thread.
        `on_end(recorder)` runs in the writer thread when the duration is over (the master detaches it)."""
        path = check_args(directory, max_file_bytes, duration_s, max_files)
        from kvpool.store.traffic import TrafficWriter

        self.status = RecordingStatus(recording=True, directory=str(path), duration_s=float(duration_s),
                                      max_file_bytes=max_file_bytes, max_files=max_files)
        self._writer = TrafficWriter(path, max_file_bytes=max_file_bytes, max_files=max_files)
        self._rows: collections.deque = collections.deque()
        self._max_rows = max_buffered_rows
        self._last_us = 0
        self._flush_s = flush_s
        self._on_end = on_end
        self._stop = threading.Event()
        self.done = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="kvpool-recorder", daemon=True)

    def start(self) -> "Recorder":
        self._started = time.monotonic()
        self._thread.start()
        log.info("recording traffic to %s (duration %s, files of %d bytes)", self.status.directory,
                 f"{self.status.duration_s:g}s" if self.status.duration_s else "until stopped",
                 self.status.max_file_bytes)
        return self

    # ------------------------------------------------------------------ the master's side (lock held: append only)

    def _stamp(self, now: float) -> int:
        us = int(now * 1e6)
        if us <= self._last_us:
            us = self._last_us + 1
        self._last_us = us
        return us

    def lookup(self, now: float, ns, keys: Sequence[bytes], hit_tiers: list[int], leased: bool) -> None:
        """`hit_tiers`: the tier of each leading hit (the master's own list; only read later)."""
        if len(self._rows) >= self._max_rows:
            self.status.dropped += 1
            return
        self._rows.append((OP_LOOKUP if leased else OP_PROBE, self._stamp(now), ns, keys, hit_tiers))

    def put(self, now: float, ns, keys: Sequence[bytes], results: list) -> None:
        """`results`: put_start's PutStartResult list (granted ones carry their tier; only read later)."""
        if len(self._rows) >= self._max_rows:
            self.status.dropped += 1
            return
        self._rows.append((OP_PUT, self._stamp(now), ns, keys, results))

    # ------------------------------------------------------------------ writer thread

    def _run(self) -> None:
        deadline = self._started + self.status.duration_s if self.status.duration_s else math.inf
        try:
            while not self._stop.wait(min(self._flush_s, max(0.0, deadline - time.monotonic()))):
                self._drain()
                if time.monotonic() >= deadline:
                    if self._on_end is not None:
                        self._on_end(self)       # detached: no new rows after this
                    break
            self._drain()
            self._writer.close()
        except Exception:  # noqa: BLE001 - a disk problem ends the recording, never the master
            log.exception("traffic recording to %s failed; recording stopped", self.status.directory)
            if self._on_end is not None:
                self._on_end(self)
        finally:
            self._finish()

    def _drain(self) -> None:
        rows, record = self._rows, self._writer.record
        while rows:
            op, us, ns, keys, detail = rows.popleft()
            if op == OP_PUT:
                tiers = [r.grant.location.tier for r in detail if r.grant is not None]
            else:
                tiers = detail
            by_tier = (tiers.count(0), tiers.count(1), tiers.count(2)) if tiers else (0, 0, 0)
            record(op, us / 1e6, ns.digest, keys, hits=len(tiers), hits_by_tier=by_tier,
                   tokens=len(keys) * max(ns.block_tokens, 0), block_tokens=max(ns.block_tokens, 0),
                   ns_label=ns.label)
        self._writer.flush()
        self._update()

    def _update(self) -> None:
        s = self.status
        s.rows = self._writer.rows_written
        s.files = [str(f) for f in self._writer.files]
        s.elapsed_s = time.monotonic() - self._started

    def _finish(self) -> None:
        self._update()
        self.status.recording = False
        self.done.set()
        log.info("traffic recording to %s ended: %d rows in %d file(s), %d dropped", self.status.directory,
                 self.status.rows, len(self.status.files), self.status.dropped)

    def stop(self, timeout: float | None = 60.0) -> RecordingStatus:
        """End the recording (the caller has detached it from the master first) and wait for the files."""
        self._stop.set()
        if self._thread.ident is None:      # never started: drain here
            self._drain()
            self._writer.close()
            self._finish()
        else:
            self._thread.join(timeout)
        return self.status


__all__ = ["Recorder", "RecordingStatus", "check_args", "check_values", "OP_LOOKUP", "OP_PROBE", "OP_PUT",
           "DEFAULT_MAX_FILE_BYTES"]
