"""The CLI's boundary under bad input (issue 13's fuzz suite): every case runs ``fourfold.cli.main``
in-process and must end with exit code 2 and exactly one line on stderr naming the key, file or
path (never a traceback; ppo and reinforce print their memory estimate's line before it), or, where
the input is legal, run with an explicit warning.

* Settings: a bad value for every float, int, choice, bool, text, list and mapping key of every
  stage, generated from the config dataclasses, so a new key is covered the day it is added.
  These fail while the config is validated, before any model loads (milliseconds each).
* YAML files: duplicate sections and keys, syntax errors, wrong shapes, not UTF-8, missing.
* Model paths: a prompt + response longer than the model's config.json allows, missing paths,
  a directory that does not exist (config.json read only, no weights).
* Data rows: malformed lines, wrong fields, too long examples, mixed preference forms, batch sizes
  larger than the data, fewer prompts than one batch: these load a tiny model (a few cases).
"""
import dataclasses
import json
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fourfold.cli import STAGES, _resolve, main

REQUIRED = {  # the least each stage needs so that only the fuzzed key can be wrong
    "sft": ["model.path=m", "data.train=t.jsonl"],
    "reward": ["model.path=m", "data.train=t.jsonl"],
    "ppo": ["model.policy=m", "model.reward=rm", "data.prompts=p.jsonl"],
    "reinforce": ["model.policy=m", "model.reward=rm", "data.prompts=p.jsonl"],
    "gym": [],
    "demo": [],
    "experiments": [],
    "dpo": ["model.path=m", "data.train=t.jsonl"],
    "generate": ["model.path=m", "data.prompts=p.jsonl"],
    "score": ["model.reward=rm", "data.rows=r.jsonl"],
    "bon": ["model.path=m", "scorer.reward=rm", "data.prompts=p.jsonl"],
}


def _leaves(cls, instance, prefix=""):
    """(dotted key, annotated type) of every setting of a config class, nested sections included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(type(value), value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hints[f.name]


def _bad_values(tp) -> list[str]:
    """Override values that are wrong for a setting of type ``tp`` (as typed on a command line)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if typing.get_origin(tp) is typing.Union and len(args) == 1 else tp
    if typing.get_origin(tp) is typing.Union and str in args:  # a string or a function (model.reward_fn)
        base = str
    origin = typing.get_origin(base)
    if base is float:
        return ["nan", "inf", "-inf", "abc"]
    if base is int:
        return ["-1", "1.5", "abc"]
    if base is bool:
        return ["maybe"]
    if base is str:
        return ["[1, 2]"]
    if base is dict or dataclasses.is_dataclass(base):  # a mapping or an optional section (model.lora)
        return ["5"]
    if origin is typing.Literal:
        return ["not-a-choice", "[1]"]
    if origin is list:
        inner = typing.get_args(base)[0]
        if typing.get_origin(inner) is typing.Literal:
            return ["[not-a-choice]", "7"]
        if dataclasses.is_dataclass(inner):  # a list of sections (model.reward_fns)
            return ["[5]", "[{nokey: 1}]", "7"]
        return {int: ["[-1]", "[abc]"], float: ["[nan]", "[inf]"], str: ["[not-a-name]"]}[inner] + ["7"]
    raise AssertionError(f"no bad values for {tp}")


SETTING_CASES = [
    pytest.param(stage, key, value, id=f"{stage}:{key}={value}")
    for stage, config_spec in ((name, s.config) for name, s in STAGES.items())
    for key, tp in _leaves(_resolve(config_spec), _resolve(config_spec)())
    for value in _bad_values(tp)
]


def _one_line_error(capsys, argv, *needles) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    if lines and lines[0].startswith(f"fourfold {argv[0]}: memory estimate"):
        lines = lines[1:]  # ppo and reinforce print the memory estimate's one line before they start
    assert code == 2, f"exit {code} for {argv}; stderr: {err[-2000:]}"
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_training(monkeypatch):
    """The stage functions replaced by one that fails the test: a bad setting the config accepted
    must not start a run (it would fail slowly, or not at all)."""
    import fourfold.cli as cli

    real = cli._resolve

    def resolve(spec):
        if spec in {s.run for s in STAGES.values()}:
            return lambda cfg, **kw: pytest.fail(f"the config accepted it and {spec} started")
        return real(spec)

    monkeypatch.setattr(cli, "_resolve", resolve)


@pytest.mark.parametrize("stage,key,value", SETTING_CASES)
def test_every_bad_setting_is_a_one_line_error_naming_the_key(capsys, no_training, stage, key, value):
    _one_line_error(capsys, [stage, *REQUIRED[stage], f"{key}={value}"], key)


@pytest.mark.parametrize("stage,override,key", [
    ("ppo", "run.seed=18446744073709551616", "run.seed"),  # beyond 64 bits
    ("sft", "run.seed=-3", "run.seed"),
    ("experiments", "seeds=[0, 18446744073709551616]", "seeds"),
    ("sft", "model.hidden_size=0", "model.hidden_size"),
    ("reward", "model.num_layers=0", "model.num_layers"),
    ("demo", "model.num_heads=0", "model.num_heads"),
    ("sft", "train.eval_every=-5", "train.eval_every"),
    ("ppo", "ppo.weight_decay=-0.1", "ppo.weight_decay"),
    ("reward", "train.weight_decay=-1e-3", "train.weight_decay"),
    ("ppo", "generation.missing_eos_score=nan", "generation.missing_eos_score"),
    ("reward", "reward.margin=inf", "reward.margin"),
    ("reinforce", "generation.temperature=inf", "generation.temperature"),
    ("ppo", "ppo.kl_coef=inf", "ppo.kl_coef"),
    ("ppo", "ppo.lr=inf", "ppo.lr"),
    ("ppo", "model.reward_fn=f.py:score", "model.reward"),  # a reward model and a reward_fn at once
    ("ppo", "ppo={x: 1, x: 2}", "duplicate key 'x'"),
])
def test_named_settings_from_the_issue(capsys, no_training, stage, override, key):
    _one_line_error(capsys, [stage, *REQUIRED[stage], override], key)


def test_output_dir_is_taken_as_typed(monkeypatch, tmp_path):
    """--output-dir is a path, never read as YAML: " #2" is no comment, trailing spaces stay."""
    import fourfold.cli as cli

    seen, real = {}, cli._resolve
    monkeypatch.setattr(cli, "_resolve", lambda spec: (lambda cfg, **kw: seen.setdefault("cfg", cfg))
                        if spec == STAGES["sft"].run else real(spec))
    for out in (str(tmp_path / "runs" / "x #2"), "runs/y: z ", "null", "[a, b]"):
        seen.clear()
        assert main(["sft", *REQUIRED["sft"], "--output-dir", out]) == 0
        assert seen["cfg"].run.output_dir == out


@pytest.mark.parametrize("override,quoted", [
    ("data.train=t.jsonl #2", "data.train='t.jsonl #2'"),
    ("run.output_dir=runs/x #2", "run.output_dir='runs/x #2'"),
    ("data.train=t.jsonl ", "data.train='t.jsonl '"),
])
def test_an_override_yaml_would_cut_is_a_one_line_error(capsys, no_training, override, quoted):
    key = override.split("=")[0]
    _one_line_error(capsys, ["sft", *REQUIRED["sft"], override], f"override {override!r}", f"YAML reads {key} as",
                    f"quote it: {quoted}")


# ---- YAML files -------------------------------------------------------------------------------


@pytest.mark.parametrize("text,needles", [
    ("ppo:\n  lr: 1.0e-5\ngeneration:\n  max_new_tokens: 8\nppo:\n  kl_coef: 0.1\n",
     ["line 5", "duplicate key 'ppo'", "first at line 1"]),
    ("ppo:\n  lr: 1.0e-5\n  lr: 2.0e-5\n", ["line 3", "duplicate key 'lr'"]),
    ("ppo:\n  kl_coef: [1,\n", ["line", "invalid YAML"]),
    ("ppo:\n\tlr: 1\n", ["invalid YAML"]),
    ("- 1\n- 2\n", ["expected a mapping at the top level"]),
    ("ppo: 3\n", ["ppo: expected a mapping"]),
    ("ppo:\n  lamda: 0.9\n", ["ppo.lamda: unknown key", "did you mean 'ppo.lam'"]),
    ("lr: 0.1\n", ["lr: unknown key"]),
    ("ppo:\n  lr: .inf\n", ["ppo.lr: must be a finite number"]),
    ("generation:\n  temperature: .nan\n", ["generation.temperature: must be a finite number"]),
])
def test_bad_yaml_files_name_the_file(capsys, tmp_path, text, needles):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    _one_line_error(capsys, ["ppo", "--config", str(path), *REQUIRED["ppo"]], str(path), *needles)


def test_yaml_that_is_not_utf8_or_missing(capsys, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("ppo:\n  lr: 1.0e-5  # caf\xe9\n".encode("latin-1"))
    _one_line_error(capsys, ["ppo", "--config", str(path), *REQUIRED["ppo"]], str(path), "not UTF-8")
    _one_line_error(capsys, ["sft", "--config", str(tmp_path / "nope.yaml")], "nope.yaml", "not found")


# ---- model paths (config.json only: these fail before any weight is read) -----------------------


def _model_dir(root, limit_key="max_position_embeddings", limit=16):
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", limit_key: limit}))
    return str(root)


@pytest.mark.parametrize("stage", ["ppo", "reinforce"])
def test_prompt_plus_response_longer_than_the_policy_allows(capsys, tmp_path, stage):
    policy = _model_dir(tmp_path / "policy")
    _one_line_error(capsys, [stage, f"model.policy={policy}", "model.reward_fn=f.py:score", "data.prompts=p.jsonl",
                             "data.max_prompt_len=12", "generation.max_new_tokens=8"],
                    "data.max_prompt_len + generation.max_new_tokens = 12 + 8 = 20", "model.policy",
                    "max_position_embeddings=16", "config.json")


def test_reward_model_limit_and_gpt2_style_key(capsys, tmp_path):
    policy = _model_dir(tmp_path / "policy", limit=1024)
    rm = _model_dir(tmp_path / "rm", limit_key="n_positions", limit=32)
    _one_line_error(capsys, ["ppo", f"model.policy={policy}", f"model.reward={rm}", "data.prompts=p.jsonl"],
                    "model.reward", "n_positions=32")


@pytest.mark.parametrize("stage", ["sft", "reward"])
def test_max_len_longer_than_the_model_allows(capsys, tmp_path, stage):
    model = _model_dir(tmp_path / "m", limit=64)
    _one_line_error(capsys, [stage, f"model.path={model}", "data.train=t.jsonl", "train.max_len=128"],
                    "train.max_len = 128", "model.path", "max_position_embeddings=64")


@pytest.mark.parametrize("stage,argv,needle", [
    ("sft", ["data.train=t.jsonl"], "model.path: missing"),
    ("reward", ["model.from_scratch=true", "data.train=t.jsonl"], "model.tokenizer"),
    ("ppo", ["model.reward=rm", "data.prompts=p"], "model.policy: missing"),
    ("reinforce", ["model.policy=m", "data.prompts=p"], "model.reward"),
    ("ppo", ["model.policy=m", "model.reward_fn=f.py:fn", "data.prompts=p", "model.critic_init=reward"], "model.critic_init"),
])
def test_missing_model_paths(capsys, stage, argv, needle):
    _one_line_error(capsys, [stage, *argv], needle)


def test_model_directory_that_does_not_exist(capsys, tmp_path):
    missing = tmp_path / "no" / "such" / "model"
    _one_line_error(capsys, ["sft", f"model.path={missing}", f"data.train={tmp_path / 't.jsonl'}",
                             f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.tensorboard=false"],
                    str(missing))


# ---- data rows (a tiny model from scratch: the data is read after it is built) ------------------


@pytest.fixture(scope="module")
def word_tok(tmp_path_factory):
    from fourfold.tasks.tokenizer import build_word_tokenizer

    d = tmp_path_factory.mktemp("fuzz_tok")
    build_word_tokenizer([f"w{i}" for i in range(12)], d)
    return str(d)


def _supervised(stage, word_tok, tmp_path, rows, *extra):
    path = tmp_path / "data.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return [stage, "model.from_scratch=true", f"model.tokenizer={word_tok}", "model.hidden_size=8",
            "model.num_layers=1", "model.num_heads=2", "model.max_positions=16", f"data.train={path}",
            "train.max_len=16", "train.batch_size=1", "train.max_steps=1", f"run.output_dir={tmp_path / 'run'}",
            "run.progress=false", "run.tensorboard=false", "run.device=cpu", *extra], str(path)


SFT_OK = {"prompt": "w1 w2", "completion": "w3"}
PREF_OK = {"prompt": "w1", "chosen": "w2", "rejected": "w3"}


@pytest.mark.parametrize("stage,rows,extra,needles", [
    ("sft", [SFT_OK, "{not json"], [], [":2:"]),
    ("sft", [SFT_OK, {"promt": "w1", "completion": "w2"}], [], [":2:", "did you mean 'prompt'"]),
    ("sft", [{"prompt": "w1", "completion": 3}], [], [":1:", "'completion'"]),
    ("sft", [SFT_OK, {"prompt": "w1", "completion": " ".join(["w2"] * 20)}], [], [":2:", "max_len=16"]),
    ("sft", [SFT_OK, SFT_OK], ["train.batch_size=3"], ["train.batch_size: 3 is more than the 2 training examples"]),
    ("reward", [PREF_OK, {"prompt": "w1", "chosen": [{"role": "assistant", "content": "w2"}], "rejected": "w3"}],
     [], [":2:", "'chosen' is a list of messages but 'rejected' is a string"]),
    ("reward", [{"prompt": "w1", "chosen": "w2", "rejected": "w2"}] * 2, [], ["every preference pair is a tie"]),
    ("reward", [PREF_OK, PREF_OK], ["train.batch_size=4", "data.eval_fraction=0"],
     ["train.batch_size: 4 is more than the 2 training pairs"]),
])
def test_bad_data_rows_name_file_and_line(capsys, tmp_path, word_tok, stage, rows, extra, needles):
    argv, path = _supervised(stage, word_tok, tmp_path, rows, *extra)
    line = _one_line_error(capsys, argv, *needles)
    assert path in line or "train.batch_size" in line


def test_data_mostly_unknown_to_the_tokenizer_runs_with_one_warning(capsys, tmp_path, word_tok):
    """Legal input: most tokens UNK (the tokenizer does not know this text) trains, with one
    warning line on the terminal and in events.jsonl."""
    argv, path = _supervised("sft", word_tok, tmp_path, [{"prompt": "x1 x2 w1", "completion": "x3"}] * 2)
    assert main(argv) == 0
    shown = capsys.readouterr().out  # warnings go to stdout with the results (fourfold.sinks)
    line = (f"{path}: 6 of the 8 tokens of the first 2 rows are the tokenizer's unknown token '<unk>': it does not "
            "know most of this text (is it the model's own tokenizer?)")
    assert "Traceback" not in shown and f"fourfold sft: warning: {line}" in shown, shown  # run.progress=false
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["message"] for e in events if e["kind"] == "warning"] == [line]


@pytest.mark.parametrize("stage", ["reward", "dpo"])
def test_tied_pairs_run_with_a_warning_that_counts_them(capsys, tmp_path, word_tok, stage):
    """Legal input: a pair whose chosen and rejected are the same carries no preference; it is left
    out and counted on the terminal and in events.jsonl, without data.on_error=skip."""
    tie = {"prompt": "w1", "chosen": "w2", "rejected": "w2"}
    argv, path = _supervised(stage, word_tok, tmp_path, [PREF_OK, tie, PREF_OK, tie], "data.eval_fraction=0")
    if stage == "dpo":  # DPO trains a causal LM: a path, not from_scratch
        argv = [a for a in argv if not a.startswith(("model.from_scratch", "model.tokenizer", "model.hidden_size",
                                                     "model.num_layers", "model.num_heads", "model.max_positions"))]
        argv.insert(1, f"model.path={_tiny_causal_lm(tmp_path, word_tok)}")
    assert main(argv) == 0
    shown = capsys.readouterr().out  # warnings go to stdout with the results (fourfold.sinks)
    line = (f"2 tied preference pairs left out ('chosen' and 'rejected' the same: no preference to learn); first: "
            f"{path}:2: 'chosen' and 'rejected' are identical")
    assert "Traceback" not in shown and f"fourfold {stage}: warning: {line}" in shown, shown
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["message"] for e in events if e["kind"] == "warning"] == [line]


def _tiny_causal_lm(tmp_path, word_tok) -> str:
    from fourfold.models.factory import llama_config, random_causal_lm
    from fourfold.models.loading import load_tokenizer

    tok = load_tokenizer(word_tok)
    cfg = llama_config(len(tok), hidden=8, layers=1, heads=2, max_positions=16, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    random_causal_lm(cfg, seed=0).save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    return str(tmp_path / "lm")


def _rl(stage, tiny_lm, tmp_path, prompts, *extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join((p if isinstance(p, str) else json.dumps(p)) + "\n" for p in prompts))
    algo = "ppo" if stage == "ppo" else "reinforce"
    return [stage, f"model.policy={tiny_lm / 'sft'}", f"model.reward_fn={tiny_lm / 'reward_fn.py'}:reward",
            f"data.prompts={path}", f"{algo}.iterations=1", f"{algo}.rollout_batch_size=4",
            *(["ppo.minibatch_size=2", "ppo.ppo_epochs=1"] if stage == "ppo" else []), "generation.max_new_tokens=3",
            f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.tensorboard=false", "run.device=cpu",
            *extra]


@pytest.mark.parametrize("stage", ["ppo", "reinforce"])
def test_fewer_prompts_than_one_batch(capsys, tmp_path, tiny_lm, stage):
    argv = _rl(stage, tiny_lm, tmp_path, [{"prompt": "w1 w2"}] * 3)
    _one_line_error(capsys, argv, f"{stage}.rollout_batch_size: 4 is more than the 3 prompts")


def test_skipped_prompt_rows_run_with_a_warning_that_counts_them(capsys, tmp_path, tiny_lm):
    """Legal input (data.on_error=skip): the run goes on, and says how many rows it left out (on
    the console, stdout, as `fourfold ppo: warning: ...` even with run.progress=false)."""
    rows = [{"prompt": "w1 w2"}] * 4 + [{"promt": "w3"}, "{oops", {"prompt": " ".join(["w4"] * 80)}]
    argv = _rl("ppo", tiny_lm, tmp_path, rows, "data.on_error=skip")
    assert main(argv) == 0
    shown = capsys.readouterr().out  # warnings go to stdout with the results (fourfold.sinks)
    assert "Traceback" not in shown and "fourfold ppo: warning: 3 bad rows skipped (data.on_error=skip); first: " in shown, shown
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    warnings = [e["message"] for e in events if e["kind"] == "warning"]
    assert len(warnings) == 1 and "prompts.jsonl:5:" in warnings[0]
    # the same rows without skip: the first bad one is an error naming its line
    _one_line_error(capsys, _rl("ppo", tiny_lm, tmp_path / "strict", rows), "prompts.jsonl:6: invalid JSON")


# ---- random values at random keys of every stage (hypothesis) ----------------------------------

_ALL_KEYS = [(stage, key) for stage, s in STAGES.items() for key, _ in _leaves(_resolve(s.config), _resolve(s.config)())]
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=6), st.lists(st.one_of(st.integers(-3, 3), st.floats(), st.text(max_size=3)), max_size=3),
                    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_ALL_KEYS), _VALUES)
def test_random_values_give_a_valid_config_or_one_config_error(entry, value):
    """Whatever value lands on whatever key: a config, or one ConfigError line naming the key
    (never another exception; a rejection always says which setting)."""
    from fourfold.config import ConfigError, load_config

    stage, key = entry
    tree: dict = {}
    node = tree
    for part in key.split(".")[:-1]:
        node = node.setdefault(part, {})
    node[key.split(".")[-1]] = value
    try:
        load_config(_resolve(STAGES[stage].config), None, REQUIRED[stage], base=tree)
    except ConfigError as e:
        assert "\n" not in str(e)
        assert key.rsplit(".", 1)[0] in str(e), str(e)  # the key, or its section (a cross-check in it)
