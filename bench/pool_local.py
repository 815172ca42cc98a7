"""Embedded pool put/get throughput vs numpy memcpy (also `kvpool bench pool`).

The logic lives in kvpool/benchmarks/pool_local.py so the installed CLI can run it without the repo checkout;
this file keeps `python bench/pool_local.py [--help]` working from the repo.
"""

from kvpool.benchmarks.pool_local import main

if __name__ == "__main__":
    raise SystemExit(main())
