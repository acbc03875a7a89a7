"""`fourfold <stage> --help` lists every config key of every stage (type, default, help from the field's
docstring), and `--print-config` prints YAML that `--config` reads back to an equal config."""
import dataclasses
import importlib
import re
import typing

import pytest

from fourfold.cli import main
from fourfold.config import load_config
from fourfold.config.keys import field_docs, first_sentence, keys_help
from fourfold.config.stages import STAGES


def _resolve(spec):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _worlds():
    """(stage, --task or None, config class) of every stage of the table and every --task world."""
    for name, stage in STAGES.items():
        yield name, None, _resolve(stage.config)
        for task, config, _ in stage.tasks:
            yield name, task, _resolve(config)


WORLDS = list(_worlds())
IDS = [f"{s}-{t}" if t else s for s, t, _ in WORLDS]


def _leaves(cls, prefix=""):
    """Every dotted key of a config class, walked here from the dataclasses (not by fourfold.config.keys)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        inner = [a for a in (tp, *typing.get_args(tp)) if dataclasses.is_dataclass(a)]
        if inner and typing.get_origin(tp) is not list:
            yield from _leaves(inner[0], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", cls


def _help(capsys, stage):
    with pytest.raises(SystemExit) as e:
        main([stage, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _entries(text):
    """``{dotted key: its entry, wrapped lines joined}`` of the key lines of a --help text."""
    entries, last = {}, None
    for line in text.splitlines():
        if re.match(r"  [a-z_][\w.]*  \S", line):
            last = line.split()[0]
            entries[last] = line.strip()
        elif line.startswith("    ") and last is not None:
            entries[last] += " " + line.strip()
        else:
            last = None
    return entries


@pytest.mark.parametrize("stage,task,cls", WORLDS, ids=IDS)
def test_help_lists_every_key_with_its_type_default_and_docstring(capsys, stage, task, cls):
    text = _help(capsys, stage)
    if task is not None:
        assert f"config keys with --task {task}" in text
        text = text.split(f"config keys with --task {task}", 1)[1]
    entries = _entries(text.split("config keys with --task", 1)[0])
    defaults = cls()
    for key, owner in _leaves(cls):
        assert key in entries, f"{stage}: --help does not list {key}"
        doc = first_sentence(field_docs(owner).get(key.rpartition(".")[2], ""))
        assert doc, f"{stage}: {key} has no docstring in its config class (--help shows it)"
        value = defaults
        for part in key.split("."):
            value = getattr(value, part) if value is not None else None
        entry = entries[key]
        assert entry.startswith(f"{key}  ") and " default: " in entry and entry.endswith(doc.split()[-1])
        if isinstance(value, (bool, int, float)) and value is not None:
            shown = {True: "true", False: "false"}.get(value, str(value)) if isinstance(value, bool) else str(value)
            assert re.search(rf" default: {re.escape(shown)} ", entry), (key, entry)


def test_help_entries_by_hand(capsys):
    text = _help(capsys, "ppo")
    entries = _entries(text)
    assert entries["ppo.kl_coef"].startswith("ppo.kl_coef  float  default: 0.05  ")
    # a long head: the help on the next line (joined here with one space)
    assert "\n  model.dtype  one of 'float32', 'bfloat16', 'float16'  default: float32\n      Weights dtype.\n" in text
    assert entries["model.lora.r"] == "model.lora.r  int  default: 8  Rank of each update (A: r x in, B: out x r)."
    assert "\nmodel.lora: (section or null, default null)  LoRA mode:" in text
    # the demo's ppo section has its own defaults, not PPO's
    demo = _entries(_help(capsys, "demo"))
    from fourfold.config import DemoConfig, PPOConfig

    assert DemoConfig().ppo.iterations != PPOConfig().ppo.iterations
    assert f"default: {DemoConfig().ppo.iterations}  " in demo["ppo.iterations"]


def test_first_sentence_keeps_abbreviations():
    assert first_sentence("A list, e.g. [a, b]. Then more.") == "A list, e.g. [a, b]."
    assert first_sentence("PPO (Ziegler et al. 2019) settings.\n\nMore.") == "PPO (Ziegler et al. 2019) settings."
    assert first_sentence("Summed (Dr. GRPO, Liu et al. 2025). More.") == "Summed (Dr. GRPO, Liu et al. 2025)."
    assert first_sentence("One line\nwrapped. Two.") == "One line wrapped."


def test_keys_help_wraps_at_the_width():
    from fourfold.config import PPOConfig

    lines = keys_help(PPOConfig, width=80).splitlines()[1:]  # under the title
    assert len(lines) > 150 and max(len(line) for line in lines) <= 80
    assert "  ppo.loss_agg  one of 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum'\n      default: token-mean\n" \
           "      How the per-token" in "\n".join(lines)  # a long head: "default: X" kept whole, the help below


def _round_trip_args(stage, task, tiny):
    sft, rm, prompts = str(tiny / "sft"), str(tiny / "rm"), str(tiny / "prompts.jsonl")
    rows = str(tiny / "prompts.jsonl")
    per_stage = {
        "sft": [f"model.path={sft}", f"data.train={rows}", "train.lr=2e-4", "train.max_steps=7"],
        "reward": [f"model.path={sft}", f"data.train={rows}", "train.lr=2e-4"],
        "dpo": [f"model.path={sft}", f"data.train={rows}", "dpo.beta=0.2"],
        "ppo": [f"model.policy={sft}", f"model.reward={rm}", f"data.prompts={prompts}", "ppo.kl_coef=0.02",
                "model.lora.r=4", "run.report_to=[tensorboard]"],
        "reinforce": [f"model.policy={sft}", f"model.reward={rm}", "data.task=review", "reinforce.lr=3e-5"],
        "gym": ["run.threads=2", "run.seed=5"],  # --seed comes after the overrides, and wins
        "demo": ["ppo.kl_coef=0.1", "sft.steps=9"] if task is None else ["quick=true"],
        "experiments": ["quick=true"],
        "generate": [f"model.path={sft}", f"data.prompts={prompts}", "generation.greedy=true"],
        "score": [f"model.reward={rm}", f"data.rows={rows}", "data.batch_size=3"],
        "bon": [f"model.path={sft}", f"scorer.reward={rm}", f"data.prompts={prompts}", "bon.n=3"],
    }[stage]
    return [stage, *(["--task", task] if task else []), "--print-config", "--seed", "11", *per_stage]


@pytest.mark.parametrize("stage,task,cls", WORLDS, ids=IDS)
def test_print_config_round_trips(capsys, tmp_path, tiny_lm, stage, task, cls):
    args = _round_trip_args(stage, task, tiny_lm)
    assert main([*args, "--output-dir", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    path = tmp_path / "printed.yaml"
    path.write_text(text)
    printed = load_config(cls, path)
    direct = load_config(cls, None, [*(a for a in args if "=" in a), "run.seed=11"], settings={"run.output_dir": str(tmp_path / "out")})
    assert printed == direct and printed.run.seed == 11 and printed.run.output_dir == str(tmp_path / "out")
    assert printed != cls() and (stage != "gym" or printed.run.threads == 2)
    # and printing the file again gives the same text
    again = [stage, *(["--task", task] if task else []), "--print-config", "--config", str(path)]
    assert main(again) == 0
    assert capsys.readouterr().out == text


def test_print_config_refuses_a_bad_key_in_one_line(capsys):
    assert main(["gym", "--print-config", "ppo.kl_coeff=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key" in err[0]
