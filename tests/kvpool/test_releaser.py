"""kvpool/releaser.py against a real `kvpool up` (conftest's `small_up`): a corrupt report cuts the linger short and
takes the rest along, also when it was queued while the releaser's thread was busy sending."""

from __future__ import annotations

import threading

from kvpool import PoolClient
from kvpool.releaser import Releaser

KA, KB, K1, K2 = ((0xD7 << 120 | i).to_bytes(16, "big") for i in range(4))


def test_a_corrupt_report_queued_while_the_thread_was_busy_takes_the_rest_along(small_up):
    """The thread lingers 60 s over a lookup report (A) until a corrupt report (1) wakes it; while it sends A (held
    here), another lookup report (B) and another corrupt report (2) are queued. At its next turn the thread sends
    both corrupt reports and then B at once: before the fix it sent the reports and lingered the whole 60 s over B
    (tests/kvpool/test_host_index_reads.py timed out waiting for such a report in CI)."""
    calls = small_up.master.control.calls
    sent: list[list[bytes]] = []
    sending_a, go_on, b_sent = threading.Event(), threading.Event(), threading.Event()

    def send_lookup(ns, keys, s_per_token):
        sent.append(keys)
        if len(sent) == 1:
            sending_a.set()
            assert go_on.wait(10)
        else:
            b_sent.set()

    with PoolClient(small_up.address, timeout=5) as c:
        releaser = Releaser(c.rpc, 60.0, send_lookup=send_lookup)
        try:
            base = calls["Release"]
            assert releaser.report_lookup(None, [KA], 0.0)
            releaser.release(1, [K1])                   # wakes the lingering thread: it sends A (held)
            assert sending_a.wait(10)
            assert releaser.report_lookup(None, [KB], 0.0)
            releaser.release(2, [K2])                   # queued while the thread is busy
            go_on.set()
            assert b_sent.wait(10), "B lingered after the corrupt reports went"
            assert sent == [[KA], [KB]] and calls["Release"] == base + 2   # one Release per corrupt report
        finally:
            go_on.set()
            releaser.close(10)
