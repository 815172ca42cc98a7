"""`kvpool config check`: the process's own loader decides; exact outputs and exit codes."""

import json
import subprocess
import sys

import pytest

from kvpool.cli import main


def test_valid_connector_config_json(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("pool: 127.0.0.1:50051\nsave_policy: after_n_hits\nsave_after_hits: 3\n")
    assert main(["config", "check", str(path), "--kind", "connector", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["kind"] == "connector"
    assert out["config"]["save_policy"] == "after_n_hits" and out["config"]["save_after_hits"] == 3


@pytest.mark.parametrize("kind, text, field", [
    ("up", "dram_bytes: -1\n", "dram_bytes"),
    ("node", "ssd_bytes: lots\n", "ssd_bytes"),
    ("connector", "pool: nowhere\n", "pool"),
    ("engine", "block_tokens: 0\n", "block_tokens"),
    ("master", "no_such_key: 1\n", "no_such_key"),
])
def test_invalid_configs_name_the_field(tmp_path, capsys, kind, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["config", "check", str(path), "--kind", kind, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and field in out["error"]


def test_env_ignored_unless_asked(tmp_path, capsys, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("pool: embedded\n")
    monkeypatch.setenv("KVPOOL_BLOCK_TOKENS", "zero")
    assert main(["config", "check", str(path), "--kind", "connector"]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {path} is a valid connector config\n")
    assert main(["config", "check", str(path), "--kind", "connector", "--with-env"]) == 1
    assert "block_tokens" in capsys.readouterr().out


def test_missing_file_and_bad_kind_exit_codes(tmp_path):
    missing = tmp_path / "missing.yaml"
    run = subprocess.run([sys.executable, "-m", "kvpool.cli", "config", "check", str(missing), "--kind", "node"],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stdout.strip() == (f"kvpool config check: {missing} is not a valid node config: "
                                  f"config file '{missing}' does not exist")
    run = subprocess.run([sys.executable, "-m", "kvpool.cli", "config", "check", str(missing), "--kind", "x"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "invalid choice: 'x'" in run.stderr
