"""Layering: ``fourfold.core`` imports torch and the standard library only (and, of fourfold, the
torch-free ``fourfold.names`` alone); the trainers never import the embedded tasks; reporting never
imports models or rollout.

For ``fourfold.core``, a fresh interpreter blocks the heavy third-party packages with a meta-path
finder (any attempt to import them is recorded and fails), imports the module under test, then
reports (a) every blocked import attempted, (b) every ``fourfold.<x>`` module other than
``fourfold``, ``fourfold.names`` and ``fourfold.core*``, and (c) every new top-level module that is neither torch nor
the standard library (torch itself imports numpy, so what torch loads is the baseline).

For the rules between fourfold's own packages (``RULES``), two checks: every import statement in
the importer's files, at the top or inside a function, names no forbidden module; and a fresh
interpreter that imports each of the importer's modules loads no forbidden one through another
module. Each check also runs on small fake modules that break the rules, so it is known to fail
when it should.
"""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import fourfold

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
                if not (name in ("fourfold", "fourfold.names") or name == "fourfold.core" or name.startswith("fourfold.core.")):
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


# ---- rules between fourfold's own packages ---------------------------------------------------------

PACKAGE = Path(fourfold.__file__).parent
RULES = {  # importer (a module, or a package and everything in it) -> modules it must never import
    "fourfold.trainers": ("fourfold.tasks",),
    "fourfold.reporting": ("fourfold.models", "fourfold.rollout"),
    "fourfold.trainers.gym_plots": ("fourfold.models", "fourfold.rollout"),  # the gym plots are reporting
}


def _module_files(root: Path, prefix: str) -> dict[str, Path]:
    """{module name: file} of the module ``prefix`` or the package of that name under ``root``."""
    parts = prefix.split(".")
    single = root.joinpath(*parts[:-1], parts[-1] + ".py")
    if single.is_file():
        return {prefix: single}
    package = root.joinpath(*parts)
    files = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("").parts
        files[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = path
    return files


def _imported(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, module name) of every import statement in ``path`` (top level or inside a function);
    ``from a import b`` names both ``a`` and ``a.b``; relative imports are resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def _is_under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def static_violations(root: Path, rules: dict) -> list[str]:
    """``file:line: imports X`` for every import statement that breaks a rule, in file order."""
    out = {}  # one message per statement: the first forbidden name it imports
    for importer, forbidden in rules.items():
        for module, path in _module_files(root, importer).items():
            for line, name in _imported(module, path):
                if _is_under(name, forbidden):
                    out.setdefault(f"{path.relative_to(root)}:{line}", f"imports {name}")
    return [f"{where}: {what}" for where, what in out.items()]


RULE_CHECK = textwrap.dedent(
    """
    import importlib, sys
    extra_path, forbidden, targets = sys.argv[1], tuple(sys.argv[2].split(",")), sys.argv[3:]
    if extra_path:
        sys.path.insert(0, extra_path)
    for target in targets:
        before = set(sys.modules)
        importlib.import_module(target)
        bad = sorted(m for m in set(sys.modules) - before if any(m == f or m.startswith(f + ".") for f in forbidden))
        print(f"{target}: " + (", ".join(bad) if bad else "OK"))
    """
)


def loaded_violations(root: Path, rules: dict, extra_path: str = "") -> list[str]:
    """``module: X, Y`` for every importer module whose import loads forbidden modules (one fresh
    interpreter per rule; a module is named by the first importer that loads it)."""
    out = []
    for importer, forbidden in rules.items():
        modules = list(_module_files(root, importer))
        result = subprocess.run([sys.executable, "-c", RULE_CHECK, extra_path, ",".join(forbidden), *modules],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        out += [line for line in result.stdout.splitlines() if not line.endswith(": OK")]
    return out


def test_trainers_never_import_tasks_and_reporting_never_imports_models_or_rollout():
    assert static_violations(PACKAGE.parent, RULES) == []
    assert loaded_violations(PACKAGE.parent, RULES) == []


def test_rule_checks_detect_violations(tmp_path):
    """A fake package whose modules break the rules directly, lazily, through ``from x import y``,
    through a relative import and through another module has each one reported; its clean modules
    are not."""
    files = {
        "fake/__init__.py": "",
        "fake/tasks.py": "x = 1\n",
        "fake/trainers/__init__.py": "",
        "fake/trainers/clean.py": "import fourfold.config\n",
        "fake/trainers/direct.py": "import fourfold.tasks.review\n",
        "fake/trainers/from_import.py": "from fourfold.tasks import get_task\n",
        "fake/trainers/lazy.py": "def f():\n    from fourfold import tasks\n",
        "fake/trainers/relative.py": "from ..tasks import x\n",
        "fake/trainers/rollout_user.py": "import fourfold.rollout.eager\n",
        "fake/reporting.py": "from fake.trainers import rollout_user\n",
    }
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    rules = {"fake.trainers": ("fourfold.tasks", "fake.tasks"),
             "fake.reporting": ("fourfold.models", "fourfold.rollout")}
    found = static_violations(tmp_path, rules)
    assert found == [
        "fake/trainers/direct.py:1: imports fourfold.tasks.review",
        "fake/trainers/from_import.py:1: imports fourfold.tasks",
        "fake/trainers/lazy.py:2: imports fourfold.tasks",
        "fake/trainers/relative.py:1: imports fake.tasks",
    ], found
    loaded = loaded_violations(tmp_path, rules, extra_path=str(tmp_path))
    assert any(v.startswith("fake.trainers.direct: fourfold.tasks") for v in loaded), loaded
    assert any(v.startswith("fake.reporting: ") and "fourfold.rollout.eager" in v and "fourfold.models" in v
               for v in loaded), loaded
    assert not any(v.startswith(("fake.trainers.clean:", "fake.trainers.lazy:")) for v in loaded), loaded


# ---- the applications sit on top ---------------------------------------------------------------------

APPS = "fourfold.apps"
"""The applications (the demo and its report, the experiments and their families, evaluation, the
stage cache, generate/score, publish, provenance, the report kit): one subpackage that may import
everything below it; nothing below imports it (only ``cli`` calls it)."""
MAX_ROOT_MODULES = 8


def _below_applications(root: Path = PACKAGE) -> list[str]:
    """Every top-level module and package of fourfold other than the applications and the CLI."""
    names = sorted({p.stem if p.is_file() else p.name for p in root.iterdir()
                    if (p.suffix == ".py" or (p / "__init__.py").is_file()) and not p.name.startswith("_")})
    prefix = root.name
    return [f"{prefix}.{n}" for n in names if f"{prefix}.{n}" != f"{prefix}.apps" and n != "cli"]


def test_nothing_below_the_applications_imports_them(tmp_path):
    below = _below_applications()
    assert {"fourfold.trainers", "fourfold.models", "fourfold.reporting", "fourfold.core", "fourfold.run"} <= set(below), below
    assert static_violations(PACKAGE.parent, {m: (APPS,) for m in below}) == []
    assert loaded_violations(PACKAGE.parent, {m: (APPS,) for m in below}) == []
    # the check is by prefix: a new module under apps/ is covered without naming it
    for name, source in {"fake/__init__.py": "", "fake/apps/__init__.py": "", "fake/apps/new_app.py": "x = 1\n",
                         "fake/models.py": "from fake.apps import new_app\n", "fake/cli.py": "import fake.apps.new_app\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    fake_below = _below_applications(tmp_path / "fake")
    assert fake_below == ["fake.models"], fake_below
    assert static_violations(tmp_path, {m: ("fake.apps",) for m in fake_below}) == ["fake/models.py:1: imports fake.apps"]


def test_the_package_root_holds_the_ground_and_the_face_only():
    """At most MAX_ROOT_MODULES modules in fourfold/ itself: the applications, the run, the loops and
    the rollout live in their own packages. ``__main__.py`` (``python -m fourfold``, three lines
    calling the cli) is the face's other door, not a module of its own."""
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__main__.py")
    assert len(root) <= MAX_ROOT_MODULES, root


def import_graph(root: Path, prefix: str) -> dict[str, set[str]]:
    """{module: fourfold modules it imports} for every module of ``prefix`` (imports inside
    functions count: a lazy import still closes a circle); a package's name stands for its
    ``__init__``."""
    files = _module_files(root, prefix)
    graph = {}
    for module, path in files.items():
        targets = set()
        for _, name in _imported(module, path):
            while name and name not in files:  # ``from a.b import name``: the module a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), each sorted, the list sorted.
    A package importing its own submodules (``__init__`` re-exports) is not a circle: an edge from a
    package to a module inside it is left out."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def inside(pkg: str, mod: str) -> bool:
        return mod.startswith(pkg + ".")

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph or inside(v, w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_in_the_package():
    assert circles(import_graph(PACKAGE.parent, "fourfold")) == []
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "p": {"p.x"}, "p.x": {"p"}}
    assert circles(graph) == [["a", "b", "c"]]


def private_imports(root: Path, prefix: str) -> list[str]:
    """``file:line: name`` for every private (``_name``) name a module of ``prefix`` takes from
    another fourfold module: ``from fourfold... import _name`` (relative imports too), and
    ``module._name`` on a name it imported from fourfold."""
    found = []
    for path in _module_files(root, prefix).values():
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and ((node.module or "").startswith(("fourfold", "fake")) or node.level):
                found += [f"{path.relative_to(root)}:{node.lineno}: {a.name}" for a in node.names if _private(a.name)]
                imported |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith(("fourfold", "fake"))}
        found += [f"{path.relative_to(root)}:{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id in imported and _private(node.attr)]
    return sorted(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_takes_another_modules_private_names(tmp_path):
    """No module of the package imports another module's private (``_name``) names, nor reaches one
    through a module it imported (a shared piece is given a public name where it lives); the check
    finds each pattern in a fake module that does."""
    assert private_imports(PACKAGE.parent, "fourfold") == []
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "__init__.py").write_text("")
    (tmp_path / "fake" / "app.py").write_text("from fourfold.apps.cache import digest, _x\nfrom .other import _y\n"
                                              "from fourfold import dist\nimport fourfold.cli as c\n"
                                              "dist._peer(c._resolve, dist.world, __name__)\n")
    assert private_imports(tmp_path, "fake") == ["fake/app.py:1: _x", "fake/app.py:2: _y", "fake/app.py:5: c._resolve",
                                                 "fake/app.py:5: dist._peer"]


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 600, 80


def oversized(root: Path, prefix: str) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions (or methods) over MAX_FUNCTION_LINES."""
    found = []
    for path in _module_files(root, prefix).values():
        source = path.read_text()
        rel = path.relative_to(root)
        if len(source.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{rel}: {len(source.splitlines())} lines")
        found += [f"{rel}:{node.lineno}: {node.name} {node.end_lineno - node.lineno + 1} lines"
                  for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    return found


def test_no_module_over_600_lines_and_no_function_over_80(tmp_path):
    assert oversized(PACKAGE.parent, "fourfold") == []
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    (tmp_path / "fake" / "big.py").write_text("def long():\n" + body + "\n" * 600)
    assert oversized(tmp_path, "fake") == ["fake/big.py: 681 lines", "fake/big.py:1: long 81 lines"]


# ---- the loops read as one-process code ----------------------------------------------------------------

LOOPS = "fourfold.trainers"
"""The loops and their parts: every collective they need goes through the data-parallel seam
(``fourfold.run.parallel``), so none of them imports ``fourfold.dist`` or passes a process group
around."""


def seam_violations(root: Path, prefix: str, dist_module: str = "fourfold.dist") -> list[str]:
    """``file:line: ...`` for every import of ``dist_module`` (top level or inside a function) and
    every function (or lambda) parameter named ``world`` in the modules of ``prefix``."""
    found = []
    for module, path in _module_files(root, prefix).items():
        rel = path.relative_to(root)
        found += [f"{rel}:{line}: imports {name}" for line, name in _imported(module, path)
                  if _is_under(name, (dist_module,))]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
                name = getattr(node, "name", "lambda")
                found += [f"{rel}:{node.lineno}: {name} takes world" for p in params if p.arg == "world"]
    return sorted(set(found))


def test_no_loop_imports_dist_or_takes_a_world(tmp_path):
    assert seam_violations(PACKAGE.parent, LOOPS) == []
    files = {
        "fake/__init__.py": "",
        "fake/dist.py": "x = 1\n",
        "fake/trainers/__init__.py": "",
        "fake/trainers/clean.py": "from fake.run.parallel import rank_slice\n\ndef f(rows, worlds=1):\n    return rows\n",
        "fake/trainers/top.py": "from fake import dist\n",
        "fake/trainers/lazy.py": "def f():\n    import fake.dist as d\n    return d\n",
        "fake/trainers/param.py": "def collect(rows, *, world=None):\n    return rows\n",
        "fake/trainers/method.py": "class A:\n    async def step(self, world):\n        pass\n",
        "fake/trainers/lam.py": "g = lambda world: world\n",
    }
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    assert seam_violations(tmp_path, "fake.trainers", "fake.dist") == [
        "fake/trainers/lam.py:1: lambda takes world",
        "fake/trainers/lazy.py:2: imports fake.dist",
        "fake/trainers/method.py:2: step takes world",
        "fake/trainers/param.py:1: collect takes world",
        "fake/trainers/top.py:1: imports fake.dist",
    ]
