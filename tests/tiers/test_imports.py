"""tiers/ is the bottom layer: a storage node runs it without torch or CuPy, so it imports only numpy, xxhash, the
standard library, itself, and the one project leaf that holds C code it runs (kvpool.copyhash: the SSD record
reader in C; it imports nothing of the project but its own extension). The one exception is CuPy, and only as
DESIGN allows it: imported inside a function body of tiers/gpu.py (the GPU code paths), never at module level and
never anywhere else; so importing tiers/ never imports CuPy, and a machine without CuPy or a GPU runs every tier
but HBM."""

from __future__ import annotations

import ast
import pathlib
import sys

TIERS = pathlib.Path(__file__).resolve().parents[2] / "tiers"
ALLOWED_THIRD_PARTY = {"numpy", "xxhash"}
ALLOWED_PROJECT = {"kvpool.copyhash"}      # a leaf (tests/test_layers.py LEAVES) whose only import is its C extension
LAZY_ONLY = {"cupy": {"gpu.py"}}   # module -> the tiers files that may import it inside a function


def _module_level(tree: ast.Module) -> set[int]:
    """ids of import nodes that run when the module is imported (not inside a def/lambda)."""
    found: set[int] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.add(id(child))
            walk(child)

    walk(tree)
    return found


def test_tiers_import_only_stdlib_numpy_xxhash_and_themselves():
    bad = []
    for path in sorted(TIERS.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        eager = _module_level(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:                     # relative: inside tiers/
                    continue
                mods = [f"{node.module}.{a.name}" if node.module == "kvpool" else node.module or ""
                        for a in node.names]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if path.name in LAZY_ONLY.get(top, ()) and id(node) not in eager:
                    continue
                if mod in ALLOWED_PROJECT:
                    continue
                if top not in sys.stdlib_module_names and top not in ALLOWED_THIRD_PARTY and top != "__future__":
                    bad.append(f"{path.name}: {mod}")
    assert bad == []


def test_the_lazy_rule_flags_module_level_and_misplaced_cupy():
    tree = ast.parse("import cupy\ndef f():\n    import cupy as cp\n    return cp\n")
    eager = _module_level(tree)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import)]
    assert [id(n) in eager for n in imports] == [True, False]
    assert "dram.py" not in LAZY_ONLY["cupy"]
