"""bench/full_pool.py end to end at a tiny size: master + node processes, the putter and the lookup prober, every
phase reached, its ratio lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "full_pool.py"


def run_bench(*args: str) -> tuple[str, list[str]]:
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--size", "16KiB", "--batch", "16",
                          "--dram", "4MiB", "--ssd", "12MiB", "--full-puts", "8", "--seconds", "60", *args],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return out, out.splitlines()


def result_lines(dram: str, both: str, put_where: str, lookup_during: str) -> list[str]:
    """The patterns of the bench's result lines, with its two full phases named `dram` and `both`."""
    n, x = r"[\d.]+", r"\d+\.\d\dx"
    return [rf"put per call \(median over rounds\): room {n} ms \({n} GB/s\), {dram} {n} ms \({n} GB/s\), {both} "
            rf"{n} ms \({n} GB/s\)",
            rf"put mean / p90 \(ms, median over rounds\): room {n} / {n}, {dram} {n} / {n}, {both} {n} / {n}",
            rf"ratio put {put_where} vs with room: {dram} {x}, {both} {x} .*",
            rf"CPU per put \(ms, median over rounds\), master / node: room {n} / {n} \(\d+ puts\), {dram} {n} / {n} "
            rf"\(\d+ puts\), {both} {n} / {n} \(\d+ puts\)",
            rf"ratio lookup p99 during {lookup_during} puts vs during room puts: {dram} {x}, {both} {x} .*",
            rf"remove per call \(16 keys, the last puts' chains, median over rounds\): {n} ms; ratio remove vs put with "
            rf"room: {x} .*"]


@pytest.mark.parametrize("write_behind", ["on", "off"])
def test_full_pool_reaches_every_phase_and_prints_its_ratio_lines(write_behind):
    out, lines = run_bench("--pinned", "100", "--write-behind", write_behind)
    assert f"SSD 12 MiB, write-behind {write_behind}; " in lines[1], out
    for pattern in result_lines("DRAM full", "both full", "on a full pool", "full-pool"):
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)
    assert "nan" not in out and "WARNING" not in out, out      # every phase measured, the resident chain never missed


def test_with_quota_on_the_phases_are_the_tenants_quotas():
    """--quota on: auth on, the putter a tenant whose quotas (not the pool) fill: its phases, named for them, are
    all reached, and the prober (another tenant) never misses its resident chain."""
    out, lines = run_bench("--write-behind", "off", "--quota", "on")
    assert lines[2] == "quota on: auth on, the putter a tenant with DRAM quota 2 MiB and total quota 6 MiB (the pool " \
                       "never fills)", out
    for pattern in result_lines("at DRAM quota", "at both quotas", "at a tenant's quota", "quota"):
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, out)
    assert not re.search(r"\bnan\b", out) and "WARNING" not in out, out     # ("tenant" holds "nan")


def test_full_pool_refuses_bad_arguments_by_name():
    for args, what in ((["--rounds", "0"], "--rounds, --size, --batch"),
                       (["--size", "1MiB", "--dram", "16MiB"], "--size x --batch must be at most a quarter of --dram"),
                       (["--pinned", "-1"], "--pinned >= 0"),
                       (["--pinned", "100000"], "--pinned x 4 KiB must stay under a quarter of --dram"),
                       (["--write-behind", "yes"], "--write-behind: invalid choice: 'yes'"),
                       (["--quota", "1"], "--quota: invalid choice: '1'")):
        res = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and what in res.stderr, res.stderr
