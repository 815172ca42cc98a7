"""`kvpool bench pool` runs the embedded-pool benchmark end to end (tiny sizes) and prints its table."""

import subprocess
import sys


def test_kvpool_bench_pool_prints_table(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "kvpool.cli", "bench", "pool", "--total-mib", "4", "--repeat", "1",
         "--index-objects", "1000", "--master-objects", "1000", "--ssd-dir", str(tmp_path), "--shm-dir",
         str(tmp_path), "--no-progress"], capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["tier", "size", "op", "GB/s", "memcpy", "GB/s", "ratio"]
    rows = [line.split() for line in lines[1:13]]
    assert [(r[0], r[1] + r[2], r[3]) for r in rows] == [
        (tier, size, op) for tier in ("dram", "ssd") for size in ("64KiB", "512KiB", "2MiB") for op in ("put", "get")]
    assert any(line.startswith("goal: DRAM get at 2 MiB = ") for line in lines)
    assert any(line.startswith("key hashing: 128K tokens -> 8192 block keys in ") for line in lines)
    assert any(line.startswith("index memory: ") for line in lines)
    assert list(tmp_path.iterdir()) == []  # the SSD files and arenas are cleaned up


def test_bench_pool_rejects_unknown_tier():
    res = subprocess.run([sys.executable, "-m", "kvpool.cli", "bench", "pool", "--tiers", "tape", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "--tiers: unknown tier 'tape'" in res.stderr
