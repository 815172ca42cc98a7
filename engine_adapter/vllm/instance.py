"""A real vLLM instance in its own process, driven line by line: what the vLLM end-to-end tests and
`bench/vllm_e2e.py` start (one after another: each takes ~30 s and both cores to start).

    parent (dev environment, no vLLM)            child: .venv-vllm/bin/python -m kvpool.engine_adapter.vllm.instance
    VllmInstance.start(...) ──spawn, argv=JSON config──▶ LLM(model, kv_transfer_config=KVPoolConnector..., ...)
                            ◀──{"ready": ...}──────────
    .generate(ids, n)       ──{"op": "generate"}───────▶ llm.generate(TokensPrompt, greedy)
                            ◀──{"token_ids", "num_cached_tokens", "ttft_s"}
    .flush() / .metrics() / .stop()

The protocol is JSON lines on the child's stdin and on a private copy of its stdout; everything vLLM prints (its
own stdout included, and that of the worker process it spawns) goes to the log file. TTFT is vLLM's own
`first_token_latency` (arrival to first token, measured inside the engine).

vLLM lives in its own virtual environment (`scripts/setup_vllm.sh`: `.venv-vllm/` in the repo root, with the SmolLM2
HF folder under it); `skip_reason()` says why the tests cannot run where it is missing.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-vllm"
MODEL_DIR = VENV / "models" / "SmolLM2-135M-Instruct-f32"
CONNECTOR_MODULE = "kvpool.engine_adapter.vllm.connector"
STARTUP_DEADLINE_S = 600.0


def vllm_python() -> Path:
    return VENV / "bin" / "python"


def skip_reason() -> str | None:
    """None when the vLLM environment is usable, else why not (for pytest.skip and the benchmark)."""
    if not vllm_python().exists():
        return f"no vLLM environment at {VENV} (run scripts/setup_vllm.sh, ~5 min, ~3.5 GB)"
    if not (MODEL_DIR / "config.json").exists():
        return f"no converted model at {MODEL_DIR} (run scripts/setup_vllm.sh)"
    return None


def kv_transfer_config(pool: str, **extra: Any) -> dict:
    return {"kv_connector": "KVPoolConnector", "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"pool": pool, **extra}}


class VllmInstance:
    def __init__(self, name: str, popen: subprocess.Popen, log_path: Path, out) -> None:
        self.name, self.popen, self.log_path, self._out = name, popen, log_path, out
        self.startup_s = 0.0

    @classmethod
    def start(cls, name: str, workdir: Path, *, pool: str | None = None, extra: dict | None = None,
              block_size: int = 128, max_model_len: int = 2048, engine_args: dict | None = None,
              kv_cache_gib: int = 1, env: dict | None = None) -> "VllmInstance":
        """Spawn and wait until the engine is ready (no connector when `pool` is None). `engine_args` go to
        `vllm.LLM` as they are (e.g. max_num_batched_tokens for chunked prefill)."""
        config = {"model": str(MODEL_DIR), "block_size": block_size, "max_model_len": max_model_len,
                  "engine_args": engine_args or {},
                  "kv_transfer_config": kv_transfer_config(pool, **(extra or {})) if pool else None}
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOOL_", "VLLM_", "VIRTUAL_ENV"))}
        child_env.update({"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "VLLM_NO_USAGE_STATS": "1",
                          "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                          "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",   # collective_rpc(flush_worker_saves)
                          "PYTHONUNBUFFERED": "1", **(env or {})})
        log_path = Path(workdir) / f"vllm-{name}.log"
        read_fd, write_fd = os.pipe()
        with open(log_path, "ab") as log:
            popen = subprocess.Popen([str(vllm_python()), "-m", "kvpool.engine_adapter.vllm.instance",
                                      json.dumps(config), str(write_fd)], stdin=subprocess.PIPE, stdout=log,
                                     stderr=subprocess.STDOUT, cwd=str(workdir), env=child_env,
                                     pass_fds=(write_fd,), text=True)
        os.close(write_fd)
        inst = cls(name, popen, log_path, os.fdopen(read_fd, "r"))
        try:
            inst.startup_s = inst._reply(STARTUP_DEADLINE_S)["startup_s"]
        except BaseException:
            inst.kill()
            raise
        return inst

    def generate(self, prompt_token_ids: list[int], max_tokens: int = 8, timeout: float = 600.0) -> dict:
        return self._call({"op": "generate", "prompt_token_ids": list(prompt_token_ids), "max_tokens": max_tokens},
                          timeout)

    def tokenize(self, text: str) -> list[int]:
        return self._call({"op": "tokenize", "text": text}, 60)["ids"]

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until the worker's asynchronous saves reached the pool."""
        return self._call({"op": "flush", "timeout": timeout}, timeout + 30)["flushed"]

    def metrics(self) -> dict[str, float]:
        """vLLM's own Prometheus metrics of the connector, 'name{label=value,...}' -> value (engine labels dropped)."""
        return self._call({"op": "metrics"}, 60)["metrics"]

    def stop(self, timeout: float = 60.0) -> None:
        if self.popen.poll() is None:
            try:
                self.popen.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.popen.stdin.flush()
                self.popen.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._out.close()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(30)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _call(self, command: dict, timeout: float) -> dict:
        self.popen.stdin.write(json.dumps(command) + "\n")
        self.popen.stdin.flush()
        return self._reply(timeout)

    def _reply(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"vLLM instance {self.name} exited with {self.popen.returncode}; log ends:\n"
                                   f"{self.log_tail()}")
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"vLLM instance {self.name} did not answer within {timeout}s; log ends:\n"
                                   f"{self.log_tail()}")
            ready, _, _ = select.select([self._out], [], [], min(left, 1.0))
            if ready:
                line = self._out.readline()
                if line:
                    reply = json.loads(line)
                    if "error" in reply:
                        raise RuntimeError(f"vLLM instance {self.name}: {reply['error']}")
                    return reply


# ---------------------------------------------------------------------------------------------- child side


def _child(config: dict, out_fd: int) -> None:
    out = os.fdopen(out_fd, "w", buffering=1)
    os.dup2(2, 1)   # vLLM prints to stdout: send it to the log with the rest
    started = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=config["model"], block_size=config["block_size"], max_model_len=config["max_model_len"],
                  enforce_eager=True, enable_prefix_caching=True, disable_log_stats=False, dtype="float32",
                  kv_transfer_config=config["kv_transfer_config"])
    kwargs.update(config["engine_args"])
    llm = LLM(**kwargs)
    out.write(json.dumps({"ready": True, "startup_s": time.perf_counter() - started}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "quit":
                break
            if op == "generate":
                params = SamplingParams(temperature=0, max_tokens=cmd["max_tokens"])
                t0 = time.perf_counter()
                result = llm.generate([TokensPrompt(prompt_token_ids=cmd["prompt_token_ids"])], params,
                                      use_tqdm=False)[0]
                wall = time.perf_counter() - t0
                m = result.metrics
                ttft = getattr(m, "first_token_latency", 0.0) or wall
                reply = {"token_ids": list(result.outputs[0].token_ids), "num_cached_tokens": result.num_cached_tokens,
                         "ttft_s": ttft, "wall_s": wall}
            elif op == "tokenize":
                reply = {"ids": llm.get_tokenizer().encode(cmd["text"], add_special_tokens=False)}
            elif op == "flush":
                from kvpool.engine_adapter.vllm.connector import flush_worker_saves

                reply = {"flushed": all(llm.collective_rpc(flush_worker_saves, args=(cmd["timeout"],)))}
            elif op == "metrics":
                reply = {"metrics": _connector_metrics(llm)}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # noqa: BLE001 - report to the parent, keep serving
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")


def _connector_metrics(llm) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for m in llm.get_metrics():
        if not m.name.startswith("vllm:kvpool_"):
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(m.labels.items()) if k not in ("engine", "model_name"))
        key = f"{m.name}{{{labels}}}" if labels else m.name
        metrics[key] = metrics.get(key, 0.0) + float(getattr(m, "value", 0.0))
    return metrics


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]), int(sys.argv[2]))
