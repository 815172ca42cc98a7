"""Shared fixtures. Tiny sizes, real files, real servers on 127.0.0.1."""

from __future__ import annotations

import pytest

from kvpool.launcher import free_port


@pytest.fixture
def port() -> int:
    return free_port()
