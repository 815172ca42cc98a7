"""SSD corruption: bytes flipped in SSD records on disk, while the node runs (payload) and while it is down (a record
header, found by the scan when it starts again).

Promise checked: a damaged record is a miss, never returned bytes; it is counted once in the master's ssd_corrupt
(a reader's report or a promotion's verification, whichever sees it first; a damaged header by the node's scan at
start, issue 11 item 8) and forgotten, so a new put of its key stores it again; every other object is read back
byte-exact. Objects lost with the node restart (its DRAM) are a named event, counted apart.
"""

from __future__ import annotations

import pytest

from kvpool import PoolClient
from kvpool.proto import kvpool_pb2 as pb
from kvpool.tiers.ssd import HEADER_BYTES
from tests.faults.harness import Cluster, Figures, inspect, master_stub, payload_of, stats, wait_until

pytestmark = [pytest.mark.faults, pytest.mark.slow]

SIZE = 64 << 10
KEYS = [(0x55D << 100 | i).to_bytes(16, "big") for i in range(24)]  # 1 MiB of DRAM holds 16: 8 go to the SSD


def _flip(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _read_each(address: str, keys, transport: str) -> dict[bytes, bool | None]:
    """key -> True (byte-exact), False (wrong bytes returned), None (miss); one key per call."""
    out = {}
    with PoolClient(address, timeout=5, transport=transport) as client:
        for k in keys:
            buf = bytearray(SIZE)
            out[k] = (bytes(buf) == payload_of(k, SIZE)) if client.get_many_into([k], [buf]) == 1 else None
    return out


def _on_ssd(address: str) -> list[pb.ObjectInfo]:
    return [o for o in master_stub(address).List(pb.ListRequest(node_id="n1"), timeout=5).objects if o.tier == pb.SSD]


def test_corrupt_ssd_records_are_misses_counted_once_and_the_rest_is_intact(tmp_path, capsys):
    cluster = Cluster(workdir=tmp_path)
    figures = Figures("SSD corruption", event="lost by named events (3 records found corrupt and counted, the rest "
                                              "in the restarted node's DRAM)")
    ssd_file = tmp_path / "ssd-n1" / "kvpool.data"
    try:
        # exclusive tiers: the restarted node's DRAM objects are gone (with the write-behind they would be re-adopted)
        master = cluster.start_master(node_ttl_s=5.0, extra=["--heartbeat-s", "0.3", "--write-behind", "false"])
        address = master.address
        cluster.start_node("n1", dram="1MiB", ssd="8MiB")
        with PoolClient(address, timeout=5) as client:
            for i in range(0, len(KEYS), 4):
                assert client.put_many(KEYS[i:i + 4], [payload_of(k, SIZE) for k in KEYS[i:i + 4]]) == ["stored"] * 4
        figures.acked = len(KEYS)
        on_ssd = _on_ssd(address)
        assert len(on_ssd) == 8

        # 1. Payload bytes of two records flipped under the running node.
        bad = [on_ssd[0].key, on_ssd[1].key]
        for o in on_ssd[:2]:
            _flip(ssd_file, o.offset + HEADER_BYTES + 1000)
        for transport in ("tcp", "auto"):
            got = _read_each(address, KEYS, transport)
            figures.wrong_bytes += sum(v is False for v in got.values())
            assert [k for k, v in got.items() if v is None] == bad
            assert all(got[k] for k in KEYS if k not in bad)
        wait_until(lambda: stats(address)["ssd_corrupt"] == 2, 10, "both damaged records to be counted")
        assert inspect(address, bad) == [None, None]  # forgotten: a new put stores them again
        with PoolClient(address, timeout=5) as client:
            assert client.put_many(bad, [payload_of(k, SIZE) for k in bad]) == ["stored"] * 2

        # 2. A record header damaged while the node is down: the scan at start skips it and counts it.
        on_ssd = _on_ssd(address)
        wait_until(lambda: stats(address)["leases_open"] == 0, 10, "read leases to be released")
        cluster.nodes["n1"].kill()
        _flip(ssd_file, on_ssd[0].offset + 10)  # inside the header's key: its header checksum fails
        header_damaged = on_ssd[0].key
        before = stats(address)["ssd_corrupt"]
        cluster.start_node("n1", dram="1MiB", ssd="8MiB")  # a new incarnation: its DRAM objects are gone
        wait_until(lambda: stats(address)["objects"] == len(on_ssd) - 1, 20, "n1 to re-adopt its SSD records")
        figures.extra["ssd_corrupt"] = stats(address)["ssd_corrupt"]
        assert figures.extra["ssd_corrupt"] == before + 1
        survivors = [o.key for o in on_ssd[1:]]
        for transport in ("tcp", "auto"):
            got = _read_each(address, KEYS, transport)
            figures.wrong_bytes += sum(v is False for v in got.values())
            assert [k for k in KEYS if got[k]] == [k for k in KEYS if k in survivors]
        figures.lost_by_event = len(KEYS) - len(survivors)  # 2 payloads + 1 header damaged, the rest was in DRAM
        assert header_damaged not in survivors
    finally:
        cluster.close()
    figures.report(capsys)
    figures.check()
