"""store/wire.py: records <-> kvpool.v1 messages: exact round trips, and mismatched columns name the column."""

import dataclasses

import pytest

from kvpool.proto import kvpool_pb2 as pb
from kvpool.store import wire
from kvpool.store.node import Drop, Move
from kvpool.store.records import NodeInfo, ObjectRecord
from kvpool.tiers.types import Tier


def test_moves_drops_and_reports_round_trip():
    moves = [Move(b"k" * 16, b"n" * 16, 100, 2**64 - 1, Tier.DRAM, 4096, Tier.SSD, 0),
             Move(b"j" * 16, b"m" * 16, 7, 0, Tier.SSD, 8192, Tier.DRAM, 12288)]
    assert wire.moves_from_msg(pb.MoveRequest.FromString(wire.moves_to_msg(moves).SerializeToString())) == moves
    drops = [Drop(b"k" * 16, Tier.SSD, 4096, 100)]
    assert wire.drops_from_msg(wire.drops_to_msg(drops)) == drops
    both = pb.MoveRequest.FromString(wire.moves_to_msg(moves, drops).SerializeToString())   # a Demote with its drops
    assert (wire.moves_from_msg(both), wire.move_drops_from_msg(both)) == (moves, drops)
    assert wire.move_drops_from_msg(wire.moves_to_msg(moves)) == []
    records = [ObjectRecord(key=b"k" * 16, ns_digest=b"n" * 16, node_id="n1", tier=Tier.SSD, offset=0, size=5,
                            checksum=9)]
    assert wire.report_from_msg(wire.report_to_msg("n1", records)) == records
    stamped = [dataclasses.replace(records[0], written_us=2**64 - 1), dataclasses.replace(records[0], written_us=5)]
    assert wire.report_from_msg(pb.ReportObjectsRequest.FromString(
        wire.report_to_msg("n1", stamped).SerializeToString())) == stamped


def test_a_report_from_a_node_before_written_us_reads_as_unknown_times_and_a_short_column_is_refused():
    records = [ObjectRecord(key=b"k" * 16, ns_digest=b"n" * 16, node_id="n1", tier=Tier.SSD, offset=0, size=5,
                            checksum=9, written_us=7)] * 2
    msg = wire.report_to_msg("n1", records)
    del msg.written_us[:]                           # what a node from before 2026-12-06 sends
    assert [r.written_us for r in wire.report_from_msg(msg)] == [0, 0]
    msg.written_us.append(7)
    with pytest.raises(ValueError, match=r"^written_us: has 1 entries, keys has 2 \(send one per key, or none\)$"):
        wire.report_from_msg(msg)


def test_node_info_round_trips_through_the_endpoint():
    info = NodeInfo(node_id="n1", address="h:1", dram_bytes=1 << 20, ssd_bytes=2 << 20, ssd_record_overhead=4096,
                    alignment=4096, dram_path="/dev/shm/kvpool-x", incarnation="abc")
    ep = wire.endpoint_from_info(info, host_id="H", data_address="h:2", ssd_path="/ssd")
    assert (ep.host_id, ep.data_address, wire.dram_path(ep)) == ("H", "h:2", "/dev/shm/kvpool-x")
    assert wire.info_from_endpoint(ep) == info
    takes_ssd_rows = dataclasses.replace(info, ssd_index_rows=True)   # said at registration (a node since 2026-11-28)
    assert wire.info_from_endpoint(wire.endpoint_from_info(takes_ssd_rows, host_id="H", data_address="h:2")) \
        == takes_ssd_rows
    paged = dataclasses.replace(info, dram_pages="2 MiB pages, tmpfs huge=within_size")   # since 2026-11-29
    ep = wire.endpoint_from_info(paged, host_id="H", data_address="h:2")
    assert ep.dram_pages == "2 MiB pages, tmpfs huge=within_size" and wire.info_from_endpoint(ep) == paged
    assert "dram_pages" not in paged.persisted()      # said anew at each registration, never journalled
    carries = dataclasses.replace(info, move_drops=True)   # its Demote takes drops (a node since 2026-12-05)
    ep = wire.endpoint_from_info(carries, host_id="H", data_address="h:2")
    assert ep.move_drops and wire.info_from_endpoint(ep) == carries and "move_drops" not in carries.persisted()


def test_mismatched_columns_and_unknown_tiers_name_the_field():
    msg = wire.moves_to_msg([Move(b"k" * 16, b"n" * 16, 1, 0, Tier.DRAM, 0, Tier.SSD, 0)])
    msg.dst_offsets.append(5)
    with pytest.raises(ValueError, match=r"^dst_offsets: has 2 entries, keys has 1$"):
        wire.moves_from_msg(msg)
    bad = pb.DropRequest(keys=[b"k" * 16], tiers=[7], offsets=[0], sizes=[1])
    with pytest.raises(ValueError, match=r"^tiers\[0\]: unknown tier 7$"):
        wire.drops_from_msg(bad)
    with pytest.raises(ValueError, match=r"^drops\.tiers\[0\]: unknown tier 7$"):
        wire.move_drops_from_msg(pb.MoveRequest(drops=bad))
    with pytest.raises(ValueError, match=r"^drops\.objects_removed: only a Drop call says objects were removed$"):
        wire.move_drops_from_msg(pb.MoveRequest(drops=pb.DropRequest(objects_removed=True)))
