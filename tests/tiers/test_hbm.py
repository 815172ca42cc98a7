"""HbmArena / cuda_available: a clean refusal without CUDA; a real round trip where a GPU exists."""

from __future__ import annotations

import numpy as np
import pytest

from kvpool.tiers.gpu import unavailable_reason
from kvpool.tiers.hbm import HbmArena, cuda_available

NO_GPU = f"needs a CUDA device: {unavailable_reason()}"


def test_without_cuda_construction_is_refused():
    if cuda_available():
        pytest.skip("CUDA present")
    message = f"no CUDA device: {unavailable_reason()}"
    with pytest.raises(RuntimeError) as err:
        HbmArena(4096)
    assert str(err.value) == message
    with pytest.raises(RuntimeError) as err:
        HbmArena.create(4096)
    assert str(err.value) == message


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason=NO_GPU)
def test_round_trip_on_device():
    data = np.random.default_rng(3).integers(0, 256, 1 << 16, dtype=np.uint8)
    with HbmArena(1 << 20) as hbm:
        assert hbm.write(4096, data) == data.nbytes
        out = np.zeros_like(data)
        assert hbm.read_into(4096, out) == data.nbytes
        assert np.array_equal(out, data)
        with pytest.raises(ValueError, match="exceeds the arena capacity"):
            hbm.write((1 << 20) - 10, data)
