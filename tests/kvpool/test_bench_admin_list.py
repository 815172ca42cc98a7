"""bench/admin_list.py at a tiny size: the puts, the lookup prober and the admin listing, its result and ratio lines,
and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "admin_list.py"


def test_every_page_is_listed_and_the_ratio_lines_are_printed():
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--objects", "3000", "--pages", "3",
                          "--limit", "500"], capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    for pattern in [rf"list \(median over rounds\): 3 pages of 500 from 3,000 objects, {n} ms a page \(max {n} ms\), "
                    r"1,500 listed",
                    rf"lookup p50 / p99 \(ms, median over rounds\): idle {n} / {n}, during the listing {n} / {n}; "
                    rf"longest during the listing {n} ms",
                    r"ratio lookup p99 during an admin listing vs idle: \d+\.\d\dx \(1\.00x: .*\)",
                    r"longest lookup during the listing: \d+% of a page's time .*"]:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)


def test_bad_arguments_are_refused_by_name():
    r = subprocess.run([sys.executable, str(BENCH), "--pages", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rounds, --objects, --size, --pages and --limit must be >= 1" in r.stderr
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "3000000"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--objects x --size must be at most 8 GiB" in r.stderr
