"""SSD get vs the disk's sequential read bandwidth, both measured in this one run with the page cache dropped.

For each object size (64 KiB, 512 KiB, 2 MiB), `--total` bytes of objects, in interleaved rounds (the cases of a
round run back to back, their order rotated each round; each line is the MEDIAN of `--rounds` rounds):

  disk seq (buffered)  the physical limit: a file of the same total size on the same filesystem as the SSD tier,
                       fsync + posix_fadvise(DONTNEED) before each pass, then read front to back with 8 MiB preadv
                       calls into one preallocated buffer (the kernel's readahead keeps the disk busy)
  seq spread           the same buffered read, but each 8 MiB lands in its own place of one preallocated buffer
                       of the total size, as a get's bytes must (a reused 8 MiB buffer stays partly in the CPU
                       cache; a get's destination does not)
  disk seq (O_DIRECT)  the same file read with O_DIRECT (8 MiB reads, page-aligned buffer): no page cache at all;
                       skipped with the reason printed if the filesystem refuses O_DIRECT
  kvpool SSD get       an EmbeddedPool with no DRAM tier (dram_bytes=0) and the objects on its SSD file
                       (promote_on_hit=False, so a get never moves an object into DRAM); the tier file is fsynced and
                       dropped from the page cache before each pass, then get_many_into of every object in 32-key
                       calls. Every buffer is zeroed before the pass and compared with the put bytes after it (outside
                       the timed region), and the pass's tiers_out must say "ssd" for every object.
  service SSD get      the same through processes (bench/pool_remote.py's Pool): a master with promote_on_hit and
                       write_behind off, a node with dram_bytes=0 and its SSD file; PoolClient gets. Same host, so the
                       client reads each record from the node's data file itself (kvpool/transfer.py, checked as the
                       node checks it; the pass fails unless every read went that way)
                       The same-host client remembers where it read each record (kvpool/locations.py), so from
                       its second pass on a get reads the records with no Lookup: a repeat get.
  service first get    the same through a PoolClient with `location_cache_s=0`: what another client's first get of
                       those records costs. Since 2026-11-28 the master publishes SSD records to the node's host
                       index (tiers/host_index.py) as it does DRAM extents, so such a get finds the chain there and
                       reads the records with no Lookup (the pass fails unless every call did)
  service lookup       the same with `host_index_reads=False` too: a Lookup with lease per 32-key call, what a get
                       costs when the host index does not name the records (a publication not sent yet, or lost)
  service TCP          the same objects through a PoolClient with transport="tcp" (what a client on another host
                       gets): since 2026-12-07 the node checks each record's header and sends its payload straight
                       from the file (sendfile) on its loopback data channel, and the client checks the payload
                       against the committed checksum as it lands (before: the node read and verified the record
                       into a staging buffer, then sent it).
                       `--no-service` skips both; a pool that cannot start is skipped with the reason printed.

Bandwidth counts payload bytes (a kvpool record also reads its 4 KiB header page). The disk limit of a size is the
fastest of the three sequential reads in the same rounds. Ratio lines: `SSD get <size>: <r>x disk sequential read`,
and a goal line for issue 14's goal (>= 0.8x at every size).

Destination alignment matters on this machine: the kernel's copy from the page cache into a buffer that starts 16
bytes past a page (where a large np.ones/np.empty starts with glibc) ran about half as fast as into a page-aligned
one, for the sequential read and the get alike. The bench's destinations are page-aligned (`--misalign N` moves
them), as an engine's KV buffers are.

Does posix_fadvise(DONTNEED) really drop the pages here? Measured 2026-11 on the team machine (2 vCPU VM, ext4 on
a virtio disk /dev/vda that reports itself rotational, mq-deadline, read_ahead_kb 8192; other engineers' tests
running beside it): yes -- `fincore` shows 0 resident bytes of a 512 MiB file right after fsync + DONTNEED, and the
file is fully resident again after one read. But a "disk" read after DONTNEED was only ~1.2-1.7x slower than a
read from the page cache (about 0.8-1.5 GB/s against 1.4-1.8 GB/s in a 512 MiB probe), O_DIRECT 8 MiB reads ran
0.4-1.5 GB/s depending on the load, and a 4 KiB O_DIRECT random read took ~34 us (p50). That is a virtual disk:
what the guest calls the disk is very likely served from the host's page cache (or a fast NVMe behind it), so "the
disk's sequential bandwidth" here is the virtio path's bandwidth, not a physical SSD's. The bench measures the
same path for both sides, so the ratio stays fair; the absolute GB/s belong to this VM only.

    python bench/ssd_read.py [--dir /var/tmp/kvpool] [--total 256MiB] [--rounds 7] [--batch 32] [--misalign 0]
                             [--profile DIR] [--no-service]
"""

from __future__ import annotations

import argparse
import datetime
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from pagecache import drop_page_cache
from tqdm import tqdm

from kvpool.config import parse_size
from kvpool.embedded import EmbeddedPool
from kvpool.store.config import UpConfig

SIZES = [64 << 10, 512 << 10, 2 << 20]
CHUNK = 8 << 20
GOAL = 0.8


def write_file(path: str, total: int) -> None:
    rng = np.random.default_rng(1)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for off in range(0, total, CHUNK):
            os.pwrite(fd, rng.integers(0, 256, min(CHUNK, total - off), dtype=np.uint8).tobytes(), off)
        os.fsync(fd)
    finally:
        os.close(fd)


def seq_read(path: str, total: int, bufs: list, direct: bool) -> float:
    """Seconds to read `total` bytes of `path` front to back (page cache dropped first), CHUNK bytes per preadv into
    bufs[0], bufs[1], ... in turn (one buffer: reused; len(bufs) * CHUNK == total: every byte in its own place)."""
    drop_page_cache(path)
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        t0 = time.perf_counter()
        off, i = 0, 0
        while off < total:
            n = os.preadv(fd, [bufs[i % len(bufs)]], off)
            if n != CHUNK and off + n != total:
                raise OSError(f"short read of {path} at {off}")
            off += n
            i += 1
        return time.perf_counter() - t0
    finally:
        os.close(fd)


def aligned_array(nbytes: int, misalign: int) -> np.ndarray:
    """uint8 array of `nbytes` starting `misalign` bytes past a page boundary, every page touched (no page faults
    in a timed pass). An engine's KV buffers are at least 64-byte aligned (torch's CPU allocator; pinned memory:
    page-aligned); np.ones/np.empty of this size start 16 bytes past a page here, and the kernel's copy into such a
    buffer ran about half as fast (measured), so alignment is a knob of the bench, not an accident of numpy."""
    mem = mmap.mmap(-1, nbytes + misalign)
    arr = np.frombuffer(mem, dtype=np.uint8)[misalign:misalign + nbytes]
    arr.fill(1)
    return arr


def o_direct_reason(path: str, buf) -> str | None:
    """None if O_DIRECT reads of `path` work here, else why not."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        return f"open(O_DIRECT) failed: {e.strerror}"
    try:
        os.preadv(fd, [buf], 0)
    except OSError as e:
        return f"an O_DIRECT read failed: {e.strerror}"
    finally:
        os.close(fd)
    return None


class SsdCase:
    """One EmbeddedPool whose every object lives on its SSD file, and the buffers its gets fill."""

    def __init__(self, directory: str, size: int, total: int, batch: int, misalign: int) -> None:
        self._objects(size, total, batch, misalign)
        self.pool = EmbeddedPool(dram_bytes=0, ssd_path=directory, ssd_bytes=self.n * (size + 4096) + (64 << 20),
                                 promote_on_hit=False, write_behind=False)
        srcs = [self.src[i * size:(i + 1) * size] for i in range(self.n)]
        for i in range(0, self.n, batch):
            statuses = self.pool.put_many(self.keys[i:i + batch], srcs[i:i + batch])
            if any(s != "stored" for s in statuses):
                raise RuntimeError(f"put of {size}-byte objects: {statuses}")
        self.path = self.pool.node.ssd.path
        self.check()

    def timed_pass(self, pool=None) -> float:
        self.prepare()
        dt = self.get_all(pool)
        self.verify()
        return dt

    def _objects(self, size: int, total: int, batch: int, misalign: int) -> None:
        """The objects' bytes, keys, and the buffer (and its per-object views) the gets fill."""
        self.size, self.batch = size, batch
        self.n = total // size
        rng = np.random.default_rng(size)
        self.src = rng.integers(0, 256, self.n * size, dtype=np.uint8)
        self.dst = aligned_array(self.n * size, misalign)
        self.keys = [size.to_bytes(4, "little") + i.to_bytes(12, "little") for i in range(self.n)]
        self.views = [self.dst[i * size:(i + 1) * size] for i in range(self.n)]

    def prepare(self) -> None:
        self.dst.fill(0)                                        # a pass that filled nothing cannot pass verify()
        drop_page_cache(self.path)

    def get_all(self, pool=None) -> float:
        keys, views, batch = self.keys, self.views, self.batch
        pool = self.pool if pool is None else pool
        t0 = time.perf_counter()
        for i in range(0, self.n, batch):
            got = pool.get_many_into(keys[i:i + batch], views[i:i + batch])
            if got != len(keys[i:i + batch]):
                raise RuntimeError(f"get of {self.size}-byte objects {i}..: {got} filled")
        return time.perf_counter() - t0

    def verify(self) -> None:
        if not np.array_equal(self.dst, self.src):
            raise RuntimeError(f"{self.size}-byte objects: bytes read differ from the bytes put")

    def check(self) -> None:
        """Every object is served by the SSD tier (not DRAM), bytes equal. Untimed."""
        self.dst.fill(0)
        tiers: list[str] = []
        for i in range(0, self.n, self.batch):
            self.pool.get_many_into(self.keys[i:i + self.batch], self.views[i:i + self.batch], tiers_out=tiers)
        if tiers != ["ssd"] * self.n:
            raise RuntimeError(f"{self.size}-byte objects: served from {sorted(set(tiers))}, not only ssd")
        if not np.array_equal(self.dst, self.src):
            raise RuntimeError(f"{self.size}-byte objects: bytes read differ from the bytes put")

    def close(self) -> None:
        self.pool.close()


class ServiceCase(SsdCase):
    """The same objects through `kvpool up`-style processes: a master (promote_on_hit and write_behind off) and a
    node with no DRAM tier and an SSD file, started by bench/pool_remote.py's Pool; PoolClient reads an SSD extent
    through the node (the node's verified read, then its data channel on loopback)."""

    def __init__(self, directory: str, size: int, total: int, batch: int, misalign: int, workdir: str) -> None:
        from pool_remote import Pool

        from kvpool import PoolClient
        from kvpool.tiers.ssd import DATA_FILE

        self._objects(size, total, batch, misalign)
        self.service = Pool(0, workdir, name=f"ssd-{size}",
                            master_args=["--promote-on-hit", "false", "--write-behind", "false"],
                            node_args=["--ssd-path", directory,
                                       "--ssd-bytes", str(self.n * (size + 4096) + (64 << 20))])
        try:
            self.pool = PoolClient(self.service.address)
            self.first = PoolClient(self.service.address, location_cache_s=0)
            self.lookup = PoolClient(self.service.address, location_cache_s=0, host_index_reads=False)
            self.tcp = PoolClient(self.service.address, transport="tcp")
            srcs = [self.src[i * size:(i + 1) * size] for i in range(self.n)]
            for i in range(0, self.n, batch):
                statuses = self.pool.put_many(self.keys[i:i + batch], srcs[i:i + batch])
                if any(s != "stored" for s in statuses):
                    raise RuntimeError(f"service put of {size}-byte objects: {statuses}")
            self.path = os.path.join(directory, DATA_FILE)
            for client in (self.first, self.lookup):    # as the connectors do at start: the node's arena mapped
                client.warm(prefault=False)
            self.check()
        except BaseException:
            self.service.close()
            raise

    def timed_pass(self, pool=None) -> float:
        """`pool`: self.tcp for the data-channel pass; a same-host pass (self.pool, self.first) must read every
        record itself."""
        reader = self.pool if pool is None else pool
        before, indexed = reader.transfers.direct_ssd_reads, reader.host_index_gets
        dt = super().timed_pass(pool)
        if reader is not self.tcp and reader.transfers.direct_ssd_reads - before != self.n:
            raise RuntimeError(f"{self.size}-byte objects: the same-host pass did not read every record directly")
        calls = -(-self.n // self.batch)
        if reader is self.first and reader.host_index_gets - indexed != calls:
            raise RuntimeError(f"{self.size}-byte objects: {reader.host_index_gets - indexed} of {calls} first gets "
                               f"found their chain in the node's host index")
        return dt

    def close(self) -> None:
        try:
            self.pool.close()
            self.first.close()
            self.lookup.close()
            self.tcp.close()
        finally:
            self.service.close()


def fmt_size(n: int) -> str:
    return f"{n >> 10}KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=UpConfig.ssd_path,
                    help="a directory on the filesystem to measure (default: `kvpool up`'s ssd_path); the bench "
                         "works in a fresh subdirectory and removes it")
    ap.add_argument("--total", default="256MiB", help="bytes of objects per size (and of the sequential file)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=32, help="keys per get_many_into call")
    ap.add_argument("--misalign", type=int, default=0,
                    help="start the destination buffers this many bytes past a page boundary (16: where a large "
                         "np.empty starts on glibc; default 0: page-aligned, like an engine's KV buffers)")
    ap.add_argument("--no-service", action="store_true", help="skip the case through master + node processes")
    ap.add_argument("--profile", metavar="DIR",
                    help="after the rounds, cProfile one embedded SSD get pass per size into DIR/ssd_get_<size>.prof")
    args = ap.parse_args(argv)
    total = parse_size(args.total, "--total")
    if total < max(SIZES) or args.rounds < 1 or args.batch < 1 or not 0 <= args.misalign < 4096:
        ap.error("--total must be >= 2MiB, --rounds and --batch >= 1, --misalign in [0, 4096)")
    total -= total % max(SIZES)
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="kvpool-ssdbench-", dir=args.dir)
    cases: dict[int, SsdCase] = {}
    services: dict[int, SsdCase] = {}
    service_skip = "--no-service" if args.no_service else None
    try:
        seq_path = os.path.join(work, "sequential.bin")
        write_file(seq_path, total)
        buf = mmap.mmap(-1, CHUNK)                              # page-aligned: O_DIRECT needs it
        direct_skip = o_direct_reason(seq_path, buf)
        whole = aligned_array(total, args.misalign)
        spread = [memoryview(whole[off:off + CHUNK]) for off in range(0, total, CHUNK)]
        for size in tqdm(SIZES, desc="put objects on SSD", file=sys.stderr):
            cases[size] = SsdCase(os.path.join(work, f"ssd-{size}"), size, total, args.batch,
                                  args.misalign)
        if service_skip is None:
            try:
                for size in tqdm(SIZES, desc="put objects through the service", file=sys.stderr):
                    services[size] = ServiceCase(os.path.join(work, f"svc-{size}"), size, total, args.batch,
                                                 args.misalign, work)
            except Exception as e:                              # a peer that cannot start: skipped, said why
                service_skip = f"{type(e).__name__}: {e}"
                for case in services.values():
                    case.close()
                services.clear()
        names = (["seq", "spread"] + ([] if direct_skip else ["direct"]) + ["kvpool"]
                 + ([] if service_skip else ["service", "service first", "service lookup", "service tcp"]))
        times: dict[tuple[int, str], list[float]] = {}
        with tqdm(total=args.rounds * len(SIZES) * len(names), desc="SSD read rounds", file=sys.stderr) as bar:
            for r in range(args.rounds):
                for size in SIZES:
                    order = names[r % len(names):] + names[:r % len(names)]
                    for name in order:
                        if name == "kvpool":
                            dt = cases[size].timed_pass()
                        elif name == "service":
                            dt = services[size].timed_pass()
                        elif name == "service first":
                            dt = services[size].timed_pass(services[size].first)
                        elif name == "service lookup":
                            dt = services[size].timed_pass(services[size].lookup)
                        elif name == "service tcp":
                            dt = services[size].timed_pass(services[size].tcp)
                        else:
                            dt = seq_read(seq_path, total, spread if name == "spread" else [buf],
                                          direct=name == "direct")
                        times.setdefault((size, name), []).append(dt)
                        bar.update(1)
        for case in [*cases.values(), *services.values()]:
            case.check()                                        # still all on SSD after the rounds
        if args.profile:
            import cProfile
            os.makedirs(args.profile, exist_ok=True)
            for size, case in cases.items():
                prof = cProfile.Profile()
                case.prepare()
                prof.runcall(case.get_all)
                case.verify()
                prof.dump_stats(os.path.join(args.profile, f"ssd_get_{fmt_size(size)}.prof"))
    finally:
        for case in [*cases.values(), *services.values()]:
            case.close()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nSSD read, median of {args.rounds} interleaved rounds, {total >> 20} MiB per size, page cache "
          f"dropped before every pass, destinations {args.misalign} bytes past a page; {args.dir} "
          f"({platform.machine()}, {os.cpu_count()} cores, {datetime.date.today()})")
    if direct_skip:
        print(f"disk seq (O_DIRECT): skipped: {direct_skip}")
    if service_skip:
        print(f"kvpool service: skipped: {service_skip}")
    gbps = {k: total / statistics.median(v) / 1e9 for k, v in times.items()}
    limits = [n for n in ("seq", "spread", "direct") if n in names]
    gets = [n for n in ("kvpool", "service", "service first", "service lookup", "service tcp") if n in names]
    label = {"seq": "disk seq", "spread": "seq spread", "direct": "O_DIRECT", "kvpool": "embedded",
             "service": "service", "service first": "svc first", "service lookup": "svc lookup",
             "service tcp": "svc TCP"}
    what_of = {"kvpool": "SSD get", "service": "SSD get (service)", "service first": "SSD get (service, first get)",
               "service lookup": "SSD get (service, a Lookup per call)",
               "service tcp": "SSD get (service, TCP channel)"}
    print(f"{'size':>8}  " + "  ".join(f"{label[n]:>10}" for n in limits + gets) + "  (GB/s)")
    for size in SIZES:
        print(f"{fmt_size(size):>8}  " + "  ".join(f"{gbps[(size, n)]:>10.2f}" for n in limits + gets))
    worst: dict[str, float] = {}
    for name in gets:
        what = what_of[name]
        for size in SIZES:
            limit = max(gbps[(size, n)] for n in limits)
            got = gbps[(size, name)]
            worst[name] = min(worst.get(name, got / limit), got / limit)
            print(f"{what} {fmt_size(size)}: {got / limit:.2f}x disk sequential read ({got:.2f} GB/s vs "
                  f"{limit:.2f} GB/s)")
    goals = {"kvpool": "SSD get", "service": "SSD get through the service",
             "service first": "SSD get through the service, another client's first get (the node's host index)"}
    # TCP: what a remote client gets, not held to the same-host goal; the Lookup column: the fallback, shown
    for name in [n for n in gets if n in goals]:
        what = goals[name]
        print(f"goal (issue 14): {what} >= {GOAL}x the disk's sequential read at every size: "
              f"{'met' if worst[name] >= GOAL else 'NOT met'} (worst {worst[name]:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
