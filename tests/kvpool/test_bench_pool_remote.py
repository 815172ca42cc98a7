"""bench/pool_remote.py end to end at a tiny size (~10 s): three pools of master + node processes, the raw sockets,
redis when installed; every ratio line it prints for issue 14 is there, with both TCP limits."""

import pathlib
import re
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "pool_remote.py"
X = r"\d+\.\d\dx"


def test_pool_remote_prints_every_ratio_line():
    out = subprocess.run([sys.executable, str(BENCH), "--total", "8MiB", "--rounds", "1", "--lookups", "5",
                          "--chain", "50", "--index-objects", "0"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()

    def has(pattern: str) -> bool:
        return any(re.match(pattern, line) for line in lines)

    for size in ("64KiB", "512KiB", "2048KiB"):
        assert has(rf"\s*{size}: same-host get \(fence on\) {X} memcpy, put {X}; tcp get {X} raw socket "
                   rf"\({X} one sending distinct buffers\)"), out
        assert has(rf"\s*{size}: same-host repeat get with the location cache .* {X} memcpy; the default client "
                   rf"reading the same objects again {X}; cached / default {X}$"), out
        assert has(rf"\s*{size}: same-host repeat get, default client \(optimistic: no lease\) {X} memcpy; leased "
                   rf"\(optimistic_reads=False\) {X}; optimistic / leased {X}$"), out
    assert has(r"goals at 2 MiB: same-host get \(fence on\) >= 0\.6x memcpy: (met|MISSED); tcp get >= 0\.6x raw "
               r"socket: (met|MISSED)"), out
    assert has(r"auth on, 2 MiB get: same-host \d\.\d{3}x, tcp \d\.\d{3}x of auth off"), out
    assert has(r"master memory per indexed object: not measured \(--index-objects 0\)"), out
