"""Import directions between the project's layers (docs/internals.md, "Layers"), checked on every import statement:
module level, inside functions, under TYPE_CHECKING, relative or absolute. A lazy import is still a dependency.

Each source file belongs to one layer; each imported project module resolves to one layer; the pair must be allowed
by LAYERS below. Third-party and standard-library imports are not this test's business (tests/tiers/test_imports.py
keeps tiers/ free of torch and CuPy; TestNoTorchBelowKernels below keeps store/ and tiers/ free of them too).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Folder -> import package (pyproject's package-dir).
PACKAGES = {"kvpool": "kvpool", "store": "kvpool.store", "tiers": "kvpool.tiers", "proto": "kvpool.proto",
            "kernels": "kvpool.kernels", "connector": "kvpool.connector", "engine_adapter": "kvpool.engine_adapter"}

# Modules any layer may import: the key contract, the engine-hook contract, and the one-pass copy + hash (the fence,
# puts and the kernels' CPU loads share it; it imports only its own C extension).
LEAVES = {"kvpool.keys", "kvpool.hooks", "kvpool.copyhash", "kvpool._copyhash"}
# The top layer: the CLI, process wiring (servers + dashboard + metrics), orchestration and benchmark commands, and
# the vLLM adapter. It may import anything; nothing below may import it.
TOP = ("kvpool.cli", "kvpool.commands", "kvpool.process", "kvpool.launcher", "kvpool.services", "kvpool.demo",
       "kvpool.benchmarks", "kvpool.engine_adapter.vllm")

# layer -> layers it may import (besides itself and LEAVES)
LAYERS: dict[str, set[str]] = {
    "tiers": set(),
    "proto": set(),
    "store": {"tiers", "proto"},
    "kernels": set(),
    "kvpool": {"store", "tiers", "proto"},                       # the public API: clients, pools, admin, stats
    "connector": {"kvpool", "kernels"},                          # engine-agnostic, on the public API
    "engine_adapter": {"kernels", "kvpool.metrics"},             # calls connectors only through kvpool.hooks
    "top": {"tiers", "proto", "store", "kernels", "kvpool", "connector", "engine_adapter"},
}


def layer_of(module: str) -> str:
    if module in LEAVES:
        return "leaf"
    if any(module == t or module.startswith(t + ".") for t in TOP):
        return "top"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in {"store", "tiers", "proto", "kernels", "connector", "engine_adapter"}:
        return parts[1]
    return "kvpool"


def module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    pkg = PACKAGES[rel.parts[0]]
    rest = [p for p in rel.with_suffix("").parts[1:] if p != "__init__"]
    return ".".join([pkg, *rest])


def project_imports(path: pathlib.Path):
    """(line, imported project module) for every import statement in the file."""
    this = module_of(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from kvpool import keys` imports the module kvpool.keys; `from kvpool import Namespace` is kvpool.
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in LEAVES else target for a in node.names]
        else:
            continue
        for name in names:
            if name == "kvpool" or name.startswith("kvpool."):
                yield node.lineno, name


def source_files():
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                yield path


def allowed(src: str, dst: str, dst_module: str) -> bool:
    if src == "top" or dst == "leaf" or dst == src:
        return True
    if src == "leaf":
        return False
    return dst in LAYERS[src] or dst_module in LAYERS[src]


def test_every_import_follows_the_layer_table():
    bad = []
    for path in source_files():
        module = module_of(path)
        src = layer_of(module)
        for line, target in project_imports(path):
            if not allowed(src, layer_of(target), target):
                bad.append(f"{path.relative_to(ROOT)}:{line} ({src}) imports {target} ({layer_of(target)})")
    assert bad == []


def test_leaves_import_nothing_of_the_project_but_leaves():
    for path in source_files():
        module = module_of(path)
        if module in LEAVES:
            assert [t for _, t in project_imports(path) if t not in LEAVES] == [], module


def test_the_table_knows_every_layer():
    # A new top-level folder must be placed in the table, not silently fall into "kvpool".
    assert set(PACKAGES) == {"kvpool", *(p for p in LAYERS if p not in ("kvpool", "top"))}


def test_the_check_catches_a_violation():
    # The checker itself must be able to fail: a store module importing the public API is flagged.
    assert not allowed("store", layer_of("kvpool.client"), "kvpool.client")
    assert not allowed("proto", layer_of("kvpool.store.records"), "kvpool.store.records")
    assert not allowed("kvpool", layer_of("kvpool.cli"), "kvpool.cli")
    assert not allowed("connector", layer_of("kvpool.engine_adapter.request"), "kvpool.engine_adapter.request")
    assert allowed("connector", layer_of("kvpool.hooks"), "kvpool.hooks")
    assert allowed("top", layer_of("kvpool.store.master"), "kvpool.store.master")


class TestNoTorchBelowKernels:
    """A storage node runs without torch or CuPy: nothing in store/ (or tiers/) may import torch, lazily or not, and
    CuPy only inside the functions of tiers/gpu.py (the GPU code paths; tests/tiers/test_imports.py checks that those
    imports are inside functions), so importing store/ or tiers/ never imports CuPy."""

    CUPY_FILES = {"tiers/gpu.py"}

    def test_store_and_tiers(self):
        bad = []
        for folder in ("store", "tiers", "proto"):
            for path in sorted((ROOT / folder).rglob("*.py")):
                rel = str(path.relative_to(ROOT))
                for node in ast.walk(ast.parse(path.read_text(), str(path))):
                    names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                             else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    bad += [f"{rel}:{node.lineno} {n}" for n in names
                            if n.split(".")[0] == "torch" or (n.split(".")[0] == "cupy" and rel not in self.CUPY_FILES)]
        assert bad == []
