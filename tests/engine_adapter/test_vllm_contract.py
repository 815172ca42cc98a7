"""KVPoolConnector against vLLM 0.32.0's KVConnectorBase_V1: every abstract method implemented, every override with
the base's signature, the metadata/stats classes on vLLM's ABCs. Runs in the vLLM environment (a subprocess of
.venv-vllm's python, since vLLM's pins conflict with this one); skipped, saying why, where it is absent."""

from __future__ import annotations

import json
import subprocess

import pytest

from kvpool.engine_adapter.vllm.instance import skip_reason, vllm_python

pytestmark = pytest.mark.vllm

PROBE = r"""
import inspect, json
import vllm
from vllm.distributed.kv_transfer.kv_connector.v1 import base
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from kvpool.engine_adapter.vllm import connector as m

B, C = base.KVConnectorBase_V1, m.KVPoolConnector
def sig(f):
    return [(p.name, p.kind.name) for p in inspect.signature(f).parameters.values()]
overridden = sorted(n for n, v in vars(C).items() if callable(v) or isinstance(v, (classmethod, property)))
mismatch = {}
for name in overridden:
    if not hasattr(B, name) or isinstance(getattr(B, name), property):
        continue
    want, got = sig(getattr(B, name)), sig(getattr(C, name))
    if want != got:
        mismatch[name] = [want, got]
print(json.dumps({
    "version": vllm.__version__,
    "abstract_left": sorted(C.__abstractmethods__),
    "base_abstract": sorted(B.__abstractmethods__),
    "overridden": overridden,
    "mismatch": mismatch,
    "metadata_ok": issubclass(m.KVPoolConnectorMetadata, base.KVConnectorMetadata),
    "worker_meta_ok": issubclass(m.KVPoolWorkerMeta, base.KVConnectorWorkerMetadata)
                      and not m.KVPoolWorkerMeta.__abstractmethods__,
    "stats_ok": issubclass(m.KVPoolConnectorStats, KVConnectorStats),
    "prom_ok": issubclass(m.KVPoolPromMetrics, KVConnectorPromMetrics),
    "stats_roundtrip": C.build_kv_connector_stats({"requested_tokens": 5, "pool_hit_tokens": {"dram": 4}})
        .aggregate(m.KVPoolConnectorStats(data={"pool_hit_tokens": {"dram": 1, "ssd": 2}})).reduce(),
    "delivery": C.requires_kv_delivery.fget(object.__new__(C)),
}))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    reason = skip_reason()
    if reason:
        print(f"SKIPPED vLLM contract test: {reason}")
        pytest.skip(reason)
    # not from the checkout: `-c` puts the cwd first on sys.path, where the checkout's kernels/ would shadow Hugging
    # Face's `kernels` for a transformers that imports it (tests/conftest.py); kvpool is installed in vLLM's env
    out = subprocess.run([str(vllm_python()), "-c", PROBE], capture_output=True, text=True, timeout=300,
                         cwd=str(tmp_path_factory.mktemp("vllm-probe")),
                         env={"VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pinned_vllm_version(probe):
    assert probe["version"] == "0.32.0"


def test_every_abstract_method_is_implemented(probe):
    assert probe["abstract_left"] == []
    assert set(probe["base_abstract"]) == {"start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                                           "get_num_new_matched_tokens", "update_state_after_alloc",
                                           "build_connector_meta"}
    assert set(probe["base_abstract"]) <= set(probe["overridden"])


def test_overrides_keep_the_base_signatures(probe):
    assert probe["mismatch"] == {}
    assert {"get_block_ids_with_load_errors", "get_kv_connector_stats", "build_kv_connector_stats",
            "build_prom_metrics", "request_finished", "register_kv_caches", "shutdown"} <= set(probe["overridden"])


def test_metadata_and_stats_sit_on_vllms_classes(probe):
    assert probe["metadata_ok"] and probe["worker_meta_ok"] and probe["stats_ok"] and probe["prom_ok"]
    assert probe["stats_roundtrip"] == {"pool_hit_tokens.dram": 5, "pool_hit_tokens.ssd": 2, "requested_tokens": 5}
    assert probe["delivery"] is False
