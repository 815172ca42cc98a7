"""bench/index_growth.py at a small size: its lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

from kvpool.store.keytable import native_available

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "index_growth.py"


def test_the_puts_and_the_doubling_at_once_are_measured_and_the_ratio_lines_are_printed():
    out = subprocess.run([sys.executable, str(BENCH), "--objects", "20000", "--batch", "32"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    keys = rf"{n} ms" if native_available() else r"n/a \(no C table here\)"
    patterns = [r"kvpool bench/index_growth.py .* 20,000 objects of 4 KiB, puts of 32 keys, medians of 1 round\(s\); "
                r"index rows .*, capacity 32,768",
                rf"put_start: median {n} ms, longest {n} ms \(at [\d,]+ objects held\)",
                rf"a doubling at once at 16,384: rows {n} ms, key table rehash {keys}",
                rf"ratio index_growth longest put_start / doubling at once: {n}x \({n} vs {n} ms\)",
                rf"ratio index_growth longest / median put_start: {n}x"]
    for pattern in patterns:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)


def test_bad_arguments_are_refused_by_name():
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "10"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--objects must be >= 4096, --batch and --rounds >= 1 (got 10, 64, 1)" in r.stderr
