"""The master's traffic recorder (store/recorder.py) on a real Master and a real master gRPC server on 127.0.0.1:
exact rows read back from the real Parquet files, off writes nothing, bad arguments named with nothing started,
rolling files within their bound, the duration ends the recording, file writes never hold the master lock,
tenants recorded by their stored keys, and the wire codes of StartRecording / StopRecording."""

from __future__ import annotations

import threading
import time

import grpc
import pyarrow.parquet as pq
import pytest
import xxhash

from kvpool.planner import NullNode
from kvpool.proto import kvpool_pb2 as pb
from kvpool.proto import kvpool_pb2_grpc as pbg
from kvpool.store import traffic
from kvpool.store.config import MasterConfig, MasterServerConfig
from kvpool.store.master import Master, RecordingActive
from kvpool.store.master_server import MasterServer
from kvpool.store.records import NodeInfo, NsRef
from kvpool.store.traffic import key_ids

UNIT = 4096
NS = NsRef(bytes(range(16)), "model/t", 16)


def keys(n: int, salt: str = "") -> list[bytes]:
    return [xxhash.xxh3_128_digest(f"{salt}{i}".encode()) for i in range(n)]


def master(capacity_blocks: int = 64, **kw) -> Master:
    m = Master(MasterConfig(), **kw)
    m.register_node(NodeInfo(node_id="n", dram_bytes=capacity_blocks * UNIT, alignment=UNIT), NullNode(),
                    expires=False)
    return m


def put(m: Master, ks: list[bytes], ns: NsRef = NS, tenant: str = "") -> int:
    results = m.put_start(ks, [UNIT] * len(ks), ns, tenant=tenant)
    grants = [r.grant.grant_id for r in results if r.grant is not None]
    m.put_commit(grants, [0] * len(grants), tenant=tenant)
    return len(grants)


def wait_for(predicate, what: str, deadline_s: float = 10.0) -> None:
    end = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def rows_of(status) -> list[dict]:
    return [r for f in status.files for r in pq.read_table(f).to_pylist()]


def test_every_lookup_and_put_is_one_exact_row(tmp_path):
    m = master()
    chain = keys(6)
    status = m.start_recording(tmp_path / "rec")
    assert status.recording and status.directory == str(tmp_path / "rec") and status.files == []
    assert put(m, chain[:4]) == 4
    assert m.lookup(chain, NS, lease=False).hits == 4                # a probe (lookup_prefix)
    r = m.lookup(chain[:3], NsRef(NS.digest))                        # a load: leased, no block_tokens
    m.release([r.lease_id])
    assert put(m, chain) == 2                                        # 4 exist, 2 granted
    final = m.stop_recording()
    assert not final.recording and final.rows == 4 and final.dropped == 0 and len(final.files) == 1
    assert m.recorder is None
    rows = rows_of(final)
    assert [r["op"] for r in rows] == ["put", "probe", "lookup", "put"]
    assert [r["keys"] for r in rows] == [key_ids(c).tolist() for c in (chain[:4], chain, chain[:3], chain)]
    assert [(r["hits"], r["hits_hbm"], r["hits_dram"], r["hits_ssd"]) for r in rows] == \
        [(4, 0, 4, 0), (4, 0, 4, 0), (3, 0, 3, 0), (2, 0, 2, 0)]
    assert [(r["tokens"], r["block_tokens"]) for r in rows] == [(64, 16), (96, 16), (0, 0), (96, 16)]
    assert [r["namespace"] for r in rows] == [NS.digest] * 4
    assert [r["ns_label"] for r in rows] == ["model/t", "model/t", "", "model/t"]
    times = [r["time"] for r in rows]
    assert times == sorted(times) and len(set(times)) == 4          # strictly increasing, in call order


def test_recording_off_writes_nothing_and_a_stopped_recording_records_no_more(tmp_path):
    m = master()
    assert m.recorder is None                                        # off by default
    assert m.stop_recording().as_dict() == {"recording": False, "directory": "", "files": [], "rows": 0,
                                            "dropped": 0, "duration_s": 0.0, "elapsed_s": 0.0,
                                            "max_file_bytes": 64 << 20, "max_files": 0}
    put(m, keys(3))
    m.lookup(keys(3), NS)
    m.start_recording(tmp_path)
    m.lookup(keys(3), NS, lease=False)
    final = m.stop_recording()
    before = sorted(p.name for p in tmp_path.iterdir())
    put(m, keys(3, "more"))
    m.lookup(keys(3), NS, lease=False)
    assert m.stop_recording().rows == final.rows == 1                # idempotent: the last recording's status
    assert sorted(p.name for p in tmp_path.iterdir()) == before and len(before) == 1
    assert [r["op"] for r in rows_of(final)] == ["probe"]


def test_bad_arguments_are_named_and_nothing_starts(tmp_path):
    m = master()
    afile = tmp_path / "a-file"
    afile.write_text("x")
    cases = [(dict(directory=tmp_path / "d1", duration_s=-1.0), "duration_s must be a number of seconds >= 0"),
             (dict(directory=tmp_path / "d2", duration_s=float("nan")), "duration_s must be"),
             (dict(directory=tmp_path / "d3", max_file_bytes=0), "max_file_bytes must be an int >= 1"),
             (dict(directory=tmp_path / "d4", max_files=-2), "max_files must be an int >= 0"),
             (dict(directory=""), "directory must be a non-empty path"),
             (dict(directory=afile / "sub"), f"directory {str(afile / 'sub')!r} is not writable by the master")]
    for kwargs, message in cases:
        directory = kwargs.pop("directory")
        with pytest.raises(ValueError) as err:
            m.start_recording(directory, **kwargs)
        assert str(err.value).startswith(message), (kwargs, str(err.value))
        assert m.recorder is None
        assert not any(t.name == "kvpool-recorder" for t in threading.enumerate())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no directory was created
    m.start_recording(tmp_path / "ok")
    with pytest.raises(RecordingActive, match="already recording to"):
        m.start_recording(tmp_path / "other")
    assert m.recorder.status.directory == str(tmp_path / "ok")
    m.stop_recording()
    assert not (tmp_path / "other").exists()


def test_files_roll_within_their_bound_and_max_files_keeps_the_newest(tmp_path):
    m = master(capacity_blocks=4096)
    bound = 4096
    m.start_recording(tmp_path, max_file_bytes=bound, max_files=3)
    rec = m.recorder
    for burst in range(6):                    # each burst becomes one row group (the writer drains between)
        for i in range(40):
            m.lookup(keys(16, f"{burst}-{i}"), NS, lease=False)
        n = 40 * (burst + 1)
        wait_for(lambda n=n: rec.status.rows >= n, f"{n} rows written")
    final = m.stop_recording()
    files = sorted(tmp_path.glob("*.parquet"))
    assert [str(f) for f in files] == final.files and len(files) == 3    # older ones were deleted
    assert final.rows == 240 and final.dropped == 0
    group = max(pq.ParquetFile(f).metadata.row_group(i).total_byte_size for f in files
                for i in range(pq.ParquetFile(f).metadata.num_row_groups))
    for f in files[:-1]:
        assert f.stat().st_size < bound + group + 4096, (f, f.stat().st_size)  # past the bound by <= 1 group
    assert not list(tmp_path.glob("*.part"))


def test_the_duration_ends_the_recording_by_itself(tmp_path):
    m = master()
    m.start_recording(tmp_path, duration_s=0.3)
    rec = m.recorder
    m.lookup(keys(2), NS, lease=False)
    assert rec.done.wait(10)
    assert m.recorder is None
    m.lookup(keys(2), NS, lease=False)      # after the end: not recorded
    status = m.recording_status()
    assert not status.recording and status.rows == 1 and status.elapsed_s >= 0.3
    assert len(rows_of(status)) == 1


def test_file_writes_never_hold_the_master_lock(tmp_path, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    original = traffic.TrafficWriter.flush

    def slow_flush(self):
        if self._time:                       # a row group is being written: stall the writer thread here
            entered.set()
            release.wait(10)
        original(self)

    monkeypatch.setattr(traffic.TrafficWriter, "flush", slow_flush)
    m = master()
    m.start_recording(tmp_path)
    put(m, keys(4))
    assert entered.wait(10)                  # the writer thread is inside a file write now
    done = threading.Event()

    def client():
        put(m, keys(4, "b"))
        assert m.lookup(keys(4, "b"), NS, lease=False).hits == 4
        done.set()

    t = threading.Thread(target=client)
    t.start()
    try:
        assert done.wait(10), "the master blocked while the recorder wrote a file"
    finally:
        release.set()
        t.join(10)
    assert m.stop_recording().rows == 3


def test_tenant_calls_record_the_stored_keys_never_the_clients(tmp_path):
    m = master(tenants=["acme"])
    chain = keys(3)
    m.start_recording(tmp_path)
    put(m, chain, tenant="acme")
    m.lookup(chain, NS, lease=False, tenant="acme")
    rows = rows_of(m.stop_recording())
    stored = m.tenants.stored_keys(m.tenants.id_of("acme"), chain)
    assert stored != chain
    assert [r["keys"] for r in rows] == [key_ids(stored).tolist()] * 2
    assert not set(key_ids(chain).tolist()) & set(rows[0]["keys"])
    assert [r["ns_label"] for r in rows] == ["model/t", "model/acme"]   # a lookup is labelled with its tenant


@pytest.fixture
def server(tmp_path):
    s = MasterServer(MasterServerConfig(listen="127.0.0.1:0")).start()
    yield s
    s.stop(0)


def test_the_rpcs_name_the_field_and_refuse_a_second_recording(server, tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    with grpc.insecure_channel(server.address) as ch:
        stub = pbg.MasterServiceStub(ch)
        bad = [(pb.StartRecordingRequest(directory=str(tmp_path / "a"), duration_s=-5), "duration_s"),
               (pb.StartRecordingRequest(directory=str(tmp_path / "a"), max_file_bytes=0), "max_file_bytes"),
               (pb.StartRecordingRequest(directory=str(afile / "x")), "directory"),
               (pb.StartRecordingRequest(), "directory")]
        for request, field in bad:
            with pytest.raises(grpc.RpcError) as err:
                stub.StartRecording(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details().startswith(field), err.value.details()
        assert server.master.recorder is None and not (tmp_path / "a").exists()
        status = stub.StartRecording(pb.StartRecordingRequest(directory=str(tmp_path / "rec"), duration_s=60,
                                                              max_file_bytes=1 << 20), timeout=10)
        assert (status.recording, status.directory, status.duration_s, status.max_file_bytes) == \
            (True, str(tmp_path / "rec"), 60.0, 1 << 20)
        with pytest.raises(grpc.RpcError) as err:
            stub.StartRecording(pb.StartRecordingRequest(directory=str(tmp_path / "other")), timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "already recording to" in err.value.details()
        server.master.register_node(NodeInfo(node_id="n", dram_bytes=16 * UNIT, alignment=UNIT), NullNode(),
                                    expires=False)
        reply = stub.Lookup(pb.LookupRequest(keys=keys(2)), timeout=10)
        assert reply.hits == 0
        final = stub.StopRecording(pb.StopRecordingRequest(), timeout=30)
        assert not final.recording and final.rows == 1 and len(final.files) == 1
        assert pq.read_table(final.files[0]).column("op").to_pylist() == ["probe"]   # lease unset


def test_a_writer_that_falls_behind_drops_and_counts_rows_never_blocks(tmp_path):
    from kvpool.store.recorder import Recorder

    rec = Recorder(tmp_path, max_buffered_rows=3)      # its writer thread not started: nothing drains the buffer
    for i in range(5):
        rec.lookup(1e9 + i, NS, keys(2, str(i)), [1, 1], True)
    assert rec.status.dropped == 2
    status = rec.stop()
    assert (status.rows, status.dropped, status.recording) == (3, 2, False)
    assert [r["keys"] for r in rows_of(status)] == [key_ids(keys(2, str(i))).tolist() for i in range(3)]


def test_a_continued_lookup_is_not_recorded(tmp_path):
    m = master()
    m.start_recording(tmp_path)
    rec = m.recorder
    m.lookup(keys(4), NS, lease=False)
    m.lookup(keys(4)[2:], NS, lease=True, continued=True)
    m.lookup(keys(4)[2:], NS, lease=True)
    wait_for(lambda: rec.status.rows >= 2, "2 rows written")
    final = m.stop_recording()
    assert final.rows == 2 and final.dropped == 0
