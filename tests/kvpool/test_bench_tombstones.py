"""bench/tombstones.py at a tiny size: the purge, the report, its result and ratio lines, and its arguments refused by
name."""

import pathlib
import re
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "tombstones.py"


def test_every_removed_key_is_refused_and_the_ratio_lines_are_printed():
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--records", "2000", "--removed", "3000",
                          "--per-call", "100", "--limit", "1000"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    for pattern in [r"kept \(median over rounds\): [\d,]+ of 2,000 records of keys never removed \([\d.]+%\); the "
                    r"slots' bound exp\(-2,[\d,]+ / 1,048,576\) [\d.]+%; one floor \(before 2026-12-06\) 0",
                    r"removed keys refused \(every round\): 3,000 of 3,000",
                    rf"remove call with a fold in it \(under the master's lock\): median {n} ms; longest call {n} ms "
                    rf"\(the interpreter's garbage collector included\); report {n} us per record; peak memory {n} MiB",
                    r"ratio records of keys never removed kept after a purge of 3,000: [\d.]+% with slots vs 0\.0% "
                    r"with one floor; \d\.\d\dx the slots' bound"]:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)


def test_bad_arguments_are_refused_by_name():
    r = subprocess.run([sys.executable, str(BENCH), "--per-call", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--rounds, --records, --removed, --per-call and --limit must be >= 1" in r.stderr
