"""bench/vllm_load.py end to end at a tiny size: master + node processes, every column checked byte for byte, the
ratio lines."""

import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "vllm_load.py"


def test_vllm_load_prints_every_ratio_line():
    out = subprocess.run([sys.executable, str(BENCH), "--blocks", "2", "--rounds", "1"], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert any(line.startswith("memcpy: ") and "| worker load: " in line for line in lines)
    ratio = [line for line in lines if line.startswith("ratio vllm_load worker load: ")]
    assert len(ratio) == 1 and "x memcpy; copy only " in ratio[0] and "; extent after " in ratio[0]
    assert any(line.startswith("ratio vllm_load fence: hashed as it lands ") for line in lines)
    assert any(line.startswith("ratio vllm_load worker save: ") and "x memcpy" in line for line in lines)
    assert any("| worker save: " in line for line in lines)


def test_vllm_load_rejects_a_block_count_below_one():
    res = subprocess.run([sys.executable, str(BENCH), "--blocks", "0"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--blocks and --rounds must be positive" in res.stderr
