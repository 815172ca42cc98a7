"""store/leases.py ids: where a master process starts numbering, and the argument that sets it."""

import pytest

from kvpool.store.index import Index
from kvpool.store.leases import ID_STRIDE, Leases, first_id


def test_first_id_is_the_start_in_microseconds_times_the_stride():
    t = 1_796_000_000_123_456_000                     # unix ns, 2026-12, on a microsecond
    assert first_id(t) == 1_796_000_000_123_456 * ID_STRIDE
    assert first_id(t + 1000) - first_id(t) == ID_STRIDE       # a process a microsecond later starts a stride above
    assert first_id(t + 999) == first_id(t)
    assert first_id((1 << 63) // ID_STRIDE * 1000 - 1000) < 1 << 63   # still an int64 in the year 2112
    assert first_id(0) == ID_STRIDE


def test_ids_count_up_from_first_across_grants_and_leases():
    leases = Leases(Index(8), None, first=5)
    assert leases.grant(0, 10.0) == 5
    assert leases.new_id() == 6
    assert leases.grant(1, 10.0) == 7


@pytest.mark.parametrize("bad", [0, -1, 1 << 63, True, 1.5, "7"])
def test_a_bad_first_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"^first must be an int in \[1, 2\*\*63\)"):
        Leases(Index(8), None, first=bad)
