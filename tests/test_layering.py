"""Layering: ``fourfold.core`` imports torch and the standard library only.

A fresh interpreter blocks the heavy third-party packages with a meta-path finder (any attempt to
import them is recorded and fails), imports the module under test, then reports (a) every blocked
import attempted, (b) every ``fourfold.<x>`` module other than ``fourfold`` and ``fourfold.core*``,
and (c) every new top-level module that is neither torch nor the standard library (torch itself
imports numpy, so what torch loads is the baseline). The second test runs the same check on small
fake modules that break each rule, so the check is known to fail when it should.
"""

import subprocess
import sys
import textwrap

BLOCKED = ("transformers", "datasets", "gymnasium", "tokenizers", "safetensors", "matplotlib", "rich",
           "yaml", "numpy")

CHECK = textwrap.dedent(
    """
    import importlib, sys
    extra_path, blocked, targets = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    if extra_path:
        sys.path.insert(0, extra_path)
    attempted = []

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                attempted.append(name)
                raise ImportError(f"{name} is blocked by the layering test")
            return None

    import torch  # the allowed base; torch may import numpy itself
    baseline = {m.split(".")[0] for m in sys.modules}
    blocked = [b for b in blocked if b not in baseline]  # cannot block what torch already loaded
    sys.meta_path.insert(0, Blocker())
    failed = False
    for target in targets:  # each target is checked on what it adds to sys.modules
        attempted.clear()
        before = set(sys.modules)
        problems = []
        try:
            importlib.import_module(target)
        except Exception as e:
            problems.append(f"import {target} failed: {type(e).__name__}: {e}")
        problems += [f"attempted blocked import: {n}" for n in attempted]
        for name in sorted(set(sys.modules) - before):
            top = name.split(".")[0]
            if top == "fourfold":
                if not (name == "fourfold" or name == "fourfold.core" or name.startswith("fourfold.core.")):
                    problems.append(f"imported other fourfold subpackage: {name}")
            elif top not in baseline and top not in sys.stdlib_module_names and top != target.split(".")[0]:
                problems.append(f"imported non-stdlib module: {name}")
        failed = failed or bool(problems)
        print(f"{target}: " + ("; ".join(problems) if problems else "OK"))
    sys.exit(1 if failed else 0)
    """
)


def run_check(*targets: str, extra_path: str = "") -> subprocess.CompletedProcess:
    """One fresh interpreter checking ``targets`` in order; stdout has one line per target."""
    return subprocess.run(
        [sys.executable, "-c", CHECK, extra_path, ",".join(BLOCKED), *targets],
        capture_output=True, text=True, timeout=120,
    )


def test_core_imports_torch_and_stdlib_only():
    result = run_check("fourfold.core")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "fourfold.core: OK"


VIOLATORS = {
    "fake_transformers": ("import transformers\n", "attempted blocked import: transformers"),
    "fake_guarded_gymnasium": ("try:\n    import gymnasium\nexcept ImportError:\n    pass\n",
                               "attempted blocked import: gymnasium"),
    "fake_subpackage": ("import fourfold.data\n", "imported other fourfold subpackage: fourfold.data"),
    "fake_third_party": ("import pytest\n", "imported non-stdlib module: pytest"),
}


def test_check_detects_violations(tmp_path):
    """The same check, on fake modules that each break one rule, reports every one of them (so the
    test above is not vacuous); a clean fake module passes."""
    for name, (source, _) in VIOLATORS.items():
        (tmp_path / f"{name}.py").write_text(source)
    (tmp_path / "fake_clean.py").write_text("import json\nimport torch\nimport fourfold.core\n")
    result = run_check("fake_clean", *VIOLATORS, extra_path=str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.strip().splitlines())
    assert lines["fake_clean"] == "OK", result.stdout
    for name, (_, expected) in VIOLATORS.items():
        assert expected in lines[name], result.stdout + result.stderr
