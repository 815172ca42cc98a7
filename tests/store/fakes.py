"""Deterministic stand-ins shared by the in-process master tests: a clock the test moves by hand (no sleeping),
and readable 16-byte keys."""

from __future__ import annotations


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key(i: int) -> bytes:
    return bytes([i]) * 16
