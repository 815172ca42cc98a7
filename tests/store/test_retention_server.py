"""Retention hints and prefill seconds saved through a real pool process (`kvpool up`: master + node + dashboard on
127.0.0.1) and PoolClient: exact eviction order under pressure, pins that yield, bad pin_s as ValueError in the client
and INVALID_ARGUMENT from the master (nothing stored), and the seconds-saved counter in Stats and /metrics."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import urllib.request

import grpc
import pytest

from kvpool import Namespace, PoolClient
from kvpool.launcher import free_port, spawn, wait_grpc_serving, wait_http_ok
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg

OBJ = 1 << 20          # 8 objects fill the node's 8 MiB DRAM


def key(i: int) -> bytes:
    return bytes([i]) * 16


def blob(i: int) -> bytes:
    return bytes([i]) * OBJ


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    work = tmp_path_factory.mktemp("up-pins")
    shm = tempfile.mkdtemp(prefix="kvpool-test-", dir="/dev/shm")
    address, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proc = spawn("up", ["up", "--listen", address, "--http-listen", http, "--ssd-path", "none", "--dram-bytes", "8MiB",
                        "--shm-dir", shm, "--pin-max-fraction", "0.5"], work)
    try:
        wait_grpc_serving(address, 30, proc)
        wait_http_ok(f"http://{http}/health", 30, proc)
        channel = grpc.insecure_channel(address)
        with PoolClient(address, timeout=10) as client:
            yield {"client": client, "stub": pbg.MasterServiceStub(channel), "http": http, "proc": proc,
                   "address": address}
        channel.close()
    finally:
        proc.stop()
        shutil.rmtree(shm, ignore_errors=True)


def stats(up) -> dict:
    return json.loads(up["stub"].Stats(pb.StatsRequest(), timeout=5).json)


def present(client, ids) -> list[int]:
    return [i for i, there in zip(ids, client.contains_many([key(i) for i in ids])) if there]


def test_pins_through_a_real_master(up):
    client = up["client"]
    a, b = [1, 2, 3], [11, 12, 13, 14, 15]
    assert client.put_many([key(i) for i in a], [blob(i) for i in a], pin_s=600) == ["stored"] * 3
    assert client.put_many([key(i) for i in b], [blob(i) for i in b]) == ["stored"] * 5    # DRAM full now
    s = stats(up)
    assert (s["pinned_objects"], s["pinned_bytes"], s["pins_clipped"]) == (3, 3 * OBJ, 0)
    gone = []
    for i in (21, 22, 23):         # pressure, one object at a time: LRU alone would take the older, pinned chain
        before = set(present(client, a + b))
        assert client.put_many([key(i)], [blob(i)]) == ["stored"]
        gone += sorted(before - set(present(client, a + b)))
    assert gone == [15, 14, 13]
    # the cap (0.5 of 8 MiB = 4 objects): one more pin fits, the next key is stored unpinned and counted
    assert client.put_many([key(31), key(32)], [blob(31), blob(32)], pin_s=600) == ["stored"] * 2
    s = stats(up)
    assert (s["pinned_objects"], s["pins_clipped"], s["pinned_evictions"]) == (4, 1, 0)
    # left: the pins 1, 2, 3, 31 and the clipped key(32); four puts more: three fit, the fourth takes key(32) and
    # leaves every pin (the cap keeps a tenant from pinning the whole pool: all-pinned yield is in test_retention.py)
    client.remove_many([key(i) for i in (21, 22, 23)])
    assert client.put_many([key(40 + i) for i in range(4)], [blob(40 + i) for i in range(4)]) == ["stored"] * 4
    assert present(client, a + [31, 32]) == [1, 2, 3, 31]           # key(32), unpinned, went first
    assert stats(up)["pinned_evictions"] == 0


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, 1e12])
def test_bad_pin_s_is_invalid_argument_from_the_master_and_a_value_error_in_the_client(up, bad):
    client, stub = up["client"], up["stub"]
    before = stats(up)["objects"]
    with pytest.raises(ValueError, match="pin_s"):
        client.put_many([key(90)], [blob(90)], pin_s=bad)
    with pytest.raises(ValueError, match="pin_s"):
        client.put_many([key(90)], [blob(90)], pin_s=True)
    with pytest.raises(grpc.RpcError) as info:
        stub.PutStart(pb.PutStartRequest(keys=[key(90)], sizes=[OBJ], namespace=b"\0" * 16, pin_s=bad), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "pin_s" in info.value.details()
    s = stats(up)
    assert (s["objects"], s["grants_open"]) == (before, 0)
    assert client.contains_many([key(90)]) == [False]


def test_prefill_seconds_saved_in_stats_and_metrics(up):
    client, stub = up["client"], up["stub"]
    ns = Namespace(model="m", fingerprint="f", kv_dtype="float32", block_tokens=16, num_layers=1, num_kv_heads=1,
                   head_dim=1, tenant="t")
    keys = [bytes([200 + i]) * 16 for i in range(3)]
    client.put_many(keys[:2], [blob(0), blob(1)], namespace=ns)
    rate = 0.0012345
    assert client.lookup_prefix(keys, namespace=ns, prefill_s_per_token=rate) == 2
    assert client.lookup_prefix(keys, namespace=ns) == 2          # no rate: counted as a hit, saves nothing
    with pytest.raises(ValueError, match="prefill_s_per_token"):
        client.lookup_prefix(keys, namespace=ns, prefill_s_per_token=-1)
    with pytest.raises(grpc.RpcError) as info:
        stub.Lookup(pb.LookupRequest(keys=keys, namespace=b"\0" * 16, prefill_s_per_token=math.nan), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prefill_s_per_token" in info.value.details()
    expected = 2 * 16 * rate
    s = stats(up)
    assert s["namespaces"]["m/t"]["prefill_seconds_saved"] == expected
    assert s["prefill_seconds_saved"] == expected
    text = urllib.request.urlopen(f"http://{up['http']}/metrics", timeout=10).read().decode()
    line = next(x for x in text.splitlines() if x.startswith('kvpool_prefill_seconds_saved_total{namespace="m/t"}'))
    assert float(line.split()[-1]) == expected


def test_kvpool_status_shows_pins_and_seconds_saved(up, capsys):
    from kvpool.admin import human_bytes
    from kvpool.cli import main

    s = stats(up)
    assert main(["status", "--master", up["address"]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"prefill seconds saved {s['prefill_seconds_saved']:.3f} (hit tokens x the prefill s/token connectors " \
           "measured)" in out
    assert (f"pinned {s['pinned_objects']} objects ({human_bytes(s['pinned_bytes'])}), pins clipped {s['pins_clipped']}, pinned evictions "
            f"{s['pinned_evictions']}") in out
