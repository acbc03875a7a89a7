"""Import rule for fourfold.data: torch, stdlib, fourfold.core/errors/data at module level; Arrow
only lazily (inside the Parquet reader); never models, trainers, rollout or transformers."""
import ast
import sys
from pathlib import Path

import fourfold.data

PKG = Path(fourfold.data.__file__).parent
TOP_LEVEL_OK = {"torch", "fourfold"}
LAZY_OK = {"pyarrow", "datasets"}
FOURFOLD_OK = ("fourfold.data", "fourfold.core", "fourfold.errors")


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node, [node.module]


def test_import_rule():
    files = sorted(PKG.rglob("*.py"))
    assert files
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        module_level = {id(n) for n in tree.body}
        for node, names in _imports(tree):
            for name in names:
                root = name.split(".")[0]
                where = f"{path.name}:{node.lineno}: import {name}"
                if root == "fourfold":
                    assert name.startswith(FOURFOLD_OK), where
                elif root in LAZY_OK:
                    assert id(node) not in module_level, where + " must be lazy (inside a function)"
                elif root not in sys.stdlib_module_names and root != "__future__":
                    assert root in TOP_LEVEL_OK, where
