"""Cross-instance reuse with separate processes: a pool (`kvpool up`), engines as `kvpool serve` processes.

One pool and four engines serve every check here (model loading dominates the cost): A and B use the pool, B0 has
no pool (the reference for B's output), C uses the pool under another tenant. The pool's DRAM holds ~11 blocks
and the shared prefix is ~35, so most of what B loads comes from the SSD tier.

Every test runs twice: on an open loopback pool (the zero-config default) and on a pool with authentication and TLS
("secure": A and B present tenant acme's token, C tenant beta's, over TLS verified with the test CA; the data
channel speaks TLS too, shared memory is used on this host either way).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool.demo import shared_prefix, wait_saves
from kvpool.launcher import free_port, post_json, spawn, wait_grpc_serving, wait_http_ok
from kvpool.store.tls import TlsConfig
from tests.store.pki import pki  # noqa: F401 - fixture
from tests.store.test_secure_cluster import auth_args, write_tokens

pytestmark = pytest.mark.slow

QUESTION_1 = "Question: how fast are refunds handled?\nAnswer:"
QUESTION_2 = "Question: which team handles security escalations?\nAnswer:"


def complete(url: str, prompt: str) -> dict:
    out = post_json(url + "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0}, timeout=300)
    return {"text": out["choices"][0]["text"], **out["usage"]}


@pytest.fixture(scope="module", params=["open", "secure"])
def deployment(request, tmp_path_factory, pki):  # noqa: F811
    work: Path = tmp_path_factory.mktemp("xinst")
    procs = []
    secure = request.param == "secure"
    try:
        pool_addr = f"127.0.0.1:{free_port()}"
        extra, creds, client = [], {"A": "", "C": ""}, {}
        if secure:
            tokens = write_tokens(work / "tokens")
            extra = [*auth_args(work / "tokens"), "--tls-cert", pki.path("server"), "--tls-key",
                     pki.path("server", "key"), "--tls-ca", pki.path("ca")]
            tls = f"tls_ca: {pki.path('ca')}\n"
            creds = {"A": f"auth_token: {tokens['acme']}\n{tls}", "C": f"auth_token: {tokens['beta']}\n{tls}"}
            client = {"token": tokens["admin"], "tls": TlsConfig(ca=pki.path("ca"))}
        pool = spawn("pool", ["up", "--listen", pool_addr, "--dram-bytes", "8MiB", "--ssd-path", str(work / "ssd"),
                              "--ssd-bytes", "256MiB", "--http-listen", "", *extra], work)
        procs.append(pool)
        (work / "pool.yaml").write_text(f"pool: {pool_addr}\nload_timeout_s: 2\n{creds['A']}")
        (work / "other.yaml").write_text(f"pool: {pool_addr}\ntenant: other-team\n{creds['C']}")
        urls = {}
        for name, cfg in (("A", "pool.yaml"), ("B", "pool.yaml"), ("B0", None), ("C", "other.yaml")):
            port = free_port()
            args = ["serve", "--port", str(port), "--max-model-len", "1024", "--num-kv-blocks", "128"]
            if cfg:
                args += ["--connector-config", str(work / cfg)]
            procs.append(spawn(f"engine-{name}", args, work))
            urls[name] = f"http://127.0.0.1:{port}"
        wait_grpc_serving(pool_addr, 60, pool, tls=client.get("tls"))
        for proc, url in zip(procs[1:], urls.values()):
            wait_http_ok(url + "/health", 300, proc)
        yield {"pool": pool, "pool_addr": pool_addr, "urls": urls, "work": work, "client": client,
               "secure": secure}
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_b_reuses_a_prefix_across_processes_from_dram_and_ssd(deployment):
    from kvpool.client import PoolClient

    urls = deployment["urls"]
    prefix = shared_prefix(14)
    with PoolClient(deployment["pool_addr"], **deployment["client"]) as client:  # the admin's view when secure
        complete(urls["A"], prefix + QUESTION_1)
        wait_saves(urls["A"])
        stats = client.stats()
        assert stats["tiers"]["ssd"]["objects"] > 0 and stats["tiers"]["dram"]["objects"] > 0
        reference = complete(urls["B0"], prefix + QUESTION_2)
        before = client.stats()["hit_tokens_by_tier"]
        out_b = complete(urls["B"], prefix + QUESTION_2)
        after = client.stats()["hit_tokens_by_tier"]
    assert out_b["cached_tokens_external"] >= len(prefix) // 8  # most of the ~600-token prefix
    assert out_b["text"] == reference["text"]
    assert after["ssd"] - before["ssd"] > 0
    # B's own counters (its /metrics) say the same: every loaded token by the tier it was read from.
    loaded = connector_hit_tokens(urls["B"])
    assert sum(loaded.values()) == out_b["cached_tokens_external"]
    assert set(loaded) <= {"dram", "ssd"} and loaded.get("ssd", 0) > 0
    if deployment["secure"]:  # A's and B's blocks are tenant acme's, every hit was acme's own
        with PoolClient(deployment["pool_addr"], **deployment["client"]) as client:
            tenants = client.stats()["tenants"]
        assert tenants["acme"]["objects"] > 0 and tenants["acme"]["hit_tokens"] >= out_b["cached_tokens_external"]


def connector_hit_tokens(url: str) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kvpool_connector_hit_tokens_total" and sample.value:
                out[sample.labels["tier"]] = sample.value
    return out


def test_other_namespace_never_hits(deployment):
    urls = deployment["urls"]
    prefix = shared_prefix(14)
    out_c = complete(urls["C"], prefix + QUESTION_2)
    assert out_c["cached_tokens_external"] == 0
    assert out_c["text"] == complete(urls["B0"], prefix + QUESTION_2)["text"]
    if deployment["secure"]:  # C asked the pool, as tenant beta, and found nothing of acme's
        from kvpool.client import PoolClient

        with PoolClient(deployment["pool_addr"], **deployment["client"]) as client:
            beta = client.stats()["tenants"]["beta"]
        assert beta["requested_tokens"] > 0 and beta["hit_tokens"] == 0


def test_pool_killed_b_recomputes_with_identical_output(deployment):
    urls = deployment["urls"]
    prefix = shared_prefix(20)  # not seen by B yet, so B must ask the pool
    complete(urls["A"], prefix + QUESTION_1)
    wait_saves(urls["A"])   # A's blocks are in the pool: B would load them, were the pool alive
    deployment["pool"].kill()
    reference = complete(urls["B0"], prefix + QUESTION_2)
    out_b = complete(urls["B"], prefix + QUESTION_2)
    assert out_b["cached_tokens_external"] == 0
    assert out_b["text"] == reference["text"]
    # B keeps serving after the fault.
    again = complete(urls["B"], shared_prefix(3) + QUESTION_1)
    assert again["text"] == complete(urls["B0"], shared_prefix(3) + QUESTION_1)["text"]
