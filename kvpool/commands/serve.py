"""`kvpool serve --model PATH`: the bundled engine behind an OpenAI-compatible HTTP server (+ /metrics)."""

from __future__ import annotations

import argparse
import socket


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a GGUF model with the bundled engine (OpenAI-compatible HTTP)")
    p.add_argument("--model", default=None, help="path to a .gguf file or a Hugging Face model directory "
                                                 "(default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--config", default=None, help="engine config file (YAML/TOML, EngineConfig fields; "
                                                  "KVPOOL_ENGINE_<FIELD> environment variables override it)")
    p.add_argument("--connector-config", default=None, metavar="FILE",
                   help="connect this engine to a kvpool (YAML/TOML ConnectorConfig; see README 'Connector'); "
                        "KVPOOL_* variables override the file")
    p.add_argument("--engine-name", default=None, help="`engine` label of the metrics (default: HOST:PORT)")
    p.add_argument("--block-tokens", type=int, default=None)
    p.add_argument("--num-kv-blocks", type=int, default=None)
    p.add_argument("--kv-cache-bytes", default=None, help="KV cache size, e.g. 512MiB (instead of --num-kv-blocks)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--model-name", default=None, help="model id reported by /v1/models and used in the Namespace")
    p.set_defaults(func=_run)


def _connector(path: str | None):
    if path is None:
        return None
    from kvpool.connector.config import ConnectorConfig
    from kvpool.connector.connector import PoolConnector

    return PoolConnector(ConnectorConfig.load(path))


def _run(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from kvpool.config import load_config
    from kvpool.engine_adapter.config import EngineConfig
    from kvpool.engine_adapter.llm_engine import LLMEngine
    from kvpool.engine_adapter.server import EngineServer
    from kvpool.metrics import EngineMetrics

    overrides = {k: v for k, v in {
        "model": args.model, "block_tokens": args.block_tokens, "num_kv_blocks": args.num_kv_blocks,
        "kv_cache_bytes": args.kv_cache_bytes, "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens, "max_model_len": args.max_model_len,
        "model_name": args.model_name, "num_threads": args.num_threads,
        "enable_prefix_caching": False if args.no_prefix_caching else None,
    }.items() if v is not None}
    connector = None
    try:
        config = load_config(EngineConfig, args.config, env_prefix="KVPOOL_ENGINE_", **overrides)
        connector = _connector(args.connector_config)
        engine = LLMEngine(config, connector=connector)
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvpool serve: {exc}")
        if connector is not None and hasattr(connector, "close"):
            connector.close()
        return 2
    registry = CollectorRegistry()
    metrics = EngineMetrics.create(registry)
    if hasattr(connector, "register_metrics"):  # the connector exports its own counters into the same registry
        connector.register_metrics(registry)
    name = args.engine_name or f"{socket.gethostname()}:{args.port}"
    ttft = metrics.ttft_seconds.labels(engine=name)
    server = EngineServer(engine, args.host, args.port, metrics_registry=registry, on_ttft=ttft.observe)
    pool = f", pool {connector.config.pool}" if connector is not None else ""
    print(f"kvpool serve: {engine.model_path} on {server.url} ({engine.num_kv_blocks} KV blocks{pool})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        engine.close()      # the connector's saves, loads and leases end with the engine
    return 0
