"""bench/concurrent_gets.py end to end at a tiny size: master + node processes, client processes in both modes, the
ratio lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "concurrent_gets.py"


def test_concurrent_gets_prints_a_ratio_line_per_process_count():
    out = subprocess.run([sys.executable, str(BENCH), "--processes", "1,2", "--rounds", "1", "--seconds", "0.3",
                          "--objects", "64"], capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    for n in (1, 2):
        assert any(re.fullmatch(rf"ratio concurrent gets {n} processes: optimistic / leased \d+\.\d\dx gets/s", line)
                   for line in lines), out
    assert any(line.startswith("optimistic reads asked again under a lease") for line in lines)


def test_concurrent_gets_refuses_bad_arguments_by_name():
    for args, what in ((["--processes", "0"], "--processes must be >= 1"), (["--seconds", "0"], "--seconds must be")):
        res = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and what in res.stderr, res.stderr
