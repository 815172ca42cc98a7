"""bench/trace_replay.py end to end on a small Mooncake-format trace: every policy replayed, the ratio lines and the
issue-13 goal lines printed for lclru (the policy that meets the goal on the Mooncake trace), the replay speeds."""

import json
import pathlib
import subprocess
import sys

from tests.kvpool.test_simulate import synthetic_rows

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "trace_replay.py"


def test_trace_replay_prints_ratio_goal_and_speed_lines(tmp_path):
    trace = tmp_path / "small.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in synthetic_rows(5, 300)))
    out = subprocess.run([sys.executable, str(BENCH), "--trace", str(trace), "--fractions", "0.1", "0.5",
                          "--tokens", "2e5", "--no-second"], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    lines = out.splitlines()
    for policy in ("wlru", "clru", "bclru", "lclru"):
        assert any(line.startswith(f"ratio {policy}/LRU block hit rate at 10% of unique blocks: ") for line in lines)
    assert any(line.startswith("goal lclru >= LRU +1.5 points at 10% of unique blocks: ") for line in lines)
    assert any(line.startswith("goal lclru >= LRU -0.5 points at 50% of unique blocks: ") for line in lines)
    assert sum(line.startswith("replay speed ") for line in lines) == 6     # lru, s3fifo, wlru, clru, bclru, lclru
