"""A node that kept its memory registering again (its master restarted, or it cleared its host index after a
removal): how long the registration takes to be answered, what reaches the node's host index, and how long other
clients' lookups wait on the master meanwhile.

In one process (the master's own cost, no RPC): a Master and a StorageNode (DRAM only, sharing its arena, so it keeps
a host index), `--objects` objects of `--size` bytes put by a client's put path (put_start, put_commit; 1,000 a
batch) and published. Then the node clears its host index and registers again, as store/node_server.py does, while a
prober thread looks up a 64-key chain every 2 ms. Measured: the time `register_node` takes to return (what the
node's RegisterNode waits for, against its RPC deadline, `rpc_timeout_s` = 5 s by default), the time until every
object is published again (the feed flushed), how many of the node's objects its host index holds then, the feed
entries published to the node and dropped, and the lookups' latency before and during.

Prints per round, then the medians over rounds:

  registration answered in X ms; republished in Y s; A of B objects published to the node; feed dropped D
  lookup p50 / p99 / max (ms), idle and during
  ratio RegisterNode answer vs the node's RPC deadline (5 s): below 1.00x the node registers; at or above it the
  node's call times out and it registers again, forever
  ratio objects published to the node's host index again vs held: 1.00x is every object (its index keeps as many
  as its region holds, a slot per 32 KiB of arena: store/node.py)

In-process, the feed's sender applies each publication to the node on the master's process (the GIL shared); in the
service that is the node process's work. Only public Master and node calls, so `bench/ab.py` runs the same file on
two builds:

    python bench/reregister.py [--rounds 3] [--objects 1500000] [--size 4096]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from admin_list import CHAIN, LookupProber, key, put_objects  # noqa: E402 - the same puts and lookup prober

DEADLINE_S = 5.0            # NodeConfig.rpc_timeout_s's default: the node's RegisterNode deadline
FLUSH_S = 600.0


def one_round(args, workdir: str) -> dict:
    from kvpool.store.config import MasterConfig, NodeConfig
    from kvpool.store.master import Master
    from kvpool.store.node import StorageNode

    total = args.objects + CHAIN
    node = StorageNode(NodeConfig(node_id="n1", dram_bytes=total * args.size, shm_dir=workdir, share_dram=True))
    master = Master(MasterConfig(write_behind=False))
    master.register_node(node.info(), node, expires=False)
    try:
        put_objects(master, total, args.size)
        assert master.host_feed.flush(FLUSH_S), "the commits' publications did not go out"
        before = master.host_feed.as_dict()
        with LookupProber(master, [key(args.objects + i) for i in range(CHAIN)], FLUSH_S) as prober:
            node.objects_removed()                  # as a node registering again clears its index first
            t0 = time.perf_counter()
            master.register_node(node.info(), node, expires=False)     # the same process: its objects stay
            answer_ms = (time.perf_counter() - t0) * 1e3
            assert master.host_feed.flush(FLUSH_S), "the republication did not end"
            republish_s = time.perf_counter() - t0
        after = master.host_feed.as_dict()
        return {"answer_ms": answer_ms, "republish_s": republish_s, "held": total,
                "published": after["published"] - before["published"], "dropped": after["dropped"] - before["dropped"],
                **prober.summary()}
    finally:
        master.host_feed.close()
        node.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--objects", type=int, default=1_500_000)
    p.add_argument("--size", type=int, default=4096,
                   help="bytes per object (the node's arena holds them all; never written)")
    args = p.parse_args()
    if min(args.rounds, args.objects, args.size) < 1:
        p.error("--rounds, --objects and --size must be >= 1")
    if args.objects * args.size > 8 << 30:
        p.error("--objects x --size must be at most 8 GiB (the node's arena, in /dev/shm; never written)")
    print(f"# bench/reregister.py {datetime.date.today()} {platform.node()} python {platform.python_version()}: "
          f"{args.objects:,} objects of {args.size} B on one node")
    rounds = []
    for r in tqdm(range(args.rounds), desc="re-register", unit="round"):
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as workdir:
            res = one_round(args, workdir)
        rounds.append(res)
        tqdm.write(f"round {r + 1}: answered in {res['answer_ms']:.1f} ms, republished in {res['republish_s']:.2f} s; "
                   f"{res['published']:,} of {res['held']:,} objects published to the node; dropped "
                   f"{res['dropped']:,}; lookup p99 idle {res['idle_p99']:.2f} ms, during {res['busy_p99']:.2f} ms, "
                   f"max {res['busy_max']:.1f} ms")
    med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    print(f"registration (median over rounds): answered in {med['answer_ms']:.1f} ms, every object published again "
          f"in {med['republish_s']:.2f} s; {med['published']:,.0f} of the {med['held']:,.0f} objects it holds "
          f"published to the node, feed entries dropped {med['dropped']:,.0f}")
    print(f"lookup p50 / p99 (ms, median over rounds): idle {med['idle_p50']:.2f} / {med['idle_p99']:.2f}, during "
          f"{med['busy_p50']:.2f} / {med['busy_p99']:.2f}; longest during {med['busy_max']:.1f} ms")
    print(f"ratio RegisterNode answer vs the node's RPC deadline ({DEADLINE_S:.0f} s): "
          f"{med['answer_ms'] / 1e3 / DEADLINE_S:.4f}x (at or above 1.00x the node's call times out and it registers "
          f"again, forever)")
    print(f"ratio objects published to the node's host index again vs held: {med['published'] / med['held']:.4f}x "
          f"(1.0000x: every object found with no Lookup again, where the index has room)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
