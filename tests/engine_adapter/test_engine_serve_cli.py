"""`kvpool serve` as a real process on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from kvpool.launcher import free_port


def test_serve_missing_model_exits_with_a_clear_message(tmp_path):
    missing = tmp_path / "none.gguf"
    proc = subprocess.run([sys.executable, "-m", "kvpool.cli", "serve", "--model", str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"kvpool serve: model file '{missing}' does not exist" in proc.stdout


def test_serve_bad_config_value_exits_naming_the_field():
    proc = subprocess.run([sys.executable, "-m", "kvpool.cli", "serve", "--max-num-seqs", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "EngineConfig.max_num_seqs must be a positive int, got 0" in proc.stdout


def test_serve_answers_completions(model_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvpool.cli", "serve", "--model", model_path, "--port", str(port),
                             "--num-kv-blocks", "64", "--max-model-len", "256"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                    assert json.load(resp) == {"status": "ok"}
                    break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"server did not come up: {proc.stdout.read() if proc.poll() is not None else ''}")
                time.sleep(0.5)
        req = urllib.request.Request(base + "/v1/completions", method="POST", data=json.dumps(
            {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}).encode())
        with urllib.request.urlopen(req, timeout=120) as resp:
            doc = json.load(resp)
        assert doc["choices"][0]["text"] == " Paris.\n" and doc["usage"]["completion_tokens"] == 3
        with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        assert f'kvpool_engine_ttft_seconds_count{{engine="{socket.gethostname()}:{port}"}} 1.0' in text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_missing_connector_config_exits_naming_the_file(tmp_path):
    missing = tmp_path / "connector.yaml"
    proc = subprocess.run([sys.executable, "-m", "kvpool.cli", "serve", "--connector-config", str(missing)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"kvpool serve: config file '{missing}' does not exist" in proc.stdout
