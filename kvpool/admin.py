"""Admin calls of the master (stats, nodes, list, inspect, remove, evict, drain, traffic recording) as plain dicts,
and the plumbing every admin subcommand shares (`--master/--json/--timeout`, argument parsing, exit codes).

`AdminClient` is thin over MasterService: every call has a deadline and faults become PoolError subclasses.
The dicts it returns are exactly what `kvpool <command> --json` prints, so scripts and tests read one shape.

Exit codes of the admin commands (`run_admin`): 0 done; 1 the pool answered no (unreachable master, unknown key,
server error); 2 a bad argument (named in the message; nothing was sent or changed). Errors go to stderr as one
line `kvpool COMMAND: ...`, so `--json` output on stdout stays parseable.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Callable, Iterator

from kvpool.credentials import Credentials, add_credential_args, credentials_from_args
from kvpool.errors import PoolError, PoolProtocolError
from kvpool.proto import kvpool_pb2 as pb
from kvpool.rpc import MasterRpc
from kvpool.store import wire
from kvpool.store.stats import PoolStats

DEFAULT_MASTER = "127.0.0.1:50051"
UNREACHABLE_HINT = "(start one with `kvpool up`, or point --master / KVPOOL_MASTER at it)"
KEY_HEX_DIGITS = 32
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d)?\s*$")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def default_master() -> str:
    return os.environ.get("KVPOOL_MASTER") or DEFAULT_MASTER


def parse_hex16(text: str, what: str) -> bytes:
    """A 16-byte block key or namespace digest from 32 hex digits; ValueError naming `what` and the text."""
    try:
        raw = bytes.fromhex(text)
    except (ValueError, TypeError):
        raise ValueError(f"{what} {text!r} is not hex: expected {KEY_HEX_DIGITS} hex digits") from None
    if len(raw) != 16:
        raise ValueError(f"{what} {text!r} has {len(text.strip())} hex digits, expected {KEY_HEX_DIGITS}")
    return raw


def parse_duration(text: str, what: str = "--older-than") -> float:
    """'90' / '90s' / '10m' / '2h' / '1.5d' / '500ms' -> seconds (> 0); ValueError naming `what` otherwise."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{what} {text!r} is not a duration: use a number with a unit, e.g. 30s, 10m, 2h, 1d")
    seconds = float(m.group(1)) * _SECONDS[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"{what} {text!r} must be longer than 0")
    return seconds


class AdminClient:
    def __init__(self, address: str | None = None, *, timeout: float = 5.0, token=None, tls=None,
                 credentials: Credentials | None = None) -> None:
        """`token` / `tls` / `credentials`: what to present (kvpool/credentials.py; default KVPOOL_AUTH_TOKEN and
        KVPOOL_TLS_*). With authentication on, an admin (or, read-only, a viewer) credential."""
        self.address = address or default_master()
        self.timeout = timeout
        self.credentials = credentials if credentials is not None else Credentials.resolve(token, tls)
        self.rpc = MasterRpc(self.address, timeout=timeout, unavailable_hint=f" {UNREACHABLE_HINT}",
                             timeout_hint=" (--timeout)", credentials=self.credentials)

    def _call(self, name: str, request):
        return self.rpc.call(name, request)

    # ------------------------------------------------------------------ reads

    def raw_stats(self) -> dict:
        """The master's stats dict exactly as the Stats RPC ships it."""
        return json.loads(self._call("Stats", pb.StatsRequest()).json)

    def stats(self) -> dict:
        """`raw_stats()` plus the derived hit rates (PoolStats.with_hit_rates): what `kvpool stats|status --json`
        print."""
        raw = self.raw_stats()
        try:
            return PoolStats.from_dict(raw).with_hit_rates(raw)
        except ValueError as exc:  # the master's fault, not the caller's: exit 1, not 2
            raise PoolProtocolError(f"the master at {self.address} sent stats this kvpool cannot read: {exc}") from None

    def nodes(self, stats: dict | None = None) -> list[dict]:
        """One row per registered node, by id: addresses, state, and objects/bytes/capacity of each tier it has."""
        stats = self.raw_stats() if stats is None else stats
        endpoints = stats.get("endpoints", {})
        # A node being drained (`kvpool drain`, moving its objects away) is listed under "draining" until it leaves;
        # one that registered and is still reporting its SSD records (nothing placed on it yet) under "reporting".
        draining = set(stats.get("draining", ()))
        reporting = set(stats.get("reporting", ()))
        rows = []
        for node_id, tiers in sorted(stats.get("nodes", {}).items()):
            ep = endpoints.get(node_id, {})
            rows.append({"node": node_id, "address": ep.get("control_address", ""),
                         "data_address": ep.get("data_address", ""),
                         "state": "draining" if node_id in draining else
                                  "reporting" if node_id in reporting else "alive",
                         "dram_pages": ep.get("dram_pages", ""),
                         "tiers": {t: dict(tiers[t]) for t in sorted(tiers, key=_tier_order)}})
        return rows

    def list(self, *, namespace: str = "", limit: int = 0, page: int = 1000, tenant: str = "") -> Iterator[dict]:
        """Committed objects in (stored) key order, paginated; `limit` 0 = all; `tenant`: only its objects."""
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"--limit {limit!r} must be an integer >= 0 (0 = all)")
        ns = parse_hex16(namespace, "--namespace") if namespace else b""
        start, n = b"", 0
        while True:
            reply = self._call("List", pb.ListRequest(namespace=ns, start_after=start, limit=page, tenant=tenant))
            for o in reply.objects:
                yield wire.object_row(o)
                n += 1
                if limit and n >= limit:
                    return
            if not reply.next_start_after:
                return
            start = reply.next_start_after

    def inspect(self, keys_hex: list[str]) -> list[dict | None]:
        """One row per key (None = not in the pool)."""
        keys = [parse_hex16(k, "KEY") for k in keys_hex]
        reply = self._call("Inspect", pb.InspectRequest(keys=keys))
        found = iter(reply.objects)
        return [wire.object_row(next(found)) if ok else None for ok in reply.found]

    # ------------------------------------------------------------------ changes

    def remove(self, keys_hex: list[str]) -> int:
        keys = [parse_hex16(k, "KEY") for k in keys_hex]
        return self._call("Remove", pb.RemoveRequest(keys=keys)).removed

    def evict(self, *, namespace: str = "", older_than_s: float | None = None, everything: bool = False) -> int:
        """Evict committed objects of one namespace and/or not put or hit for `older_than_s` seconds, or, with
        `everything` (and no filter), every object. Objects being read right now (leased) are skipped. Counted in
        stats()["evictions"]."""
        ns = parse_hex16(namespace, "--namespace") if namespace else b""
        if older_than_s is not None and not older_than_s > 0:
            raise ValueError(f"--older-than must be longer than 0 seconds, got {older_than_s!r}")
        if everything:
            if ns or older_than_s is not None:
                raise ValueError("--all evicts everything: give it without --namespace or --older-than")
            return self._call("Evict", pb.EvictRequest(all=True)).evicted
        if not ns and older_than_s is None:
            raise ValueError("give --namespace and/or --older-than, or --all to evict everything")
        request = pb.EvictRequest(namespace=ns, idle_seconds=older_than_s or 0.0)
        return self._call("Evict", request).evicted

    def drain(self, node_id: str, *, migrate: bool = True, deadline_s: float = 120.0) -> dict:
        """Take a node out of the pool: move its objects to the other nodes first (`migrate`, kvpool/drain.py; the
        bytes pass through this process), then remove it. Returns {"node", "moved", "dropped", "no_room", "failed",
        "passes"}: `dropped` objects were still on the node when it left (misses from now on)."""
        from kvpool.drain import DrainResult, drain
        if not isinstance(node_id, str) or not node_id:
            raise ValueError(f"NODE must be a non-empty node id, got {node_id!r}")
        if not migrate:
            dropped = self._call("DrainNode", pb.DrainNodeRequest(node_id=node_id)).objects_dropped
            return DrainResult(node_id, dropped=dropped).as_dict()
        from kvpool.client import PoolClient

        self._call("BeginDrain", pb.BeginDrainRequest(node_id=node_id))  # unknown node / no master: this error
        with PoolClient(self.address, timeout=self.timeout, connect_timeout=self.timeout,
                        credentials=self.credentials) as client:
            try:
                return drain(client, node_id, deadline_s=deadline_s).as_dict()
            except PoolError as exc:
                raise PoolError(f"drain of {node_id} at {self.address} stopped: {exc}") from None

    def start_recording(self, directory: str, *, duration_s: float, max_file_bytes: int | None = None,
                        max_files: int = 0) -> dict:
        """Have the master record its lookups and puts to Parquet files in `directory` (a path on the MASTER's host)
        for `duration_s` seconds (0 = until `stop_recording`). Returns the recording's status dict."""
        request = pb.StartRecordingRequest(directory=directory, duration_s=duration_s, max_files=max_files)
        if max_file_bytes is not None:
            request.max_file_bytes = max_file_bytes
        return wire.recording_row(self._call("StartRecording", request))

    def stop_recording(self) -> dict:
        """End the master's recording (if any) once its files are complete; the final status dict (or the last
        recording's, `recording` false)."""
        return wire.recording_row(self._call("StopRecording", pb.StopRecordingRequest()))

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tier_order(label: str) -> int:
    order = ("hbm", "dram", "ssd")
    return order.index(label) if label in order else len(order)


# ---------------------------------------------------------------------- CLI plumbing shared by the admin commands

def add_master_args(p, *, timeout: float = 5.0, json_help: str = "print JSON (for scripts) instead of a table"):
    p.add_argument("--master", default=default_master(), metavar="HOST:PORT",
                   help=f"the kvpool master to ask (default: $KVPOOL_MASTER, else {DEFAULT_MASTER})")
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument("--timeout", type=float, default=timeout, metavar="S",
                   help=f"seconds to wait for the master's answer (default {timeout:g})")
    add_credential_args(p)


def run_admin(name: str, args, body: Callable[[AdminClient], int]) -> int:
    """Run `body(admin)` against args.master with the exit-code contract of this module's docstring."""
    if not args.timeout > 0:
        return fail(name, f"--timeout {args.timeout!r} must be > 0 seconds", 2)
    try:
        with AdminClient(args.master, timeout=args.timeout, credentials=credentials_from_args(args)) as admin:
            return int(body(admin) or 0)
    except ValueError as exc:
        return fail(name, str(exc), 2)
    except PoolError as exc:
        return fail(name, str(exc), 1)


def fail(name: str, message: str, code: int) -> int:
    print(f"kvpool {name}: {message}", file=sys.stderr, flush=True)
    return code


def human_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def percent(rate: float | None) -> str:
    return "—" if rate is None else f"{100 * rate:.1f}%"
