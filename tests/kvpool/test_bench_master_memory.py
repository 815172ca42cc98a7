"""bench/master_memory.py at a tiny size: its table, ratio and goal lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

from kvpool.store.keytable import native_available

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "master_memory.py"


def test_both_key_tables_are_measured_and_the_ratio_lines_are_printed():
    out = subprocess.run([sys.executable, str(BENCH), "--objects", "3000", "--lookups", "50"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    patterns = [rf" +dict +{n} B +{n} B +{n} B +{n} us +{n} us",
                rf"goal master memory <= 200 B per object at 3,000 objects \(dict\): (met|MISSED) \({n} B; a tenant "
                rf"with a quota {n} B\)"]
    if native_available():
        patterns += [rf" +C table +{n} B +{n} B +{n} B +{n} us +{n} us"]
        patterns += [rf"ratio {what}_memory{q} per object C table vs dict: {n}x \({n} vs {n} B\)"
                     for what, q in (("master", ""), ("master", "_quota"), ("index", ""))]
        patterns += [rf"ratio lookup_64_{what} C table vs dict: {n}x the dict's speed \({n} vs {n} us\)"
                     for what in ("hit", "miss")]
    for pattern in patterns:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)
    if native_available():      # the C table's index holds no Python object per key: under the dict's even here
        table = {line.split()[0]: float(line.split()[-6]) for line in lines if re.match(r" +(C|dict) ", line)}
        assert table["C"] < table["dict"], out


def test_bad_arguments_are_refused_by_name():
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "10"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--objects must be >= 64, --rounds and --lookups >= 1 (got 10, 1, 20000)" in r.stderr
