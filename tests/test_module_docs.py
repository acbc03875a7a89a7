"""Module docstrings stay short (the long explanations live in docs/), and every docs/ page a
module's docstring points to exists."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_DOCSTRING_LINES = 40


def _docstrings():
    for path in sorted((ROOT / "fourfold").rglob("*.py")):
        yield path.relative_to(ROOT), ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def test_module_docstrings_are_at_most_40_lines():
    long = {str(p): len(d.splitlines()) for p, d in _docstrings() if len(d.splitlines()) > MAX_DOCSTRING_LINES}
    assert not long, f"move these module docstrings into docs/ and point to the page: {long}"


def test_the_doc_pages_docstrings_name_exist():
    named = {(str(p), page) for p, d in _docstrings() for page in re.findall(r"docs/[\w.-]+\.md", d)}
    assert any(page == "docs/data.md" for _, page in named)  # the scan finds the pointers
    missing = sorted((p, page) for p, page in named if not (ROOT / page).is_file())
    assert not missing, missing
