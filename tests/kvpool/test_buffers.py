"""kvpool/buffers.py: every accepted buffer kind becomes a flat uint8 view of the SAME memory; torch is never
imported by the module itself."""

import subprocess
import sys

import numpy as np
import pytest

from kvpool.buffers import as_bytes, as_writable_bytes, byte_views


def test_bytes_like_and_numpy_are_views_not_copies():
    ba = bytearray(b"abcd")
    v = as_writable_bytes(ba, "b")
    v[0] = ord("z")
    assert ba == b"zbcd" and v.format == "B" and v.ndim == 1
    arr = np.zeros((2, 3), dtype=np.float32)
    v = as_writable_bytes(arr, "b")
    assert v.nbytes == 24
    v[:4] = np.float32(1.5).tobytes()
    assert arr[0, 0] == 1.5
    assert as_bytes(b"xy", "b").tobytes() == b"xy" and as_bytes(memoryview(b"xy"), "b").readonly


def test_mistakes_name_the_argument():
    with pytest.raises(ValueError, match=r"buffers\[2\] is read-only \(bytes\)"):
        as_writable_bytes(b"abc", "buffers[2]")
    with pytest.raises(ValueError, match=r"x must be bytes-like, a numpy array or a CPU torch tensor, got int"):
        as_bytes(3, "x")
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        as_bytes(np.zeros((4, 4))[:, 1], "x")
    ro = np.zeros(4, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="x is read-only"):
        as_writable_bytes(ro, "x")


def test_byte_views_of_a_batch_agree_with_the_one_by_one_conversions():
    """byte_views takes flat uint8 arrays and byte memoryviews as they are and everything else the general way:
    the same memory, the same formats, and each mistake named by its position."""
    flat = np.arange(8, dtype=np.uint8)
    batch = [flat, memoryview(bytearray(b"abc")), np.zeros((2, 2), np.float32), bytearray(b"xy"), flat[:0]]
    views = byte_views(batch, "buffers", writable=True)
    want = [as_writable_bytes(b, "b") for b in batch]
    assert [(v.tobytes(), v.format, v.ndim, v.readonly) for v in views] == \
        [(w.tobytes(), w.format, w.ndim, w.readonly) for w in want]
    views[0][3] = 99
    assert flat[3] == 99
    ro = np.zeros(4, np.uint8)
    ro.flags.writeable = False
    assert byte_views([ro, memoryview(b"ab")], "buffers", writable=False)[1].readonly
    for bad, why in ((ro, r"buffers\[1\] is read-only \(ndarray\)"), (memoryview(b"ab"), r"buffers\[1\] is read-only"),
                     (np.zeros(8, np.uint8)[::2], r"buffers\[1\] must be C-contiguous"),
                     (3, r"buffers\[1\] must be bytes-like")):
        with pytest.raises(ValueError, match=why):
            byte_views([flat, bad], "buffers", writable=True)


def test_torch_tensors_share_memory_and_bad_ones_are_refused():
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, dtype=torch.bfloat16)
    v = as_writable_bytes(t, "t")
    assert v.nbytes == 8
    v[:2] = torch.tensor([2.0], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    assert t[0].item() == 2.0
    with pytest.raises(ValueError, match="t must be a contiguous tensor"):
        as_bytes(torch.zeros(4, 4).t(), "t")
    assert as_bytes(torch.zeros(3, 5, dtype=torch.float16), "t").nbytes == 30


def test_module_does_not_import_torch():
    code = "import sys, kvpool.buffers, kvpool.embedded; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
