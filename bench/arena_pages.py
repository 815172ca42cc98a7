"""DRAM arena on base pages vs on 2 MiB pages, and memcpy, all measured in this one run.

A same-host get is a copy out of the node's arena through the read fence (kvpool.copyhash: copy and xxh3 in one
pass), and a fresh same-host client maps the whole arena at start (DramArena.prefault). Both walk page tables: on
4 KiB pages a 1 GiB arena is 262,144 entries to fill and a TLB miss every 4 KiB of a copy; a tmpfs mounted with
`huge=within_size` reserves the arena's file in 2 MiB pages (tiers/dram.py `huge_pages`). Cases, in interleaved
rounds (order alternating each round; each line is the median of `--rounds` rounds):

  prefault        a fresh attach of the arena (DramArena.attach) and its prefault of every page: what a same-host
                  client (the connector's warm start) pays once at start
  get <size>      `--total` bytes copied out of extents at random places of the arena into one page-aligned
                  destination, through kvpool.copyhash.copy (the fence's one-pass copy + hash), each extent's
                  digest compared with the one taken when it was filled (outside the timed region)
  memcpy <size>   the same copies between two private page-aligned buffers (no hash): the physical limit

The base-page arena lives in /dev/shm (`--base-dir`); the huge-page one in `--huge-dir`, else the first tmpfs or
hugetlbfs mount that gives huge pages, else (`--mount`, root) a tmpfs this run mounts with huge=within_size and
unmounts at the end. With none of them the run prints why it skipped and exits 0.

Ratio lines: `ratio arena_pages prefault: ...` and `ratio arena_pages get <size>: ...` (huge over base pages, and
each against memcpy).

    python bench/arena_pages.py [--arena 1GiB] [--total 256MiB] [--rounds 7] [--huge-dir DIR] [--mount]
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

from kvpool import copyhash
from kvpool.config import parse_size
from kvpool.tiers.dram import DramArena, huge_pages

SIZES = (64 << 10, 512 << 10, 2 << 20)


def fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def find_huge_dir() -> str | None:
    """The first mount point listed in /proc/self/mountinfo under which an arena gets 2 MiB pages."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ")[0].split()
        if len(fields) >= 5 and fields[4] != "/" and huge_pages(fields[4]) is not None \
                and os.access(fields[4], os.W_OK):
            return fields[4]
    return None


@contextlib.contextmanager
def mounted_huge_tmpfs(size: int):
    """A tmpfs mounted with huge=within_size in a fresh temporary directory, unmounted and removed on exit."""
    path = tempfile.mkdtemp(prefix="kvpool-huge-")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"huge=within_size,size={size}", "tmpfs", path],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        os.rmdir(path)
        raise OSError(f"mount -t tmpfs -o huge=within_size failed: {res.stderr.strip() or res.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def aligned(nbytes: int) -> memoryview:
    return memoryview(mmap.mmap(-1, nbytes))     # anonymous mappings start on a page


class Side:
    """One arena (owner), filled with distinct bytes, and the digest of every extent of every size."""

    def __init__(self, directory: str, capacity: int) -> None:
        self.arena = DramArena.create(capacity, directory=directory)
        self.arena.array(0, capacity)[:] = np.random.default_rng(7).integers(0, 255, capacity, dtype=np.uint8)

    def prefault_ms(self) -> float:
        start = time.perf_counter()
        peer = DramArena.attach(self.arena.path)
        try:
            peer.prefault()
            return (time.perf_counter() - start) * 1e3
        finally:
            peer.close()

    def close(self) -> None:
        self.arena.close()
        self.arena.unlink()


def timed_copies(src: memoryview, dst: memoryview, offsets: list[int], size: int, hashed: bool) -> tuple[float, list]:
    digests = []
    start = time.perf_counter()
    if hashed:
        for i, off in enumerate(offsets):
            digests.append(copyhash.copy(dst[i * size:(i + 1) * size], src[off:off + size]))
    else:
        for i, off in enumerate(offsets):
            dst[i * size:(i + 1) * size] = src[off:off + size]
    return time.perf_counter() - start, digests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arena", default="1GiB", help="bytes of each arena")
    ap.add_argument("--total", default="256MiB", help="bytes copied per size per case and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--base-dir", default="/dev/shm")
    ap.add_argument("--huge-dir", default=None)
    ap.add_argument("--mount", action="store_true", help="mount a huge=within_size tmpfs for the run (root)")
    args = ap.parse_args(argv)
    try:
        args.arena, args.total = parse_size(args.arena, "--arena"), parse_size(args.total, "--total")
    except ValueError as exc:
        ap.error(str(exc))
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.total < max(SIZES) or args.total % max(SIZES):
        ap.error(f"--total must be a multiple of {fmt_size(max(SIZES))}, got {args.total}")
    if args.arena < 2 * args.total:
        ap.error(f"--arena must be at least twice --total ({2 * args.total} bytes), got {args.arena}")
    if args.huge_dir is not None and huge_pages(args.huge_dir) is None:
        ap.error(f"--huge-dir {args.huge_dir!r} gives base pages (mount a tmpfs there with huge=within_size)")
    if not copyhash.simd():
        print(f"note: kvpool._copyhash is off ({copyhash.REASON}); gets copy then hash in two passes")

    with contextlib.ExitStack() as stack:
        huge_dir = args.huge_dir or find_huge_dir()
        if huge_dir is None and args.mount:
            try:
                huge_dir = stack.enter_context(mounted_huge_tmpfs(args.arena + (64 << 20)))
            except OSError as exc:
                print(f"skipped: {exc}")
                return 0
        if huge_dir is None:
            print("skipped: no tmpfs here gives 2 MiB pages (mount one: mount -t tmpfs -o huge=within_size,size=8G "
                  "tmpfs /mnt/kvpool-huge; or run with --mount as root)")
            return 0
        sides = {"base": stack.enter_context(contextlib.closing(Side(args.base_dir, args.arena))),
                 "huge": stack.enter_context(contextlib.closing(Side(huge_dir, args.arena)))}
        pages = sides["huge"].arena.huge_pages
        if sides["base"].arena.huge_pages is not None:
            print(f"note: --base-dir {args.base_dir} gives huge pages too ({sides['base'].arena.huge_pages})")
        private = aligned(args.arena)
        private[:] = sides["base"].arena.view(0, args.arena)
        dst = aligned(args.total)
        rng = np.random.default_rng(1)
        times: dict[tuple[str, object], list[float]] = {}
        steps = args.rounds * (2 + 3 * len(SIZES))
        with tqdm(total=steps, desc="arena_pages", unit="case", file=sys.stderr) as bar:
            for rnd in range(args.rounds):
                order = ("base", "huge") if rnd % 2 == 0 else ("huge", "base")
                for name in order:
                    times.setdefault((name, "prefault"), []).append(sides[name].prefault_ms())
                    bar.update()
                for size in SIZES:
                    n = args.total // size
                    offsets = [int(o) * size for o in rng.choice(args.arena // size, n, replace=False)]
                    cases = [*order, "memcpy"] if rnd % 2 == 0 else ["memcpy", *order]
                    for name in cases:
                        src = private if name == "memcpy" else sides[name].arena.view(0, args.arena)
                        seconds, digests = timed_copies(src, dst, offsets, size, hashed=name != "memcpy")
                        times.setdefault((name, size), []).append(args.total / seconds / 1e9)
                        if name != "memcpy":
                            want = [copyhash.copy(bytearray(size), private[o:o + size]) for o in offsets[:8]]
                            if digests[:8] != want or bytes(dst[:size]) != bytes(private[offsets[0]:offsets[0] + size]):
                                raise SystemExit(f"{name} arena: the copied bytes differ from the arena's")
                        bar.update()

    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"\narena pages, medians of {args.rounds} rounds ({fmt_size(args.arena)} arenas; base: {args.base_dir}, "
          f"huge: {huge_dir} = {pages}; {fmt_size(args.total)} copied per size and case)")
    print(f"{'case':>12} {'base pages':>12} {'2 MiB pages':>12} {'memcpy':>10}")
    print(f"{'prefault':>12} {med[('base', 'prefault')]:>9.2f} ms {med[('huge', 'prefault')]:>9.2f} ms")
    for size in SIZES:
        print(f"{'get ' + fmt_size(size):>12} {med[('base', size)]:>7.2f} GB/s {med[('huge', size)]:>7.2f} GB/s "
              f"{med[('memcpy', size)]:>5.2f} GB/s")
    gib = args.arena / (1 << 30)
    print(f"ratio arena_pages prefault: huge pages {med[('base', 'prefault')] / med[('huge', 'prefault')]:.1f}x "
          f"faster ({med[('huge', 'prefault')] / gib:.2f} vs {med[('base', 'prefault')] / gib:.2f} ms per GiB)")
    for size in SIZES:
        h, b, m = med[("huge", size)], med[("base", size)], med[("memcpy", size)]
        print(f"ratio arena_pages get {fmt_size(size)}: huge pages {h / b:.2f}x base pages ({h:.2f} vs {b:.2f} GB/s); "
              f"{h / m:.2f}x vs {b / m:.2f}x memcpy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
