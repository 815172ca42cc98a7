"""`kvpool bench pool`: the embedded-pool benchmark (kvpool/benchmarks/pool_local.py) with a progress bar."""

from __future__ import annotations


def register(subparsers) -> None:
    from kvpool.benchmarks import pool_local

    bench = subparsers.add_parser("bench", help="run a benchmark and print its table")
    which = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    pool = which.add_parser("pool", help="embedded pool put/get GB/s vs numpy memcpy, key hashing, index memory")
    pool_local.add_arguments(pool)
    pool.set_defaults(func=pool_local.run)
