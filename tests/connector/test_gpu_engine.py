"""On a GPU: the bundled engine on CUDA with the connector's direct path (pinned pool memory, side-stream copies,
layer-wise loads), HBM <-> DRAM <-> SSD through an EmbeddedPool byte for byte, and a fault during a GPU load.

Every test here is marked `gpu` and skipped, with the reason printed, where torch or CuPy sees no CUDA device. They
pass on an NVIDIA H100 (2026-11-27, README "GPU"), loads going through kernels/mapped_scatter.py (`mapped_loads`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvpool.connector.config import ConnectorConfig
from kvpool.connector.connector import PoolConnector
from kvpool.embedded import EmbeddedPool
from kvpool.engine_adapter.llm import LLM
from kvpool.store.config import UpConfig
from kvpool.store.local_cluster import LocalCluster
from kvpool.tiers.gpu import unavailable_reason
from tests.connector.engines import ENGINE_ARGS, GREEDY, PREFIX, QUESTION_A, QUESTION_B
from tests.connector.test_direct_path import FaultAfter

if not torch.cuda.is_available():
    REASON = f"needs a CUDA device: torch {torch.__version__} sees none"
elif unavailable_reason() is not None:
    REASON = f"needs a CUDA device through CuPy: {unavailable_reason()}"
else:
    REASON = ""

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(REASON), reason=REASON or "-")]
CUDA = dict(ENGINE_ARGS, device="cuda")


def engine(pool=None, **config) -> LLM:
    connector = PoolConnector(ConnectorConfig(load_policy="always", **config), pool=pool) \
        if pool is not None or config else None
    return LLM(connector=connector, **CUDA)


def run(llm, question):
    out = llm.generate([PREFIX + question], GREEDY)[0]
    if llm.engine.connector is not None and hasattr(llm.engine.connector, "flush"):
        llm.engine.connector.flush()
    return out


@pytest.fixture(scope="module")
def reference_b_cuda() -> list[int]:
    return run(engine(), QUESTION_B).token_ids


@pytest.mark.parametrize("layerwise", ["on", "off"])
def test_b_loads_a_prefix_on_cuda_with_identical_output(layerwise, reference_b_cuda):
    with EmbeddedPool(dram_bytes=256 << 20) as pool:
        a = engine(pool, layerwise_load=layerwise)
        conn = a.engine.connector
        assert a.engine.runner.kv_cache.is_cuda and conn.direct
        run(a, QUESTION_A)
        assert conn.pin_report == {"local": "pinned"}
        assert conn.stats.saved_blocks > 0 and pool.stats()["objects"] == conn.stats.saved_blocks
        b = engine(pool, layerwise_load=layerwise)
        out = run(b, QUESTION_B)
        shared = len(b.engine.tokenizer.encode(PREFIX)) // 16 * 16
        assert out.num_cached_tokens_external >= shared - 16
        assert out.token_ids == reference_b_cuda
        assert b.engine.connector.stats.fallbacks == {}
        assert b.engine.connector.mapped_loads == 1       # the pinned arena read in place, two kernels per layer
        for llm in (a, b):
            llm.engine.connector.close()
        assert pool.stats()["leases_open"] == 0


def test_same_host_pool_arena_is_pinned_in_the_engine_process(port, shm_path, reference_b_cuda):
    cluster = LocalCluster(UpConfig(listen=f"127.0.0.1:{port}", http_listen="", shm_dir=str(shm_path),
                                    dram_bytes=256 << 20, ssd_path=None, node_id="n1")).start()
    try:
        a = LLM(connector=PoolConnector(ConnectorConfig(pool=cluster.address, load_policy="always")), **CUDA)
        run(a, QUESTION_A)
        b = LLM(connector=PoolConnector(ConnectorConfig(pool=cluster.address, load_policy="always")), **CUDA)
        out = run(b, QUESTION_B)
        assert out.num_cached_tokens_external > 0 and out.token_ids == reference_b_cuda
        assert b.engine.connector.pinned_memory() == {"n1": "pinned"}
        assert b.engine.connector.mapped_loads == 1       # the node's arena, mapped here, read in place
        for llm in (a, b):
            llm.engine.connector.close()
    finally:
        cluster.stop()


def test_tcp_loads_land_in_pinned_staging_read_in_place(port, shm_path, reference_b_cuda):
    """transport tcp: nothing is mapped from the node; the bytes come over the data channel into pinned staging
    buffers (torch's page-locked host memory), which the GPU then reads in place like an arena."""
    cluster = LocalCluster(UpConfig(listen=f"127.0.0.1:{port}", http_listen="", shm_dir=str(shm_path),
                                    dram_bytes=256 << 20, ssd_path=None, node_id="n1")).start()
    try:
        config = ConnectorConfig(pool=cluster.address, load_policy="always", transport="tcp")
        a = LLM(connector=PoolConnector(config), **CUDA)
        run(a, QUESTION_A)
        b = LLM(connector=PoolConnector(config), **CUDA)
        out = run(b, QUESTION_B)
        assert out.num_cached_tokens_external > 0 and out.token_ids == reference_b_cuda
        assert b.engine.connector.pinned_memory() == {"n1": "not mapped here (data channel, staged)"}
        assert b.engine.connector.mapped_loads == 1                   # the pinned staging buffers, read in place
        assert b.engine.connector.stats.fallbacks == {}
        for llm in (a, b):
            llm.engine.connector.close()
    finally:
        cluster.stop()


def test_a_fault_during_a_gpu_load_recomputes(reference_b_cuda):
    with EmbeddedPool(dram_bytes=256 << 20) as pool:
        run(engine(pool), QUESTION_A)
        b = engine(FaultAfter(pool, 2), load_chunk_blocks=3)
        out = run(b, QUESTION_B)
        assert out.num_cached_tokens_external == 3 * 16
        assert out.token_ids == reference_b_cuda
        assert b.engine.connector.stats.fallbacks == {"unreachable": 1}
        b.engine.connector.close()
        assert pool.stats()["leases_open"] == 0


def test_hbm_dram_ssd_round_trips_are_byte_exact(tmp_path, shm_path):
    size = 1 << 20
    with EmbeddedPool(hbm_bytes=2 * size, dram_bytes=2 * size, ssd_path=str(tmp_path), ssd_bytes=16 * size,
                      shm_dir=str(shm_path), promote_on_hit=False, write_behind=False) as pool:  # exclusive tiers
        assert pool.node.dram.pinned                                   # the node pins its arena when it has HBM
        data = {i: np.random.default_rng(i).integers(0, 256, size, dtype=np.uint8) for i in range(6)}
        key = {i: bytes([i + 1]) * 16 for i in range(6)}
        for i in range(6):                                             # one at a time: each demotes the coldest
            assert pool.put_many([key[i]], [data[i]]) == ["stored"]
        tiers = [rec.tier.label for rec in pool.master.inspect([key[i] for i in range(6)])]
        assert tiers == ["ssd", "ssd", "dram", "dram", "hbm", "hbm"]
        out = [np.zeros(size, np.uint8) for _ in range(6)]
        assert pool.get_many_into([key[i] for i in range(6)], out) == 6
        assert all(np.array_equal(out[i], data[i]) for i in range(6))
        with pool.acquire_many([key[i] for i in range(6)], [size] * 6) as read:
            assert read.count == 6 and read.tiers == tiers
            assert read.direct == [False, False, True, True, True, True]
            hbm_view = torch.from_dlpack(read.buffers[4])               # the HBM extent itself, through DLPack
            assert hbm_view.is_cuda and torch.equal(hbm_view.cpu(), torch.from_numpy(data[4]))
