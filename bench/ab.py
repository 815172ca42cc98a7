"""Run one benchmark on two builds, interleaved, and print their ratio lines side by side.

A refactor or an optimisation is judged against the build before it on the same machine in the same run: this
runner alternates A and B (A B A B ...), so a noisy neighbour hits both builds alike. Each build runs its OWN copy
of the benchmark script (`<root>/<script>`) under its OWN interpreter (a venv whose editable kvpool is that tree):

    git worktree add /tmp/base <old-commit>; python3 -m venv --system-site-packages /tmp/base-venv
    /tmp/base-venv/bin/pip install --no-deps -e /tmp/base
    python bench/ab.py --a /tmp/base-venv/bin/python:/tmp/base --b python3:. --rounds 3 -- bench/pool_local.py ...

Lines matching --match (default: any line with a ratio such as "0.96x" or "12.2x") are printed per run, prefixed
with the build and round; everything else goes to the log file next to the output (--log).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from tqdm import tqdm


def parse_build(text: str) -> tuple[str, str]:
    python, sep, root = text.partition(":")
    if not sep or not python or not root:
        raise argparse.ArgumentTypeError(f"expected PYTHON:ROOT, got {text!r}")
    return python, os.path.abspath(root)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=parse_build, required=True, metavar="PYTHON:ROOT", help="the build before")
    ap.add_argument("--b", type=parse_build, required=True, metavar="PYTHON:ROOT", help="the build after")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--match", default=r"\d\.\d+x\b|\d+(\.\d+)?x faster|/s\b", help="regex of the lines to print")
    ap.add_argument("--log", default="/tmp/kvpool-ab.log")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("script", help="benchmark script, relative to each build's root")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments after --")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    bench_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    pattern = re.compile(args.match)
    results: list[tuple[str, int, list[str]]] = []
    plan = [(name, r) for r in range(args.rounds) for name in ("A", "B")]
    with open(args.log, "a") as log:
        for name, r in tqdm(plan, desc=f"ab {args.script}", unit="run"):
            python, root = args.a if name == "A" else args.b
            env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
            start = time.monotonic()
            proc = subprocess.run([python, os.path.join(root, args.script), *bench_args], cwd=root, env=env,
                                  capture_output=True, text=True, timeout=args.timeout)
            log.write(f"===== {name} round {r} ({python} {root}) rc={proc.returncode} "
                      f"{time.monotonic() - start:.0f}s\n{proc.stdout}\n{proc.stderr[-4000:]}\n")
            if proc.returncode != 0:
                print(f"{name} round {r} failed (rc {proc.returncode}); see {args.log}", file=sys.stderr)
            results.append((name, r, [ln for ln in proc.stdout.splitlines() if pattern.search(ln)]))
    for name, r, lines in results:
        for ln in lines:
            print(f"{name}{r} | {ln}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
