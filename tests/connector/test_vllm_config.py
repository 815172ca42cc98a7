"""vLLM's kv_connector_extra_config -> connector config (no vLLM), the layout tag, the model fingerprint."""

from __future__ import annotations

import pytest

from kvpool.connector.stats import counters_delta, counters_sum
from kvpool.connector.vllm_config import VllmConnectorConfig
from kvpool.connector.vllm_layout import KVLayout, layout_tag, model_fingerprint

from tests.connector.vllm_fakes import LAYOUT


def parse(extra, block_size=128, env=None):
    return VllmConnectorConfig.from_extra_config(extra, block_size=block_size, env=env or {})


def test_extra_config_maps_onto_the_connector_config():
    cfg = parse({"pool": "127.0.0.1:5000", "tenant": "team-a", "min_hit_tokens": 256, "save_policy": "off",
                 "lookup_timeout_s": 0.1, "load-timeout-s": 3, "model_fingerprint": "abc"})
    c = cfg.connector
    assert (c.pool, c.tenant, c.min_hit_tokens, c.save_policy.value, c.load_timeout_s, c.block_tokens) == \
        ("127.0.0.1:5000", "team-a", 256, "off", 3, 128)
    assert cfg.lookup_timeout_s == 0.1 and cfg.model_fingerprint == "abc"


def test_environment_and_file_fill_in_below_the_extra_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pool: 10.0.0.1:1\ntenant: from-file\nretry_after_s: 9\n")
    cfg = parse({"config_file": str(path), "tenant": "from-extra"}, env={"KVPOOL_RETRY_AFTER_S": "7"})
    assert (cfg.connector.pool, cfg.connector.tenant, cfg.connector.retry_after_s) == ("10.0.0.1:1", "from-extra", 7)


@pytest.mark.parametrize("extra, field", [
    ({}, "kv_connector_extra_config.pool"),                                # default "embedded" is refused
    ({"pool": "embedded"}, "kv_connector_extra_config.pool"),
    ({"pool": "nohost"}, "kv_connector_extra_config.pool"),
    ({"pool": "h:1", "embedded_dram_bytes": 1}, "kv_connector_extra_config.embedded_dram_bytes"),
    ({"pool": "h:1", "colour": "red"}, "kv_connector_extra_config.colour"),
    ({"pool": "h:1", "block_tokens": 16}, "kv_connector_extra_config.block_tokens"),
    ({"pool": "h:1", "tenant": ""}, "kv_connector_extra_config.tenant"),
    ({"pool": "h:1", "save_policy": "sometimes"}, "kv_connector_extra_config.save_policy"),
    ({"pool": "h:1", "load_timeout_s": 0}, "kv_connector_extra_config.load_timeout_s"),
    ({"pool": "h:1", "lookup_timeout_s": -1}, "kv_connector_extra_config.lookup_timeout_s"),
    ({"pool": "h:1", "model_name": 3}, "kv_connector_extra_config.model_name"),
])
def test_bad_extra_config_names_the_field(extra, field):
    with pytest.raises(ValueError) as info:
        parse(extra)
    assert str(info.value).startswith(field), str(info.value)


def test_extra_config_must_be_a_mapping():
    with pytest.raises(ValueError, match="kv_connector_extra_config must be a JSON object"):
        parse(["pool"])


def test_layout_tags_that_differ_never_share_a_namespace():
    import dataclasses

    tags = [layout_tag(engine="vllm", version=v, backend="CPU_ATTN", isa=isa, kv_layout="LBHNC")
            for v in ("0.32.0", "0.33.0") for isa in ("vec", "amx", "vec16")]
    assert tags[0] == "vllm-0.32.0/CPU_ATTN/vec/LBHNC"
    spaces = [dataclasses.replace(LAYOUT, tag=t).namespace(model="m", fingerprint="f", tenant="t") for t in tags]
    assert len({ns.digest for ns in spaces}) == len(tags)
    with pytest.raises(ValueError, match="layout_tag isa"):
        layout_tag(engine="vllm", version="1", backend="CPU_ATTN", isa="a/b", kv_layout="LBHNC")


def test_layout_refuses_pages_it_cannot_size():
    import dataclasses

    with pytest.raises(ValueError, match="KVLayout.page_bytes"):
        dataclasses.replace(LAYOUT, page_bytes=LAYOUT.page_bytes + 64)


def test_model_fingerprint_follows_the_weight_bytes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\x01" * 1000)
    first = model_fingerprint(str(tmp_path))
    assert model_fingerprint(str(tmp_path)) == first and len(first) == 32
    (tmp_path / "model.safetensors").write_bytes(b"\x01" * 999 + b"\x02")
    assert model_fingerprint(str(tmp_path)) != first
    with pytest.raises(ValueError, match="model_fingerprint"):
        model_fingerprint(str(tmp_path / "nope"))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no weight files"):
        model_fingerprint(str(tmp_path))


def test_counter_deltas_and_sums():
    old = {"requested_tokens": 10, "pool_hit_tokens": {"dram": 4}, "fallbacks": {}}
    new = {"requested_tokens": 30, "pool_hit_tokens": {"dram": 4, "ssd": 8}, "fallbacks": {"timeout": 1}}
    delta = counters_delta(new, old)
    assert delta == {"requested_tokens": 20, "pool_hit_tokens": {"ssd": 8}, "fallbacks": {"timeout": 1}}
    assert counters_delta(new, new) == {}
    assert counters_sum(delta, {"requested_tokens": 1, "pool_hit_tokens": {"ssd": 1, "dram": 2}}) == \
        {"requested_tokens": 21, "pool_hit_tokens": {"ssd": 9, "dram": 2}, "fallbacks": {"timeout": 1}}
