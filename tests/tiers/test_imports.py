"""tiers/ is the bottom layer: a storage node runs it without torch, so it imports only numpy, xxhash, the
standard library and itself."""

from __future__ import annotations

import ast
import pathlib
import sys

TIERS = pathlib.Path(__file__).resolve().parents[2] / "tiers"
ALLOWED_THIRD_PARTY = {"numpy", "xxhash"}


def test_tiers_import_only_stdlib_numpy_xxhash_and_themselves():
    bad = []
    for path in sorted(TIERS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:                     # relative: inside tiers/
                    continue
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ALLOWED_THIRD_PARTY and top != "__future__":
                    bad.append(f"{path.name}: {mod}")
    assert bad == []
