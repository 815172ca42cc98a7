"""bench/arena_pages.py end to end at a tiny size: an arena on base pages and one on a huge-page tmpfs the run
mounts itself (root), the ratio lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "arena_pages.py"


def test_arena_pages_prints_the_prefault_and_a_get_line_per_size():
    res = subprocess.run([sys.executable, str(BENCH), "--arena", "32MiB", "--total", "8MiB", "--rounds", "2", "--mount"], capture_output=True, text=True, timeout=300,
                         check=True)
    if res.stdout.startswith("skipped:"):
        pytest.skip(res.stdout.strip())
    lines = res.stdout.splitlines()
    assert re.search(r"huge: \S+ = tmpfs huge=(within_size|always)", res.stdout), res.stdout
    assert any(re.fullmatch(r"ratio arena_pages prefault: huge pages \d+\.\dx faster \(\d+\.\d\d vs \d+\.\d\d ms "
                            r"per GiB\)", line) for line in lines), res.stdout
    for size in ("64 KiB", "512 KiB", "2 MiB"):
        assert any(re.fullmatch(rf"ratio arena_pages get {size}: huge pages \d+\.\d\dx base pages \(\d+\.\d\d vs "
                                rf"\d+\.\d\d GB/s\); \d+\.\d\dx vs \d+\.\d\dx memcpy", line) for line in lines), res.stdout
    assert "kvpool-huge-" not in subprocess.run(["mount"], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("args, what", [
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--total", "3MiB"], "--total must be a multiple of 2 MiB"),
    (["--arena", "8MiB", "--total", "8MiB"], "--arena must be at least twice --total"),
    (["--arena", "lots"], "--arena: expected a size like 256MiB"),
    (["--huge-dir", "/proc"], "--huge-dir '/proc' gives base pages"),
])
def test_arena_pages_refuses_bad_arguments_by_name(args, what):
    res = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and what in res.stderr, res.stderr
