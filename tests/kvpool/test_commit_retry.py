"""A put's PutCommit is retried on UNAVAILABLE like the reads (kvpool/client.py `_commit`): a real `kvpool up`
(conftest's `small_up`: LocalCluster on loopback; the clients use gRPC only, control_channel=False), and the one
fault a network can do to the call, put into the client's stub: the first PutCommit fails UNAVAILABLE either before
it reaches the master (the request lost: the retry commits, "stored") or after the master ran it (the reply lost:
the retry finds the grant ended, "no_space", and the object is stored all the same: told less than happened, never
more)."""

from __future__ import annotations

import pytest

from kvpool import PoolClient
from kvpool.errors import PoolUnavailable
from tests.conftest import SMALL_UP_OBJ as OBJ
from tests.lost_calls import OneLostCall

KEY = (0xC3 << 120 | 1).to_bytes(16, "big")
DATA = bytes(range(256)) * (OBJ // 256)


@pytest.mark.parametrize("ran, status", [(False, "stored"), (True, "no_space")])
def test_a_put_commit_that_failed_unavailable_is_sent_again(small_up, ran, status):
    with PoolClient(small_up.address, timeout=5, control_channel=False) as c:
        stub = c.rpc.stub = OneLostCall(c.rpc.stub, "PutCommit", ran)
        assert c.put_many([KEY], [DATA]) == [status]
        assert stub.calls == 2
        assert c.contains_many([KEY]) == [True]             # stored either way: one commit reached the master
        buf = bytearray(OBJ)
        assert c.get_many_into([KEY], [buf]) == 1 and bytes(buf) == DATA


def test_without_retries_the_lost_commit_is_the_callers_error(small_up):
    with PoolClient(small_up.address, timeout=5, control_channel=False, retries=0) as c:
        stub = c.rpc.stub = OneLostCall(c.rpc.stub, "PutCommit", ran=False)
        with pytest.raises(PoolUnavailable, match="no kvpool master answering"):
            c.put_many([KEY], [DATA])
        assert stub.calls == 1
        assert c.contains_many([KEY]) == [False]
