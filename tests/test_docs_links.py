"""README.md and docs/*.md as a reader follows them: every relative link names a file that exists
and every ``#anchor`` a heading of its target (GitHub's slugs), and the figures they quote that
the code can recompute cheaply agree with it (issue 40, items 5, 14 and 15)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, backticks and punctuation dropped, spaces -> '-'."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _outside_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (a repeated heading's get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _outside_code(page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(pages) -> list[str]:
    bad = []
    for page in pages:
        for target in LINK.findall(_outside_code(page.read_text())):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path) if path else page
            if not dest.exists():
                bad.append(f"{page.name}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{page.name}: {target}: no such heading in {dest.name}")
    return bad


def test_slug_hand_cases():
    assert slug("The horizon family: when does the critic pay?") == "the-horizon-family-when-does-the-critic-pay"
    assert slug("`fourfold score`") == "fourfold-score"
    assert slug("On another machine") == "on-another-machine"


def test_the_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n\n[ok](b.md#the-b) [x](b.md#nope) [y](c.md) "
                                   "[self](#two-words) [web](https://example.org)\n```\n[in code](z.md)\n```\n")
    (tmp_path / "b.md").write_text("# The b\n")
    assert broken_links([tmp_path / "a.md"]) == ["a.md: b.md#nope: no such heading in b.md", "a.md: c.md: no such file"]


def test_every_link_and_anchor_of_the_readme_and_docs_resolves():
    assert broken_links(PAGES) == []


def test_the_arithmetic_page_counts_its_tokenizer_right():
    from fourfold.tasks.arithmetic import WORDS
    from fourfold.tasks.tokenizer import build_word_tokenizer

    tok = build_word_tokenizer(WORDS)
    special = len(tok.all_special_tokens)
    text = (ROOT / "docs" / "arithmetic.md").read_text()
    assert f"{len(WORDS)} words and {special} special tokens" in text
    assert len(tok) == len(WORDS) + special


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_is_utf8_with_a_title(page):
    assert page.read_text(encoding="utf-8").lstrip().startswith("#")
