"""`kvpool demo`: the product in one command, on the embedded default.

    kvpool up ──────────────── pool: master + one node (DRAM + SSD) ◀──────────┐
    kvpool serve A --connector-config ──▶ prefix + question 1 (cold; saves)  ──┤
    kvpool serve B --connector-config ──▶ prefix + question 2 (loads prefix) ──┘
    kvpool serve B0 (no pool)         ──▶ prefix + question 2 (reference: TTFT and output without the pool)

Every engine is a separate process; each gets one short warm-up request first, so the times compare prefill work,
not first-call set-up. Prints B's time to first token with and without the pool, hit tokens by tier, and whether
B's output equals B0's token for token.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvpool.launcher import Proc, free_port, post_json, spawn, wait_grpc_serving, wait_http_ok

SECTIONS = ["billing", "refunds", "accounts", "security", "shipping", "returns", "warranty", "support", "privacy",
            "pricing", "discounts", "loyalty", "gift cards", "outages", "maintenance", "api limits"]


def shared_prefix(num_sections: int) -> str:
    """A deterministic policy document standing in for a long system prompt or a RAG context."""
    lines = ["You are the support assistant of Northwind Cloud. Answer in one sentence using the handbook below.",
             "", "HANDBOOK"]
    for i in range(num_sections):
        topic = SECTIONS[i % len(SECTIONS)]
        lines.append(f"Section {i + 1} ({topic}): requests about {topic} are answered within {2 + i % 5} business "
                     f"days; escalations go to team {chr(65 + i % 26)}; the reference code is NW-{1000 + 37 * i}.")
    return "\n".join(lines) + "\n\n"


@dataclass(slots=True)
class DemoResult:
    prompt_tokens: int
    ttft_cold_a: float
    ttft_b_without_pool: float
    ttft_b_with_pool: float
    pool_hit_tokens: int
    hit_tokens_by_tier: dict[str, int]
    outputs_match: bool
    text_b: str

    @property
    def speedup(self) -> float:
        return self.ttft_b_without_pool / self.ttft_b_with_pool


def _complete(url: str, prompt: str, max_tokens: int) -> dict:
    return post_json(url + "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


def run_demo(*, sections: int = 40, max_tokens: int = 16, dram: str = "1GiB", ssd: str = "2GiB",
             workdir: str | None = None, log=print) -> DemoResult:
    from kvpool.client import PoolClient

    own_dir = workdir is None
    work = Path(workdir or tempfile.mkdtemp(prefix="kvpool-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    procs: list[Proc] = []
    try:
        pool_addr = f"127.0.0.1:{free_port()}"
        pool = spawn("pool", ["up", "--listen", pool_addr, "--dram-bytes", dram, "--ssd-path", str(work / "ssd"),
                              "--ssd-bytes", ssd, "--http-listen", ""], work)
        procs.append(pool)
        (work / "connector.yaml").write_text(f"pool: {pool_addr}\nsave_policy: write_through\n")
        engines = {}
        for name, pooled in (("A", True), ("B", True), ("B0", False)):
            port = free_port()
            args = ["serve", "--port", str(port), "--max-model-len", "2048"]
            if pooled:
                args += ["--connector-config", str(work / "connector.yaml")]
            proc = spawn(f"engine-{name}", args, work)
            procs.append(proc)
            engines[name] = (proc, f"http://127.0.0.1:{port}")
        wait_grpc_serving(pool_addr, 60, pool)
        log(f"pool up at {pool_addr} (DRAM {dram}, SSD {ssd}); starting engines A, B (with pool) and B0 (without)")
        for proc, url in engines.values():
            wait_http_ok(url + "/health", 300, proc)
        for _, url in engines.values():
            _complete(url, "Warm-up: say hello.", 2)

        prefix = shared_prefix(sections)
        client = PoolClient(pool_addr)
        out_a = _complete(engines["A"][1], prefix + "Question: how fast are refunds handled?\nAnswer:", max_tokens)
        wait_saves(engines["A"][1])
        question_b = prefix + "Question: which team handles security escalations?\nAnswer:"
        out_b0 = _complete(engines["B0"][1], question_b, max_tokens)
        mid = client.stats()
        out_b = _complete(engines["B"][1], question_b, max_tokens)
        after = client.stats()
        client.close()
        by_tier = {t: after["hit_tokens_by_tier"][t] - mid["hit_tokens_by_tier"].get(t, 0)
                   for t in after["hit_tokens_by_tier"]}
        return DemoResult(prompt_tokens=out_b["usage"]["prompt_tokens"],
                          ttft_cold_a=out_a["usage"]["ttft_seconds"],
                          ttft_b_without_pool=out_b0["usage"]["ttft_seconds"],
                          ttft_b_with_pool=out_b["usage"]["ttft_seconds"],
                          pool_hit_tokens=out_b["usage"]["cached_tokens_external"],
                          hit_tokens_by_tier={t: n for t, n in by_tier.items() if n},
                          outputs_match=out_b["choices"][0]["text"] == out_b0["choices"][0]["text"],
                          text_b=out_b["choices"][0]["text"])
    finally:
        for proc in reversed(procs):
            proc.stop()
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)


def wait_saves(engine_url: str) -> None:
    """A's saves are asynchronous: wait until its connector has handed every block it offered to the pool."""
    if not post_json(engine_url + "/v1/kvpool/flush", {}, timeout=120).get("flushed"):
        raise RuntimeError(f"engine {engine_url}: saves did not reach the pool within 60 s")


def format_result(r: DemoResult) -> str:
    tiers = ", ".join(f"{t} {n:,}" for t, n in sorted(r.hit_tokens_by_tier.items())) or "none"
    return "\n".join([
        f"prompt: {r.prompt_tokens:,} tokens, of which a shared prefix; B asks a different question than A",
        f"  A  (pool, cold)     time to first token {r.ttft_cold_a:6.3f} s   (computes the prefix, saves its blocks)",
        f"  B0 (no pool)        time to first token {r.ttft_b_without_pool:6.3f} s",
        f"  B  (pool)           time to first token {r.ttft_b_with_pool:6.3f} s   "
        f"({r.pool_hit_tokens:,} prompt tokens loaded from the pool; by tier: {tiers})",
        f"  B with pool vs without: {r.speedup:.1f}x faster to first token",
        f"  outputs match (B vs B0, greedy): {'yes' if r.outputs_match else 'NO'}   B said: {r.text_b.strip()!r}",
    ])
