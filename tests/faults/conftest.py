"""The fault suite: real master / node / `kvpool up` processes on 127.0.0.1, killed and restarted. Every test here
is marked `faults` and `slow` (select with `-m faults`); each prints its figures (`-s` shows them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.store.cluster import cluster, redis_server  # noqa: F401 - fixtures for the suite

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.slow)
