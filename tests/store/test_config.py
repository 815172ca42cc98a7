"""store/config.py: frozen, validated; every bad value names its field."""

import dataclasses

import pytest

from kvpool.store.config import EmbeddedConfig, MasterConfig, NodeConfig, NodeServerConfig


@pytest.mark.parametrize("cls, field, value, message", [
    (NodeConfig, "dram_bytes", -1, "dram_bytes must be an integer >= 0"),
    (NodeConfig, "ssd_bytes", -4096, "ssd_bytes must be an integer >= 0"),
    (NodeConfig, "node_id", "", "node_id must be a non-empty string"),
    (MasterConfig, "max_object_bytes", 0, "max_object_bytes must be > 0"),
    (MasterConfig, "max_object_bytes", -5, "max_object_bytes must be an integer >= 0"),
    (MasterConfig, "lease_ttl_s", 0, "lease_ttl_s must be a number > 0"),
    (NodeServerConfig, "register_drain_s", -1, "register_drain_s must be a number of seconds >= 0, got -1"),
    (NodeServerConfig, "register_drain_s", float("nan"), "register_drain_s must be a number of seconds >= 0"),
    (NodeServerConfig, "register_drain_s", True, "register_drain_s must be a number of seconds >= 0, got True"),
    (MasterConfig, "grant_ttl_s", -1.0, "grant_ttl_s must be a number > 0"),
    (MasterConfig, "node_ttl_s", "x", "node_ttl_s must be a number > 0"),
    (MasterConfig, "policy", "mru", r"policy must be one of \['lru', 's3fifo', 'wlru', 'clru', 'bclru', 'lclru'\]"),
    (MasterConfig, "suspect_after_s", -1, r"suspect_after_s must be a number of seconds >= 0 \(0 = the default\)"),
    (MasterConfig, "suspect_after_s", 10.0, r"suspect_after_s \(10.0\) must be below node_ttl_s \(10.0\)"),
    (MasterConfig, "reload_grace_s", float("nan"), "reload_grace_s must be a number of seconds >= 0"),
    (MasterConfig, "max_namespaces", 1, "max_namespaces must be an int >= 2, got 1"),
    (MasterConfig, "max_tombstones", 0, r"max_tombstones must be an int >= 1 \(removed keys remembered\), got 0"),
    (MasterConfig, "max_tombstones", True, "max_tombstones must be an int >= 1"),
    (MasterConfig, "max_tenant_tombstones", 0,
     r"max_tenant_tombstones must be an int >= 1 \(removed keys remembered\), got 0"),
    (MasterConfig, "max_tenant_tombstones", 2.5, "max_tenant_tombstones must be an int >= 1"),
    (MasterConfig, "promote_on_hit", "yes", "promote_on_hit must be true or false"),
    (EmbeddedConfig, "dram_bytes", -1, "dram_bytes must be an integer >= 0"),
    (EmbeddedConfig, "ssd_bytes", -1, "ssd_bytes must be an integer >= 0"),
])
def test_bad_values_name_the_field(cls, field, value, message):
    with pytest.raises(ValueError, match=message):
        cls(**{field: value})


def test_frozen_and_split():
    cfg = EmbeddedConfig(dram_bytes=4096, ssd_path="/x", ssd_bytes=8192, promote_on_hit=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dram_bytes = 1
    assert cfg.master_config().promote_on_hit is False
    assert (cfg.node_config().dram_bytes, cfg.node_config().ssd_path) == (4096, "/x")


def test_every_process_field_is_a_kvpool_up_flag_with_one_validation():
    from kvpool.process import add_config_flags, config_from_args
    from kvpool.store.config import MasterServerConfig, NodeServerConfig, UpConfig

    up = {f.name for f in dataclasses.fields(UpConfig)}
    # Where each server listens and its worker threads are per process; `kvpool up` names the node's node_listen.
    shared = ({f.name for f in dataclasses.fields(MasterServerConfig)} - {"workers"}) \
        | ({f.name for f in dataclasses.fields(NodeServerConfig)} - {"workers", "master", "listen"})
    assert shared <= up and "node_listen" in up
    import argparse

    parser = argparse.ArgumentParser()
    add_config_flags(parser, UpConfig)
    args = parser.parse_args(["--policy", "s3fifo", "--promote-on-hit", "false", "--max-batch-keys", "10",
                              "--ssd-path", "none", "--data-listen", "127.0.0.1:0"])
    cfg = config_from_args(UpConfig, args, env_prefix="KVPOOL_TEST_UNSET_")
    assert (cfg.policy, cfg.promote_on_hit, cfg.max_batch_keys, cfg.ssd_path, cfg.ssd_bytes) == \
        ("s3fifo", False, 10, None, 0)
    assert cfg.master_server_config().policy == "s3fifo"
    assert cfg.node_server_config("127.0.0.1:1").data_listen == "127.0.0.1:0"
    # A field shared by several configs is validated by its one group: the same message everywhere.
    for cls in (UpConfig, MasterServerConfig, EmbeddedConfig, MasterConfig):
        with pytest.raises(ValueError, match=r"^max_batch_keys must be > 0, got 0$"):
            cls(max_batch_keys=0)
