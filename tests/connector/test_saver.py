"""connector/saver.py SaveBuffers: copy-out buffers come back once every batch cut from them is done, and are reused
(already paged in) up to a bound; and BlockSaver calls a batch's on_done after its put, whatever the put did."""

from __future__ import annotations

import torch

from kvpool.connector.saver import BlockSaver, SaveBatch, SaveBuffers


def test_a_buffer_is_reused_only_after_its_last_batch_is_done_and_within_the_bound():
    bufs = SaveBuffers(row_bytes=8, keep_rows=5)
    a = bufs.take(3)
    assert a.shape == (3, 8) and a.dtype == torch.uint8
    done = bufs.after(2, a)
    done()
    assert bufs.take(2).data_ptr() != a.data_ptr()        # one batch of two still reads it
    done()
    b = bufs.take(2)                                       # the smallest spare that fits: a itself
    assert b.data_ptr() == a.data_ptr() and b.shape[0] == 3
    bufs.give_back(b)
    big = bufs.take(4)                                     # no spare fits: a new one, a stays
    assert big.shape == (4, 8)
    bufs.give_back(big)                                    # 3 + 4 rows > 5: not kept
    assert bufs.take(4).data_ptr() != big.data_ptr()
    assert bufs.take(1).data_ptr() == a.data_ptr()


def test_a_spare_is_taken_from_among_others_of_any_shape():
    # the vLLM worker keeps a 2-row spare (a short prompt's save) beside a 32-row one (a 4K prompt's): taking the
    # larger must not compare the tensors (list.remove did: the second 4K save raised and was dropped, 2026-11-29)
    bufs = SaveBuffers(row_bytes=8, keep_rows=70)
    small, large, same = bufs.take(2), bufs.take(32), bufs.take(32)
    for buf in (small, large, same):
        bufs.give_back(buf)
    got = bufs.take(20)
    assert got.data_ptr() == large.data_ptr() and got.shape == (32, 8)
    got2 = bufs.take(32)                                   # the other 32-row spare, not a new buffer
    assert got2.data_ptr() == same.data_ptr()
    assert bufs.take(1).data_ptr() == small.data_ptr()
    assert bufs.take(1).data_ptr() not in {small.data_ptr(), large.data_ptr(), same.data_ptr()}   # none left


class _Pool:
    def __init__(self, fail: bool) -> None:
        self.fail, self.puts = fail, []

    def put_many(self, keys, rows, namespace=None, pin_s=0.0):
        if self.fail:
            raise ConnectionError("pool gone")
        self.puts.append([bytes(r) for r in rows])
        return ["stored"] * len(keys)


def test_the_saver_calls_on_done_after_the_put_and_after_a_failed_one():
    for fail in (False, True):
        pool, events, errors = _Pool(fail), [], []
        saver = BlockSaver(lambda pool=pool: pool, max_blocks=8,
                           on_saved=lambda s, e, events=events: events.append(("saved", s)), on_error=errors.append)
        blocks = torch.arange(6, dtype=torch.uint8).view(2, 3)
        done = SaveBatch([b"k1", b"k2"], blocks, None, on_done=lambda events=events: events.append(("done",)))
        assert saver.offer(done)
        assert saver.flush(10)
        saver.close()
        if fail:
            assert events == [("done",)] and [type(e) for e in errors] == [ConnectionError]
        else:
            assert events == [("saved", 2), ("done",)] and pool.puts == [[b"\x00\x01\x02", b"\x03\x04\x05"]]
