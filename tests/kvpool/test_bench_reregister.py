"""bench/reregister.py at a tiny size: the puts, the registration again with the lookup prober, every object
published to the node again and nothing dropped, its ratio lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "reregister.py"


def test_every_object_is_published_again_and_the_ratio_lines_are_printed():
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--objects", "3000"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    for pattern in [rf"registration \(median over rounds\): answered in {n} ms, every object published again in "
                    rf"{n} s; 3,064 of the 3,064 objects it holds published to the node, feed entries dropped 0",
                    rf"lookup p50 / p99 \(ms, median over rounds\): idle {n} / {n}, during {n} / {n}; longest "
                    rf"during {n} ms",
                    r"ratio RegisterNode answer vs the node's RPC deadline \(5 s\): \d+\.\d{4}x \(at or above .*\)",
                    r"ratio objects published to the node's host index again vs held: 1\.0000x \(1\.0000x: .*\)"]:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)


def test_bad_arguments_are_refused_by_name():
    r = subprocess.run([sys.executable, str(BENCH), "--rounds", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rounds, --objects and --size must be >= 1" in r.stderr
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "3000000"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--objects x --size must be at most 8 GiB" in r.stderr
