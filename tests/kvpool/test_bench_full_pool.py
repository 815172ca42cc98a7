"""bench/full_pool.py end to end at a tiny size: master + node processes, the putter and the lookup prober, every
phase reached, its ratio lines, and its arguments refused by name."""

import pathlib
import re
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "full_pool.py"


@pytest.mark.parametrize("write_behind", ["on", "off"])
def test_full_pool_reaches_every_phase_and_prints_its_ratio_lines(write_behind):
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--size", "16KiB", "--batch", "16",
                          "--dram", "4MiB", "--ssd", "12MiB", "--full-puts", "8", "--seconds", "60", "--pinned", "100",
                          "--write-behind", write_behind],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert f"SSD 12 MiB, write-behind {write_behind}; " in lines[1], out
    assert any(re.fullmatch(r"put per call \(median over rounds\): room [\d.]+ ms \([\d.]+ GB/s\), DRAM full [\d.]+ ms "
                            r"\([\d.]+ GB/s\), both full [\d.]+ ms \([\d.]+ GB/s\)", line) for line in lines), out
    assert any(re.fullmatch(r"put mean / p90 \(ms, median over rounds\): room [\d.]+ / [\d.]+, DRAM full [\d.]+ / "
                            r"[\d.]+, both full [\d.]+ / [\d.]+", line) for line in lines), out
    assert any(re.fullmatch(r"ratio put on a full pool vs with room: DRAM full \d+\.\d\dx, both full \d+\.\d\dx .*", line)
               for line in lines), out
    assert any(re.fullmatch(r"CPU per put \(ms, median over rounds\), master / node: room [\d.]+ / [\d.]+ \(\d+ puts\), "
                            r"DRAM full [\d.]+ / [\d.]+ \(\d+ puts\), both full [\d.]+ / [\d.]+ \(\d+ puts\)", line)
               for line in lines), out
    assert any(re.fullmatch(r"ratio lookup p99 during full-pool puts vs during room puts: DRAM full \d+\.\d\dx, "
                            r"both full \d+\.\d\dx .*", line) for line in lines), out
    assert any(re.fullmatch(r"remove per call \(16 keys, the last puts' chains, median over rounds\): [\d.]+ ms; ratio "
                            r"remove vs put with room: \d+\.\d\dx .*", line) for line in lines), out
    assert "nan" not in out and "WARNING" not in out, out      # every phase measured, the resident chain never missed


def test_with_quota_on_the_phases_are_the_tenants_quotas():
    """--quota on: auth on, the putter a tenant whose quotas (not the pool) fill: its phases, named for them, are
    all reached, and the prober (another tenant) never misses its resident chain."""
    out = subprocess.run([sys.executable, str(BENCH), "--rounds", "1", "--size", "16KiB", "--batch", "16",
                          "--dram", "4MiB", "--ssd", "12MiB", "--full-puts", "8", "--seconds", "60",
                          "--write-behind", "off", "--quota", "on"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert lines[2] == "quota on: auth on, the putter a tenant with DRAM quota 2 MiB and total quota 6 MiB (the pool " \
                       "never fills)", out
    assert any(re.fullmatch(r"put per call \(median over rounds\): room [\d.]+ ms \([\d.]+ GB/s\), at DRAM quota "
                            r"[\d.]+ ms \([\d.]+ GB/s\), at both quotas [\d.]+ ms \([\d.]+ GB/s\)", line)
               for line in lines), out
    assert any(re.fullmatch(r"put mean / p90 \(ms, median over rounds\): room [\d.]+ / [\d.]+, at DRAM quota [\d.]+ / "
                            r"[\d.]+, at both quotas [\d.]+ / [\d.]+", line) for line in lines), out
    assert any(re.fullmatch(r"ratio put at a tenant's quota vs with room: at DRAM quota \d+\.\d\dx, at both quotas "
                            r"\d+\.\d\dx .*", line) for line in lines), out
    assert any(re.fullmatch(r"ratio lookup p99 during quota puts vs during room puts: at DRAM quota \d+\.\d\dx, "
                            r"at both quotas \d+\.\d\dx .*", line) for line in lines), out
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
