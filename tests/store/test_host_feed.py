"""HostIndexFeed (store/host_feed.py): commits reach the node off the caller's path, coalesced; a removal never lets a
publication made before it land after it; a node that does not answer loses publications, nothing else."""

from __future__ import annotations

import threading

import pytest

from kvpool.store.host_feed import HostIndexFeed
from kvpool.store.node import NodeUnavailable, Publication
from kvpool.tiers.types import Tier
from tests.store.test_control_channel import wait_until


def key(i: int) -> bytes:
    return (0xFE << 120 | i).to_bytes(16, "big")


class Node:
    """PublishOps that records what it was sent; `hold` keeps the next call in flight until released."""

    def __init__(self) -> None:
        self.got: list[Publication] = []
        self.events: list[str] = []
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def publish(self, p: Publication) -> int:
        if self.hold.is_set():
            self.hold.clear()
            self.entered.set()
            self.release.wait(10)
        if self.fail:
            raise NodeUnavailable("node n1: UNAVAILABLE")
        self.got.append(p)
        self.events.append(f"sent {len(p.keys)}")
        return len(p.keys)


def test_commits_and_gone_keys_reach_the_node_in_order():
    feed, node = HostIndexFeed(), Node()
    try:
        feed.committed("n1", node, [key(0), key(1)], [0, 64], [64, 64], [1, 2], [Tier.DRAM] * 2)
        feed.gone("n1", node, [key(9)])
        assert feed.flush(10)
        got = [(p.keys, p.offsets, p.sizes, p.checksums, p.gone) for p in node.got]
        assert got in ([((key(0), key(1)), (0, 64), (64, 64), (1, 2), (key(9),))],        # coalesced
                       [((key(0), key(1)), (0, 64), (64, 64), (1, 2), ()), ((), (), (), (), (key(9),))])
        assert feed.as_dict() == {"published": 2, "gone": 1, "failed": 0, "dropped": 0}
    finally:
        feed.close()


def test_a_removal_waits_for_the_send_in_flight_and_drops_what_was_queued_before_it():
    feed, node = HostIndexFeed(), Node()
    try:
        node.hold.set()
        feed.committed("n1", node, [key(0)], [0], [64], [1], [Tier.DRAM])            # taken by the sender, held in flight
        assert node.entered.wait(10)
        feed.committed("n1", node, [key(1), key(2)], [64, 128], [64, 64], [2, 3], [Tier.DRAM] * 2)    # queued behind it
        removal = threading.Thread(target=lambda: (feed.removed("n1"), node.events.append("removed")))
        removal.start()
        wait_until(lambda: feed.dropped == 2, "the queued entries dropped")
        assert removal.is_alive()                                        # it waits for the send in flight
        node.release.set()
        removal.join(10)
        assert node.events == ["sent 1", "removed"]
        feed.committed("n1", node, [key(3)], [192], [64], [4], [Tier.DRAM])            # after the removal: published
        assert feed.flush(10)
        assert [p.keys for p in node.got] == [(key(0),), (key(3),)]
        assert feed.as_dict() == {"published": 2, "gone": 0, "failed": 0, "dropped": 2}
    finally:
        node.release.set()
        feed.close()


def test_a_removal_of_some_keys_drops_only_their_queued_entries_and_keeps_the_order_of_the_rest():
    """While a send is in flight: commits of keys 1-4, a gone of key 5, a commit of key 5 again and a gone of key 2;
    then a removal of keys 2 and 3 (a node that forgets removed keys only). It waits for the send in flight, drops
    the two queued entries of keys 2 and 3, and what stays keeps its order: key 5's new row survives its gone."""
    feed, node = HostIndexFeed(), Node()
    try:
        node.hold.set()
        feed.committed("n1", node, [key(0)], [0], [64], [1], [Tier.DRAM])
        assert node.entered.wait(10)
        feed.committed("n1", node, [key(1), key(2), key(3), key(4)], [64, 128, 192, 256], [64] * 4, [2, 3, 4, 5],
                       [Tier.DRAM] * 4)
        feed.gone("n1", node, [key(5)])
        feed.committed("n1", node, [key(5)], [320], [64], [6], [Tier.SSD])
        feed.gone("n1", node, [key(2)])
        removal = threading.Thread(target=lambda: (feed.removed("n1", [key(2), key(3)]),
                                                   node.events.append("removed")))
        removal.start()
        wait_until(lambda: feed.dropped == 2, "the removed keys' entries dropped")
        assert removal.is_alive()                                        # it waits for the send in flight
        node.release.set()
        removal.join(10)
        assert node.events[:2] == ["sent 1", "removed"]
        assert feed.flush(10)
        got = [(p.keys, p.offsets, p.checksums, p.gone, p.tiers) for p in node.got]
        assert got == [((key(0),), (0,), (1,), (), (Tier.DRAM,)),
                       ((key(1), key(4), key(5)), (64, 256, 320), (2, 5, 6), (key(2),),
                        (Tier.DRAM, Tier.DRAM, Tier.SSD))]
        assert feed.as_dict() == {"published": 4, "gone": 1, "failed": 0, "dropped": 2}
    finally:
        node.release.set()
        feed.close()


def test_a_node_that_does_not_answer_loses_the_publication_and_the_feed_goes_on():
    feed, node = HostIndexFeed(), Node()
    try:
        node.fail = True
        feed.committed("n1", node, [key(0)], [0], [64], [1], [Tier.DRAM])
        assert feed.flush(10)
        node.fail = False
        feed.committed("n1", node, [key(1)], [64], [64], [2], [Tier.DRAM])
        assert feed.flush(10)
        assert [p.keys for p in node.got] == [(key(1),)]
        assert feed.as_dict() == {"published": 1, "gone": 0, "failed": 1, "dropped": 0}
    finally:
        feed.close()


def test_within_one_batch_the_last_word_on_a_key_wins():
    """A commit then an eviction of key 1, an eviction then a new commit of key 2, all queued while a send is in
    flight (so they leave in one Publication): the node, which applies a batch's gone before its entries, must end
    without key 1's row and with key 2's new one."""
    feed, node = HostIndexFeed(), Node()
    try:
        node.hold.set()
        feed.committed("n1", node, [key(0)], [0], [64], [1], [Tier.DRAM])
        assert node.entered.wait(10)
        feed.committed("n1", node, [key(1), key(3)], [64, 192], [64, 64], [2, 4], [Tier.DRAM, Tier.SSD])
        feed.gone("n1", node, [key(1)])
        feed.gone("n1", node, [key(2)])
        feed.committed("n1", node, [key(2)], [128], [64], [3], [Tier.DRAM])
        node.release.set()
        assert feed.flush(10)
        got = [(p.keys, p.offsets, p.sizes, p.checksums, p.gone, p.tiers) for p in node.got]
        assert got == [((key(0),), (0,), (64,), (1,), (), (Tier.DRAM,)),
                       ((key(3), key(2)), (192, 128), (64, 64), (4, 3), (key(1),), (Tier.SSD, Tier.DRAM))]
        rows: dict[bytes, int] = {}
        for p in node.got:                  # as StorageNode.publish applies them
            for k in p.gone:
                rows.pop(k, None)
            rows.update(zip(p.keys, p.offsets))
        assert rows == {key(0): 0, key(3): 192, key(2): 128}
        assert feed.as_dict() == {"published": 3, "gone": 1, "failed": 0, "dropped": 0}
    finally:
        node.release.set()
        feed.close()


def test_a_full_queue_drops_its_oldest_entries_and_keeps_the_order_of_what_stays(monkeypatch):
    """Past MAX_QUEUED the oldest entries go (counted); a gone queued after an entry that stays still wins over it."""
    from kvpool.store import host_feed

    monkeypatch.setattr(host_feed, "MAX_QUEUED", 4)
    feed, node = HostIndexFeed(), Node()
    try:
        node.hold.set()
        feed.committed("n1", node, [key(0)], [0], [64], [1], [Tier.DRAM])
        assert node.entered.wait(10)
        feed.committed("n1", node, [key(1), key(2), key(3)], [64, 128, 192], [64] * 3, [2, 3, 4], [Tier.DRAM] * 3)
        feed.gone("n1", node, [key(2)])
        feed.committed("n1", node, [key(4), key(5)], [256, 320], [64] * 2, [5, 6], [Tier.DRAM] * 2)  # key(1) is cut
        node.release.set()
        assert feed.flush(10)
        assert [(p.keys, p.gone) for p in node.got] == [((key(0),), ()), ((key(3), key(4), key(5)), (key(2),))]
        assert feed.as_dict() == {"published": 4, "gone": 1, "failed": 0, "dropped": 1}
    finally:
        node.release.set()
        feed.close()


def test_under_a_stream_of_commits_the_next_send_waits_out_the_interval_and_takes_them_all():
    # the first commit goes at once; the three made while the feed waits out its interval share one Publish call
    feed, node = HostIndexFeed(interval_s=1.0), Node()
    try:
        feed.committed("n1", node, [key(0)], [0], [64], [1], [Tier.DRAM])
        wait_until(lambda: len(node.got) == 1, "the first commit sent")
        for i in (1, 2, 3):
            feed.committed("n1", node, [key(i)], [64 * i], [64], [i + 1], [Tier.DRAM])
        assert feed.flush(10)
        assert [p.keys for p in node.got] == [(key(0),), (key(1), key(2), key(3))]
        assert feed.as_dict() == {"published": 4, "gone": 0, "failed": 0, "dropped": 0}
    finally:
        feed.close()


def test_the_interval_is_checked():
    for bad in (-1, True, "5ms", float("nan")):
        with pytest.raises(ValueError, match="interval_s"):
            HostIndexFeed(interval_s=bad)
