"""bench/verify_pipeline.py end to end at tiny sizes: master + node processes, every column, the ratio lines."""

import pathlib
import subprocess
import sys

from kvpool import copyhash

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "verify_pipeline.py"


def test_verify_pipeline_prints_every_ratio_line():
    out = subprocess.run([sys.executable, str(BENCH), "--sizes", "64KiB", "--total", "2MiB", "--rounds", "1",
                          "--load-blocks", "8"], capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert any(line.startswith("ratio verify_pipeline 64KiB: helper thread ") for line in lines)
    load = [line for line in lines if line.startswith("ratio verify_pipeline load: check per block ")]
    assert len(load) == 1 and "the copy alone, check per chunk " in load[0]
    assert any(line.startswith("copy only: ") and "check per block: " in line for line in lines)
    staged = [line for line in lines if line.startswith("ratio verify_pipeline load: staged entries ")]
    assert len(staged) == (1 if copyhash.simd() else 0), out     # its one-pass column needs the C extension
    two = [line for line in lines if line.startswith("ratio verify_pipeline load: landed, two threads ")]
    assert len(two) == (1 if copyhash.simd() else 0) and (not two or "faster than one pass on one thread" in two[0])


def test_verify_pipeline_rejects_a_negative_load_block_count():
    res = subprocess.run([sys.executable, str(BENCH), "--load-blocks", "-1"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "--load-blocks >= 0" in res.stderr
