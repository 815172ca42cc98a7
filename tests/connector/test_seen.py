"""connector/seen.py: request counts per block key for the after_n_hits save policy, bounded LRU-first."""

from kvpool.connector.seen import SeenCounts


def test_counts_requests_and_forgets_the_least_recently_requested_key_first():
    seen = SeenCounts(capacity=3)
    seen.remember([b"a", b"b", b"c"])
    seen.remember([b"a"])                      # a is now the most recent, b the least
    assert [seen.count(k) for k in (b"a", b"b", b"c", b"d")] == [2, 1, 1, 0]
    seen.remember([b"d"])                      # over capacity: b goes
    assert [seen.count(k) for k in (b"a", b"b", b"c", b"d")] == [2, 0, 1, 1]
    seen.remember([b"b"])                      # b comes back as new; c (least recent) goes
    assert [seen.count(k) for k in (b"a", b"b", b"c", b"d")] == [2, 1, 0, 1]
