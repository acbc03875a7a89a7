"""Figures README.md and docs/*.md quote that the code recomputes without training: each is parsed
from the page, so a doc edit that drifts from the code (or code that drifts from its docs) fails
(issue 40, "What to build" item 5). Defaults tables against the config dataclasses and the CLI's
parsers, parameter counts of the demo and benchmark models (built on the meta device), the review
world's vocabulary, the commands and metric names the pages name, best-of-n's KL figures. The
links and anchors, and the arithmetic tokenizer's count, are tests/test_docs_links.py's."""
import argparse
import importlib
import math
import re
from pathlib import Path

import pytest
import yaml

from fourfold.core.overoptimization import bon_kl

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _read(name: str) -> str:
    return (ROOT / name).read_text()


def _one(pattern: str, text: str) -> re.Match:
    m = re.search(pattern, text)
    assert m, f"the page no longer says {pattern!r}"
    return m


# ---- defaults tables -------------------------------------------------------------------------------

def table_rows(text: str, first_header: str, second_header: str | None = None) -> list[list[str]]:
    """The body rows (cells stripped) of every markdown table whose header cells start with
    ``first_header`` (and ``second_header``)."""
    rows, inside = [], False
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]] if line.startswith("|") else None
        if cells is None:
            inside = False
        elif not inside and cells[0] == first_header and second_header in (None, cells[1]):
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return rows


def documented_defaults(rows, key_of=lambda k: k) -> dict:
    """``{key: the default a row quotes}`` from (keys cell, defaults cell) rows: the keys are the
    cell's backticked names; the defaults the other cell's backticked values (or its comma-separated
    words): one per key, or one for all of them, or (one key) the first of a list of values."""
    out = {}
    for cells in rows:
        keys = [key_of(k) for k in re.findall(r"`([^`]+)`", cells[0])]
        cell = re.sub(r"\s*\([^)]*\)", "", cells[1]) or cells[1]  # "(= `clip_eps`)", "(preset)": comments
        values = re.findall(r"`([^`]*)`", cell) or [v.strip() for v in cell.split(",")]
        if len(values) == len(keys):
            out.update(zip(keys, values))
        elif len(values) == 1 or len(keys) == 1:
            out.update((k, values[0]) for k in keys)
        else:
            raise AssertionError(f"row {cells[:2]}: {len(keys)} keys, {len(values)} defaults")
    return out


def config_defaults(stage: str) -> dict:
    from fourfold.config.keys import config_keys
    from fourfold.config.stages import STAGES

    module, _, name = STAGES[stage].config.partition(":")
    return {k.key: yaml.safe_load(k.default) for k in config_keys(getattr(importlib.import_module(module), name))}


def test_the_readme_no_critic_table_quotes_ppos_defaults_first():
    quoted = documented_defaults(table_rows(_read("README.md"), "key", "values (default first)"))
    assert len(quoted) >= 20 and "ppo.advantage" in quoted
    defaults = config_defaults("ppo")
    wrong = {k: (v, defaults.get(k, "no such key")) for k, v in quoted.items() if yaml.safe_load(v) != defaults.get(k)}
    assert wrong == {}


def test_the_engines_page_quotes_the_generation_defaults_first():
    quoted = documented_defaults(table_rows(_read("docs/engines.md"), "key", "values (default first)"))
    assert len(quoted) == 7
    defaults = config_defaults("ppo")
    assert {k: yaml.safe_load(v) for k, v in quoted.items()} == {k: defaults[k] for k in quoted}


def test_the_marked_defaults_and_presets_of_correction_and_dpo():
    from fourfold.names import CORRECTION_CAPS

    defaults = config_defaults("ppo")
    assert "| `none` (default) |" in _read("docs/correction.md") and defaults["ppo.rollout_correction"] == "none"
    assert "| `sigmoid` (default) |" in _read("README.md") and config_defaults("dpo")["dpo.loss"] == "sigmoid"
    text = " ".join(_read("docs/correction.md").split())
    token, seq, geo = _one(r"CORRECTION_CAPS`: ([\d.]+) for the token modes, ([\d.]+) for the sequence modes, "
                           r"([\d.]+) for `geo_mis`", text).groups()
    assert {m: str(c).removesuffix(".0") for m, c in CORRECTION_CAPS.items()} == {
        "token_tis": token, "token_mis": token, "seq_tis": seq, "seq_mis": seq, "geo_mis": geo}
    assert "so it is off by default" in _read("README.md") and defaults["model.compile"] is False


def test_the_lora_page_quotes_loras_defaults():
    from fourfold.config.lora import LoraConfig

    quoted = documented_defaults(table_rows(_read("docs/lora.md"), "key"))
    assert set(quoted) == {"r", "alpha", "dropout", "target_modules"}
    assert {k: yaml.safe_load(v) for k, v in quoted.items()} == {k: getattr(LoraConfig(), k) for k in quoted}
    assert "`model.critic_mode: separate | adapter` (default `separate`)" in _read("docs/lora.md")
    assert config_defaults("ppo")["model.critic_mode"] == "separate"


def test_the_readmes_help_entry_and_precision_default_are_ppos(capsys):
    from fourfold.cli import main

    key, kind, default = _one(r"\(`  (ppo\.\w+)  (\w+)  default: ([\w.]+)  \.\.\.`", _read("README.md")).groups()
    text = " ".join(_read("README.md").split())
    with pytest.raises(SystemExit):
        main(["ppo", "--help"])
    assert re.search(rf"^  {re.escape(key)}  {kind}  default: {re.escape(default)}  ", capsys.readouterr().out, re.M)
    assert "`fp32` (default)" in text and config_defaults("ppo")["model.precision"] == "fp32"


def _subcommands() -> argparse._SubParsersAction:
    from fourfold.cli import build_parser

    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))


def _subparser(name: str) -> argparse.ArgumentParser:
    return _subcommands().choices[name]


def _flag_defaults(parser: argparse.ArgumentParser) -> dict:
    return {a.option_strings[-1]: a for a in parser._actions if a.option_strings}


def test_the_new_model_flags_table_quotes_the_commands_defaults():
    flags = _flag_defaults(_subparser("new-model"))
    quoted = documented_defaults(table_rows(_read("docs/new-model.md"), "flag"), key_of=lambda k: k.split()[0])
    assert set(quoted) == set(flags) - {"--help"}
    for flag, text in quoted.items():
        action = flags[flag]
        want = {"(required)": "required", "off": False, "--hidden": None}.get(text, text)  # 4 x --hidden: unset
        got = "required" if action.required else action.default
        assert str(got) == str(want), (flag, text, got)


def test_the_reward_server_page_quotes_serve_rewards_defaults():
    flags = _flag_defaults(_subparser("serve-reward"))
    text = " ".join(_read("docs/rewards.md").split())
    quoted = dict(re.findall(r"`(--[a-z-]+)`(?: [a-z]+)? \((?:default )?([\d.]+)[);:]", text))
    quoted.pop("--host")
    assert set(quoted) >= {"--port", "--max-wait-ms", "--batch-size", "--request-timeout-s"}
    assert {f: float(v) for f, v in quoted.items()} == {f: float(flags[f].default) for f in quoted}
    assert "`--host` (default 127.0.0.1" in text and flags["--host"].default == "127.0.0.1"


# ---- model sizes -----------------------------------------------------------------------------------

def llama_parameters(vocab: int, hidden: int, layers: int, heads: int, positions: int = 256) -> dict:
    """The parameter counts of :func:`llama_config`'s model of these sizes, built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    from fourfold.models.factory import llama_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(llama_config(vocab, hidden, layers, heads, max_positions=positions))
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "without_input_embedding": total - model.get_input_embeddings().weight.numel()}


def _benchmark_defaults(module: str, argv=()):
    import sys

    sys.path.insert(0, str(ROOT))
    try:
        return importlib.import_module(f"benchmarks.{module}").parse_args(list(argv))
    finally:
        sys.path.remove(str(ROOT))


def test_workload_w_and_h512_have_the_quoted_sizes():
    w = _benchmark_defaults("ppo_iteration")
    assert (w.hidden, w.layers, w.heads, w.vocab) == (256, 4, 4, 512)
    bench = " ".join(_read("docs/benchmarks.md").split())
    assert "hidden 256 / 4 layers / vocab 512" in bench
    m = _one(r"hidden 256 / 4 layers / ([\d.]+)M parameters", " ".join(_read("docs/scaling.md").split()))
    assert f"{llama_parameters(512, 256, 4, 4)['total'] / 1e6:.1f}" == m.group(1)
    h512 = f"{llama_parameters(512, 512, 8, 8)['total'] / 1e6:.0f}M parameters per model"
    assert f"`--hidden 512 --layers 8 --heads 8` ({h512})" in bench
    assert f"hidden 512 / 8 layers ({h512}" in _read("docs/lora.md")


def test_the_demo_model_has_the_quoted_sizes_and_vocabulary():
    from fourfold.config.demo import DemoModelConfig
    from fourfold.tasks import build_word_tokenizer
    from fourfold.tasks.review_grammar import vocabulary

    words, tokens = len(vocabulary()), len(build_word_tokenizer(vocabulary()))
    demo = DemoModelConfig()
    assert (demo.hidden_size, demo.num_layers, demo.num_heads) == (128, 2, 4)
    bench = " ".join(_read("docs/benchmarks.md").split())
    assert bench.count(f"{tokens} tokens: {words} words and {tokens - words} special") == 2
    assert f"grammar over {words} words" in _read("docs/demo.md")
    assert f"a vocabulary of {words} words" in " ".join(_read("docs/review.md").split())
    assert _benchmark_defaults("decode").vocab == tokens
    assert re.search(r'"--vocab", type=int, default=(\d+)\)', _read("benchmarks/train_step.py")).group(1) == str(tokens)
    n = llama_parameters(tokens, 128, 2, 4, demo.max_positions)["without_input_embedding"]
    assert f"about {6 * n * 896 * 32 / 1e9:.0f} GFLOP per update (6 x {n / 1e6:.2f}M parameters, the input " \
           "embedding's lookup left out, x 896 tokens per minibatch x 32 steps" in bench


def test_the_new_model_page_counts_its_parameters_and_smallest_vocabulary():
    from fourfold.apps.new_model import NewModelSpec

    text = " ".join(_read("docs/new-model.md").split())
    m = _one(r"a bpe tokenizer of (\d+) tokens .*?\(2 layers, hidden 64, 4 heads, 128 positions\) of ([\d,]+) parameters", text)
    vocab, quoted = int(m.group(1)), int(m.group(2).replace(",", ""))
    assert llama_parameters(vocab, 64, 2, 4, 128)["total"] == quoted
    V, H, L, F = vocab, 64, 2, 256  # the page's formula, 2VH + L(4H^2 + 3HF + 2H) + H
    assert "2VH + L(4H^2 + 3HF + 2H) + H" in text and 2 * V * H + L * (4 * H * H + 3 * H * F + 2 * H) + H == quoted
    bpe = NewModelSpec(corpus="c", out="o", tokenizer="bpe").min_vocab()
    word = NewModelSpec(corpus="c", out="o", tokenizer="word").min_vocab()
    specials = word - 1
    assert f"the {specials} special tokens and the {bpe - specials} bytes of byte-level BPE ({bpe})" in text
    assert f"the {specials} and one word ({word})" in text


def test_the_new_model_pages_worked_example_writes_what_the_page_says(tmp_path, monkeypatch, capsys):
    """The page's corpus script and its new-model command, run: the line it prints is the page's
    (316 tokens, 171,840 parameters), and the SFT step count and entropy figures follow from it."""
    from fourfold.cli import main

    page = _read("docs/new-model.md")
    script = _one(r"(?s)python - <<'EOF'\n(.*?)\nEOF\n", page).group(1)
    command = _one(r"\nfourfold new-model (--corpus corpus\.txt --out tiny [^\n\\]*)\n", page).group(1).split()
    shown = _one(r"\nfourfold new-model (--corpus corpus\.txt --out tiny \\\n[^\n]*)\n", page).group(1)
    assert sorted(shown.replace("\\\n", " ").split()) == sorted(command)  # the command the output is shown for
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "docs/new-model.md", "exec"), {})
    assert main(["new-model", *command]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    said = _one(r"```bash\nfourfold new-model --corpus corpus.txt --out tiny \\\n[^\n]*\n((?:# [^\n]*\n)+)", page).group(1)
    said = " ".join(said.replace("\n#", "\n").lstrip("# ").split())
    assert printed == said
    text = " ".join(page.split())
    lines = sum(1 for _ in open("corpus.txt"))
    epochs, batch = (int(x) for x in _one(r"train\.epochs=(\d+) train\.lr=\S+ train\.batch_size=(\d+)", text).groups())
    assert f"{epochs * math.ceil(lines / batch)} steps; `sft/loss`" in text
    entropy = 3 * math.log(4)
    assert f"3 x ln 4 = {entropy:.2f} nats a sentence over its 8 predicted tokens, about {entropy / 8:.2f} a token" in text


# ---- names the pages use ---------------------------------------------------------------------------

def test_every_command_the_pages_run_exists_and_the_readme_names_every_command():
    commands = _subcommands().choices
    named = {}  # the commands of the pages' code (fenced blocks, `inline code`), not prose ("installs fourfold and")
    for page in PAGES:
        code = " ".join(re.findall(r"```.*?```|`[^`\n]+`", page.read_text(), flags=re.S))
        for m in re.finditer(r"(?<![\w./-])(installs )?fourfold ([a-z][a-z-]*)", code):
            if not m.group(1):
                named.setdefault(m.group(2), page.name)
    assert len(named) >= 10
    assert {c: p for c, p in named.items() if c not in commands} == {}
    readme = set(re.findall(r"fourfold ([a-z][a-z-]*)", _read("README.md")))
    assert set(commands) - readme == set()


def test_the_readme_names_the_stages_torchrun_runs_and_the_pages_only_worlds_that_exist():
    from fourfold.config.stages import STAGES, torchrun_stages

    text = " ".join(_read("README.md").split())
    m = _one(r"-m fourfold\.cli (\w+) --config \w+\.yaml` \(likewise ((?:`\w+`, )+)`(\w+)`,", text)
    assert [m.group(1), *re.findall(r"`(\w+)`", m.group(2)), m.group(3)] == torchrun_stages()
    worlds = {name for stage in STAGES.values() for name in (stage.task, *(t[0] for t in stage.tasks)) if name}
    quoted = {w for page in PAGES for w in re.findall(r"--task ([a-z_]+)", page.read_text())}
    assert quoted and quoted <= worlds


METRIC = re.compile(r"`((?:[a-z]+)/[a-z0-9_]+)`")


def test_every_metric_name_the_pages_quote_is_documented():
    from fourfold.reporting import METRIC_GROUPS, documented

    groups = tuple(g + "/" for g in METRIC_GROUPS if g)
    quoted = {(m.group(1), page.name) for page in PAGES for m in METRIC.finditer(page.read_text())
              if m.group(1).startswith(groups)}
    assert len(quoted) > 50
    assert sorted(q for q in quoted if not documented(q[0])) == []


# ---- arithmetic the pages do ------------------------------------------------------------------------

ARITHMETIC = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ([/x]) (\d+(?:\.\d+)?) = (\d+(?:\.(\d+))?)x?(?![\w.])")


def wrong_arithmetic(text: str) -> list[str]:
    """Each ``a / b = c`` and ``a x b = c`` of ``text`` whose c is not a / b (a x b) to c's digits."""
    bad = []
    for m in ARITHMETIC.finditer(" ".join(text.split())):
        a, op, b = float(m.group(1)), m.group(2), float(m.group(3))
        value = a / b if op == "/" else a * b
        if f"{value:.{len(m.group(5) or '')}f}" != m.group(4):
            bad.append(m.group(0))
    return bad


def test_the_arithmetic_check_finds_a_wrong_quotient():
    assert wrong_arithmetic("at most 1399 / 1066 = 1.31x faster, 3.1 x 2 = 6.2, 0.4 x 1576 = 630") == []
    assert wrong_arithmetic("1399 / 1066 = 1.32x and 3.1 x 2 = 6.3") == ["1399 / 1066 = 1.32x", "3.1 x 2 = 6.3"]


def test_every_quotient_and_product_the_pages_write_out_holds():
    found = sum(len(ARITHMETIC.findall(" ".join(p.read_text().split()))) for p in PAGES)
    assert found >= 3
    assert {p.name: wrong_arithmetic(p.read_text()) for p in PAGES if wrong_arithmetic(p.read_text())} == {}


# ---- best-of-n ------------------------------------------------------------------------------------

def test_the_best_of_n_kl_figures_of_bon_md():
    text = (DOCS / "bon.md").read_text()
    line = re.search(r"best of n=(\d+) \(KL = log n - \(n-1\)/n = ([\d.]+) nats\)", text)
    assert line and f"{bon_kl(int(line.group(1))):.4f}" == line.group(2)
    m = re.search(r"0 at n = 1, log 2 - 1/2 = ([\d.]+) at n = 2, ([\d.]+) at n = (\d+)\)", text)
    assert m and bon_kl(1) == 0.0
    assert f"{bon_kl(2):.3f}" == m.group(1) and f"{bon_kl(int(m.group(3))):.2f}" == m.group(2)


@pytest.mark.parametrize("n", [1, 2, 4, 32])
def test_bon_kl_is_the_closed_form(n):
    assert bon_kl(n) == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-12)
