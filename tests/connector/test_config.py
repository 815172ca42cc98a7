"""Connector config: file < env < kwargs, and every bad value names its field."""

import pytest

from kvpool.connector.config import ConnectorConfig, LoadPolicy, SavePolicy


def test_file_env_and_overrides(tmp_path, monkeypatch):
    path = tmp_path / "connector.yaml"
    path.write_text("pool: 127.0.0.1:50051\nsave_policy: after_n_hits\nsave_after_hits: 3\nmin_hit_tokens: 64\n"
                    "embedded_dram_bytes: 64MiB\n")
    monkeypatch.setenv("KVPOOL_MIN_HIT_TOKENS", "128")
    cfg = ConnectorConfig.load(str(path), tenant="team-a")
    assert cfg.pool == "127.0.0.1:50051"
    assert cfg.save_policy is SavePolicy.AFTER_N_HITS and cfg.save_after_hits == 3
    assert cfg.min_hit_tokens == 128  # env beats file
    assert cfg.tenant == "team-a"
    assert cfg.embedded_dram_bytes == 64 << 20
    assert cfg.load_policy is LoadPolicy.AUTO


def test_toml_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('pool = "embedded"\nsave_policy = "off"\nload_timeout_s = 0.5\n')
    cfg = ConnectorConfig.load(str(path))
    assert cfg.save_policy is SavePolicy.OFF and cfg.load_timeout_s == 0.5


@pytest.mark.parametrize("overrides, field", [
    ({"pool": "localhost"}, "pool"), ({"pool": "h:99999"}, "pool"), ({"save_policy": "sometimes"}, "save_policy"),
    ({"block_tokens": 0}, "block_tokens"), ({"min_hit_tokens": -1}, "min_hit_tokens"),
    ({"load_timeout_s": 0}, "load_timeout_s"), ({"load_policy": "never"}, "load_policy"),
    ({"embedded_ssd_bytes": "-5"}, "embedded_ssd_bytes"), ({"transport": "udp"}, "transport"),
    ({"no_such_field": 1}, "no_such_field"), ({"load_chunk_blocks": 0}, "load_chunk_blocks"),
    ({"retry_after_s": -1}, "retry_after_s"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        ConnectorConfig.load(**overrides)


def test_unknown_key_in_file_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pool: embedded\nblock_token: 16\n")
    with pytest.raises(ValueError, match="block_token"):
        ConnectorConfig.load(str(path))


def test_bad_env_value_is_named(monkeypatch):
    monkeypatch.setenv("KVPOOL_BLOCK_TOKENS", "sixteen")
    with pytest.raises(ValueError, match="block_tokens"):
        ConnectorConfig.load()
