"""bench/admin_evict.py end to end at a tiny size: master + node processes, the puts, the lookup prober and the admin
evict (or the node removal), its result and ratio lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "admin_evict.py"


def test_admin_evict_evicts_every_object_and_prints_its_ratio_lines():
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--objects", "3000"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    for pattern in [r"evict \(median over rounds\): 3000 objects in \d+ ms \([\d,]+ objects/s\)",
                    rf"lookup p50 / p99 \(ms, median over rounds\): idle {n} / {n}, during the evict {n} / {n}; "
                    rf"longest during the evict {n} ms",
                    r"ratio lookup p99 during an admin evict vs idle: \d+\.\d\dx \(1\.00x: .*\)",
                    r"longest lookup during the evict: \d+% of the evict's span .*"]:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)


def test_node_removal_drops_every_object_and_prints_its_ratio_lines():
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--objects", "3000", "--removal", "node"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    n = r"[\d.]+"
    for pattern in [r"node removal \(median over rounds\): 3000 objects in \d+ ms \([\d,]+ objects/s\)",
                    rf"lookup p50 / p99 \(ms, median over rounds\): idle {n} / {n}, during the node removal {n} / {n}; "
                    rf"longest during the node removal {n} ms",
                    r"ratio lookup p99 during a node removal vs idle: \d+\.\d\dx \(1\.00x: .*\)",
                    r"longest lookup during the node removal: \d+% of the node removal's span .*"]:
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)


def test_bad_arguments_are_refused_by_name():
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rounds, --objects and --size must be >= 1" in r.stderr
    r = subprocess.run([sys.executable, str(BENCH), "--objects", "3000000", "--size", "4MiB"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--objects x --size must be at most 8 GiB" in r.stderr
    r = subprocess.run([sys.executable, str(BENCH), "--removal", "all"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "argument --removal: invalid choice: 'all'" in r.stderr
