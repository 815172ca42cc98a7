"""`kvpool trace record` / `kvpool trace stop`: have the master record its lookups and puts to Parquet files (the
input of `kvpool simulate --trace DIR`); store/recorder.py does the work, this file parses and prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

EPILOG = """\
examples:
  kvpool trace record --out /var/lib/kvpool/traffic --duration 1h           # waits, then prints the files
  kvpool trace record --out /tmp/t --duration 10m --max-file-bytes 16MiB --detach   # returns at once
  kvpool trace stop                                                        # end a recording early
  kvpool simulate --trace /var/lib/kvpool/traffic --capacity-blocks 5%,10%,25%

--out is a directory ON THE MASTER'S HOST (made absolute here when relative; created if missing; it must be
writable by the master). Files: traffic-<UTC start>-<seq>.parquet, each closed past --max-file-bytes; keys as
64-bit ids only, no KV bytes, no token ids. The master stops by itself after --duration, also if this command is
interrupted. The same recording from the start: `kvpool up|master --record-directory DIR` (--record-duration-s,
--record-max-file-bytes, --record-max-files). Needs an admin credential when authentication is on.
exit codes: 0 ok, 1 master unreachable / refused / already recording, 2 bad argument (nothing started)."""

_FLAGS = {"directory": "--out", "max_file_bytes": "--max-file-bytes", "duration_s": "--duration",
          "max_files": "--max-files"}


def register(sub) -> None:
    from kvpool.admin import add_master_args

    p = sub.add_parser("trace", help="record the master's traffic (lookups and puts) for `kvpool simulate`",
                       description="Record the master's lookups and puts to Parquet files (keys only).",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    rec = verbs.add_parser("record", help="record for a while", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    rec.add_argument("--out", required=True, metavar="DIR", help="directory on the master's host for the files")
    rec.add_argument("--duration", required=True, metavar="DURATION",
                     help="how long to record: seconds or a number with a unit (90, 90s, 10m, 2h)")
    rec.add_argument("--max-file-bytes", default="64MiB", metavar="SIZE",
                     help="close a file and start the next past this size (default 64MiB)")
    rec.add_argument("--max-files", type=int, default=0, metavar="N",
                     help="keep only the newest N files (default 0 = all)")
    rec.add_argument("--detach", action="store_true", help="return once recording started (the master stops it)")
    rec.add_argument("--no-progress", action="store_true", help="no progress bar on stderr while waiting")
    add_master_args(rec, json_help="print the recording's status as JSON")
    rec.set_defaults(func=run_record)
    stop = verbs.add_parser("stop", help="end the recording now and print its files")
    add_master_args(stop, json_help="print the recording's status as JSON")
    stop.set_defaults(func=run_stop)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _print(status: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(status))
        return
    state = "recording" if status["recording"] else "recorded"
    print(f"{state} {status['rows']} row(s) in {len(status['files'])} file(s) under {status['directory'] or '-'}"
          f" ({status['elapsed_s']:.1f}s; {status['dropped']} dropped)")
    for f in status["files"]:
        print(f"  {f}")


def run_record(args) -> int:
    from kvpool.admin import fail, parse_duration, run_admin
    from kvpool.config import parse_size

    try:
        duration = parse_duration(args.duration, "--duration")
        size = parse_size(args.max_file_bytes, "--max-file-bytes")
        if size < 1:
            raise ValueError(f"--max-file-bytes {args.max_file_bytes!r} must be at least 1 byte")
        if args.max_files < 0:
            raise ValueError(f"--max-files {args.max_files} must be >= 0 (0 = keep all)")
        if not args.out.strip():
            raise ValueError("--out must name a directory")
    except ValueError as exc:
        return fail("trace record", str(exc), 2)
    out = os.path.abspath(args.out)

    def body(admin) -> int:
        try:
            status = admin.start_recording(out, duration_s=duration, max_file_bytes=size, max_files=args.max_files)
        except ValueError as exc:   # the master's field names, said as this command's flags
            msg = str(exc)
            for field, flag in _FLAGS.items():
                if msg.startswith(field):
                    msg = flag + msg[len(field):]
            raise ValueError(msg) from None
        if args.detach:
            _print(status, args.json)
            return 0
        from tqdm import tqdm

        end = time.monotonic() + duration
        try:
            with tqdm(total=round(duration), desc="recording", unit="s", file=sys.stderr,
                      disable=args.no_progress) as bar:
                while (left := end - time.monotonic()) > 0:
                    time.sleep(min(left, 0.5))
                    bar.n = round(min(duration, duration - max(0.0, end - time.monotonic())))
                    bar.refresh()
        except KeyboardInterrupt:
            print("interrupted: stopping the recording", file=sys.stderr, flush=True)
        _print(admin.stop_recording(), args.json)
        return 0

    return run_admin("trace record", args, body)


def run_stop(args) -> int:
    from kvpool.admin import run_admin

    def body(admin) -> int:
        _print(admin.stop_recording(), args.json)
        return 0

    return run_admin("trace stop", args, body)
