"""bench/admin_evict.py end to end at a tiny size: master + node processes, the puts, the lookup prober and the admin
evict (or the node removal), its result and ratio lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "admin_evict.py"


@pytest.mark.parametrize("removal, what, a_what", [("evict", "evict", "an admin evict"),
                                                   ("node", "node removal", "a node removal")])
def test_every_object_is_taken_and_the_ratio_lines_are_printed(removal, what, a_what):
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--objects", "3000", "--removal", removal],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    for pattern in [rf"{what} \(median over rounds\): 3000 objects in \d+ ms \([\d,]+ objects/s\)",
                    rf"lookup p50 / p99 \(ms, median over rounds\): idle {n} / {n}, during the {what} {n} / {n}; "
                    rf"longest during the {what} {n} ms",
                    rf"ratio lookup p99 during {a_what} vs idle: \d+\.\d\dx \(1\.00x: .*\)",
                    rf"longest lookup during the {what}: \d+% of the {what}'s span .*"]:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)


def test_bad_arguments_are_refused_by_name():
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rounds, --objects and --size must be >= 1" in r.stderr
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "3000000", "--size", "4MiB"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--objects x --size must be at most 8 GiB" in r.stderr
    r = subprocess.run([sys.executable, str(BENCH), "--removal", "all"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "argument --removal: invalid choice: 'all'" in r.stderr
