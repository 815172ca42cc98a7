"""vLLM adapter: `connector.KVPoolConnector` (kvpool as vLLM's KV pool, loaded by vLLM from
`kv_connector_module_path: kvpool.engine_adapter.vllm.connector`) and `instance.VllmInstance` (a vLLM process
driven by the tests and bench/vllm_e2e.py). Top layer (docs/internals.md "Layers"): it imports the connector
pieces it adapts. Nothing here is imported by `import kvpool.engine_adapter`; vLLM itself only exists in
.venv-vllm (scripts/setup_vllm.sh)."""
