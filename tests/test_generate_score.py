"""`fourfold generate` and `fourfold score` on tiny random models: PPO's sampling and scoring
conventions, the README's plain-transformers snippet, datasets directories, one-line errors."""
import json
import re
from pathlib import Path

import pytest
import torch

from fourfold.cli import main
from fourfold.data import (
    chat_template_renderer,
    collate_responses,
    encode_responses,
    left_pad,
    load_prompts,
    load_responses,
    tokenize_prompts,
)
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_sequence_scorer, load_tokenizer
from fourfold.models.roles import FrozenReference, ModelReward, ScalarModel
from fourfold.rollout.eager import sample
from fourfold.rollout.sampling import decode_responses
from fourfold.rollout.score import score_rollout

ROOT = Path(__file__).resolve().parents[1]


def _cli(stage, overrides, out, capsys, stream: str = "err") -> tuple[int, str]:
    """Run ``fourfold <stage>`` (flags after the overrides, as argparse wants); (exit code, stderr,
    or with ``stream="out"`` stdout: the results and warnings)."""
    keys = [o for o in overrides if not o.startswith("--")]
    flags = [o for o in overrides if o.startswith("--")]
    rc = main([stage, *keys, "run.threads=1", "--output-dir", str(out), *flags])
    return rc, getattr(capsys.readouterr(), stream)


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _write(path, rows) -> Path:
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Path(path)


def _generate(tiny_lm, out, capsys, *overrides) -> list[dict]:
    rc, err = _cli("generate", [f"model.path={tiny_lm / 'sft'}", f"data.prompts={tiny_lm / 'prompts.jsonl'}",
                                *overrides], out, capsys)
    assert rc == 0, err
    return _rows(out / "completions.jsonl")


def _score(out, capsys, rows_path, *overrides) -> list[dict]:
    rc, err = _cli("score", [f"data.rows={rows_path}", *overrides], out, capsys)
    assert rc == 0, err
    return _rows(out / "scores.jsonl")


@pytest.fixture(scope="module")
def policy(tiny_lm):
    """(tokenizer, policy) loaded as PPO loads them."""
    tok = load_tokenizer(str(tiny_lm / "sft"))
    model = load_causal_lm(str(tiny_lm / "sft"))
    ensure_pad_embedding(model, tok)
    return tok, model.eval()


@pytest.fixture(scope="module")
def shifted_rm(tiny_lm, tmp_path_factory):
    """tiny_lm's reward model with a normalisation folded in (scale 2, shift 0.5); Llama's head has
    no bias, so the shift is kept in config.json as fourfold_score_shift."""
    rm = ScalarModel(load_sequence_scorer(str(tiny_lm / "rm")))
    rm.set_affine(2.0, 0.5)
    out = tmp_path_factory.mktemp("shifted_rm")
    rm.save_pretrained(out)
    load_tokenizer(str(tiny_lm / "rm")).save_pretrained(out)
    return out


def _ppo_prompts(tiny_lm, tok):
    texts = [r.prompt for r in load_prompts(tiny_lm / "prompts.jsonl", chat_template=chat_template_renderer(tok))]
    return texts, tokenize_prompts(texts, tok, 64)


# ------------------------------------------------------------------------------------ generate


def test_generate_samples_as_ppo_does(tiny_lm, policy, tmp_path, capsys):
    """Same prompts, tokenisation, batches, sampler and seed as PPO's rollout: the same completions."""
    rows = _generate(tiny_lm, tmp_path / "g", capsys, "data.batch_size=8", "generation.max_new_tokens=6", "run.seed=3")
    tok, model = policy
    texts, ids = _ppo_prompts(tiny_lm, tok)
    generator = torch.Generator().manual_seed(3)
    expected = []
    for start in range(0, len(ids), 8):
        prompt_ids, prompt_mask = left_pad(ids[start : start + 8], tok.pad_token_id)
        samples = sample(model, prompt_ids, prompt_mask, max_new_tokens=6, temperature=1.0,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, generator=generator)
        for i, (text, done, n) in enumerate(zip(decode_responses(tok, samples), samples.finished.tolist(),
                                                samples.response_mask.sum(1).tolist())):
            expected.append({"prompt": texts[start + i], "response": text, "finished": done, "response_tokens": int(n)})
    assert rows == expected and len(rows) == 64


def test_generate_is_seeded_and_greedy_ignores_the_seed(tiny_lm, tmp_path, capsys):
    a = _generate(tiny_lm, tmp_path / "a", capsys, "run.seed=1", "generation.max_new_tokens=4")
    b = _generate(tiny_lm, tmp_path / "b", capsys, "run.seed=1", "generation.max_new_tokens=4")
    c = _generate(tiny_lm, tmp_path / "c", capsys, "run.seed=2", "generation.max_new_tokens=4")
    assert a == b and a != c
    g1 = _generate(tiny_lm, tmp_path / "g1", capsys, "run.seed=1", "generation.greedy=true", "generation.max_new_tokens=4")
    g2 = _generate(tiny_lm, tmp_path / "g2", capsys, "run.seed=2", "generation.greedy=true", "generation.max_new_tokens=4")
    assert g1 == g2 and g1 != a
    assert (tmp_path / "a" / "config.yaml").is_file()
    fixed = _generate(tiny_lm, tmp_path / "f", capsys, "generation.stop_at_eos=false", "generation.max_new_tokens=3")
    assert all(r["response_tokens"] == 3 and not r["finished"] for r in fixed)


def test_the_static_engine_generates_the_eager_completions(tiny_lm, tmp_path, capsys, monkeypatch):
    """generation.engine=static (its step compiled too, by dynamo's eager backend here) writes the
    eager engine's completions: sampled, one prompt per batch so that batches stop early at
    different steps and the one generator runs on across them, and greedy."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="eager", dynamic=False))
    torch._dynamo.reset()
    sampled = ["data.batch_size=1", "generation.max_new_tokens=40", "run.seed=4"]
    eager = _generate(tiny_lm, tmp_path / "e", capsys, *sampled)
    stopped = [r for r in eager if r["finished"]]
    assert 4 <= len(stopped) <= len(eager) - 4 and len({r["response_tokens"] for r in stopped}) >= 3
    for engine in (["generation.stop_check_every=8"], ["generation.compile=true", "generation.weights=copy"]):
        assert _generate(tiny_lm, tmp_path / "s", capsys, *sampled, "generation.engine=static", *engine) == eager
    greedy = ["data.batch_size=16", "generation.max_new_tokens=12", "generation.greedy=true"]
    assert _generate(tiny_lm, tmp_path / "gs", capsys, *greedy, "generation.engine=static") == \
        _generate(tiny_lm, tmp_path / "ge", capsys, *greedy)


def test_generate_takes_the_sampling_filters_and_both_engines_apply_them_alike(tiny_lm, tmp_path, capsys):
    """generation.top_k / top_p / min_p reach `fourfold generate` (its engine is make_engine's): other
    completions than unfiltered sampling from the same seed, the same ones from either engine."""
    base = ["data.batch_size=4", "generation.max_new_tokens=12", "run.seed=2"]
    plain = _generate(tiny_lm, tmp_path / "plain", capsys, *base)
    filters = ["generation.top_k=6", "generation.top_p=0.8", "generation.min_p=0.05"]
    eager = _generate(tiny_lm, tmp_path / "e", capsys, *base, *filters)
    assert eager != plain
    assert _generate(tiny_lm, tmp_path / "s", capsys, *base, *filters, "generation.engine=static") == eager


# --------------------------------------------------------------------------------------- score


def _round_trips(tok, samples, responses, i) -> bool:
    """The response text tokenises back to the sampled ids (a random model sometimes samples <bos>,
    <unk> or <pad>, which decoding drops, as PPO's decoding does)."""
    sampled = [t for t, v in zip(samples.responses[i].tolist(), samples.response_mask[i].tolist()) if v]
    again = tok(responses[i], add_special_tokens=False)["input_ids"]
    return sampled == again + ([tok.eos_token_id] if samples.finished[i] else [])


def test_score_reproduces_ppo_scores(tiny_lm, policy, shifted_rm, tmp_path, capsys):
    """PPO's score_rollout() on sampled sequences vs `fourfold score` on their decoded text: the same ids in
    the same layout, and the same scores (normalisation shift included)."""
    tok, model = policy
    texts, ids = _ppo_prompts(tiny_lm, tok)
    prompt_ids, prompt_mask = left_pad(ids, tok.pad_token_id)
    samples = sample(model, prompt_ids, prompt_mask, max_new_tokens=16, temperature=1.0,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                     generator=torch.Generator().manual_seed(1))
    rm = ScalarModel(load_sequence_scorer(str(shifted_rm)))
    ensure_pad_embedding(rm.hf, tok)
    ppo = score_rollout(samples, reference=FrozenReference(model), reward=ModelReward(rm)).scores
    responses = decode_responses(tok, samples)
    clean = [i for i in range(len(texts)) if _round_trips(tok, samples, responses, i)]
    finished = [bool(samples.finished[i]) for i in clean]
    assert len(clean) >= 16 and 2 <= sum(finished) <= len(clean) - 2, (len(clean), sum(finished))
    rows_path = _write(tmp_path / "rows.jsonl", [
        {"prompt": texts[i], "response": responses[i], "finished": f} for i, f in zip(clean, finished)])

    # the ids fourfold score builds are PPO's, token for token
    examples = encode_responses(load_responses(rows_path).records, tok, 128)
    P = prompt_ids.shape[1]
    for i, e in zip(clean, examples):
        seq, mask = samples.sequences[i], samples.attention_mask[i].bool()
        assert seq[:P][mask[:P]].tolist() == e.prompt_ids and seq[P:][mask[P:]].tolist() == e.response_ids
    batch_ids, batch_mask = collate_responses(examples, tok.pad_token_id)
    longest = max(len(e.prompt_ids) for e in examples)
    assert batch_mask[:, longest - 1].all() and not batch_mask[:, 0].all()  # prompts left-padded
    assert batch_ids.shape[1] == longest + max(len(e.response_ids) for e in examples)

    out = _score(tmp_path / "s", capsys, rows_path, f"model.reward={shifted_rm}", "data.batch_size=8")
    assert [r["response"] for r in out] == [responses[i] for i in clean]
    torch.testing.assert_close(torch.tensor([r["score"] for r in out]), ppo[clean], rtol=1e-5, atol=1e-5)
    unshifted = _score(tmp_path / "u", capsys, rows_path, f"model.reward={tiny_lm / 'rm'}", "data.batch_size=8")
    raw = torch.tensor([r["score"] for r in unshifted])
    torch.testing.assert_close(torch.tensor([r["score"] for r in out]), 2 * raw + 0.5, rtol=1e-4, atol=1e-4)


def _readme_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    [code] = [b for b in blocks if "AutoModelForSequenceClassification" in b]
    return code


def test_readme_snippet_scores_as_fourfold_score(shifted_rm, tmp_path, capsys):
    code = _readme_snippet()
    assert '"runs/reward/model"' in code
    namespace: dict = {}
    exec(code.replace('"runs/reward/model"', repr(str(shifted_rm))), namespace)
    assert namespace["shift"] == 0.5
    rows = [
        {"prompt": "w1 w2 w3", "response": "w4 w5", "finished": True},
        {"prompt": "w9", "response": "w10 w11 w12 w13", "finished": False},
        {"prompt": "w7 w7", "response": "", "finished": True},
        {"prompt": "w3", "response": "w5 w6 w7"},
    ]
    out = _score(tmp_path / "s", capsys, _write(tmp_path / "rows.jsonl", rows), f"model.reward={shifted_rm}")
    assert [{k: v for k, v in r.items() if k != "score"} for r in out] == rows
    for row, scored in zip(rows, out):
        plain = namespace["score"](row["prompt"], row["response"], row.get("finished", True))
        assert abs(plain - scored["score"]) < 1e-5, (row, plain, scored["score"])


def test_score_with_a_reward_function_and_chat_rows(tiny_lm, tmp_path, capsys):
    rows = [
        {"prompt": "w1", "response": "w7 w7 w2"},
        {"messages": [{"role": "user", "content": "w3"}, {"role": "assistant", "content": "w7"}]},
    ]
    rc = main(["score", f"data.rows={_write(tmp_path / 'rows.jsonl', rows)}", f"model.tokenizer={tiny_lm / 'sft'}",
               f"model.reward_fn={tiny_lm / 'reward_fn.py'}:reward", "--output-dir", str(tmp_path / "s")])
    summary = capsys.readouterr().out
    assert rc == 0 and summary == f"fourfold score: 2 rows scored (mean 0.375) -> {tmp_path / 's' / 'scores.jsonl'}\n"
    out = _rows(tmp_path / "s" / "scores.jsonl")
    assert [r["score"] for r in out] == [0.5, 0.25]
    assert out[1]["messages"] == rows[1]["messages"]


def test_generate_then_score_from_datasets_directories(tiny_lm, tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    prompts = [{"prompt": "w1 w2"}, {"prompt": "w3"}, {"prompt": "w4 w5 w6"}]
    prompts_dir = tmp_path / "prompts"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(prompts)}).save_to_disk(str(prompts_dir))
    rc, err = _cli("generate", [f"model.path={tiny_lm / 'sft'}", f"data.prompts={prompts_dir}:test",
                                "generation.max_new_tokens=4"], tmp_path / "g", capsys)
    assert rc == 0, err
    completions = _rows(tmp_path / "g" / "completions.jsonl")
    assert [r["prompt"] for r in completions] == ["w1 w2", "w3", "w4 w5 w6"]
    rows_dir = tmp_path / "rows"
    datasets.Dataset.from_list(completions).save_to_disk(str(rows_dir))
    scored = _score(tmp_path / "s", capsys, rows_dir, f"model.reward={tiny_lm / 'rm'}")
    direct = _score(tmp_path / "d", capsys, tmp_path / "g" / "completions.jsonl", f"model.reward={tiny_lm / 'rm'}")
    assert scored == direct and len(scored) == 3
    # a bad row is named by directory, split and row
    bad_dir = tmp_path / "bad"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(prompts + [{"prompt": " "}])}).save_to_disk(str(bad_dir))
    rc, err = _cli("generate", [f"model.path={tiny_lm / 'sft'}", f"data.prompts={bad_dir}"], tmp_path / "b", capsys)
    assert rc == 2 and err.strip() == f"fourfold generate: error: {bad_dir}[train]:row 3: field 'prompt' is empty"


def test_skipped_rows_are_counted(tiny_lm, tmp_path, capsys):
    rows_path = _write(tmp_path / "rows.jsonl", [{"prompt": "w1", "response": "w2"}, {"prompt": "w1"},
                                                 {"prompt": "w1 " * 200, "response": "w2"}])
    rc, out = _cli("score", [f"data.rows={rows_path}", f"model.reward={tiny_lm / 'rm'}", "data.on_error=skip"],
                   tmp_path / "s", capsys, stream="out")
    assert rc == 0 and len(_rows(tmp_path / "s" / "scores.jsonl")) == 1
    assert "fourfold score: warning: 2 bad rows skipped" in out and f"first: {rows_path}:2: missing field 'response'" in out


@pytest.mark.parametrize("stage,overrides,needle", [
    ("score", ["model.reward={sft}", "data.rows={rows}"], "model.reward: {sft} has no trained score head"),
    ("generate", ["model.path={rm}", "data.prompts={prompts}"],
     "model.path: {rm} is not a causal language model (architectures ['LlamaForSequenceClassification']"),
    ("generate", ["model.path={sft}", "model.tokenizer={small_tok}", "data.prompts={prompts}"],
     "model.path: {sft}: its tokenizer differs from model.tokenizer ({small_tok})"),
    ("generate", ["model.path={sft}", "data.prompts={prompts}", "generation.max_new_tokens=200"],
     "{prompts}:1: prompt has 6 tokens; with generation.max_new_tokens=200 that is more than the model's "
     "max_position_embeddings=128"),
    ("score", ["model.reward={rm}", "data.rows={rows}", "data.max_len=1000"],
     "data.max_len: 1000 is more than the reward model's max_position_embeddings=128"),
    ("score", ["model.reward={rm}", "data.rows={rows}", "data.max_len=3"], "{rows}:1: prompt + response have 4 tokens, more than max_len=3"),
    ("score", ["model.reward_fn={root}/nothing.py:f", "data.rows={rows}"], "model.reward_fn: {root}/nothing.py: no such file"),
    ("generate", ["model.path={sft}", "data.prompts={prompts}", "--resume"], "run.resume: generate has nothing to resume"),
    ("generate", ["model.path={sft}", "data.prompts={prompts}", "generation.greedy=true", "generation.top_k=4"],
     "generation.greedy: takes the most likely token, which every filter keeps: generation.top_k 4 would change nothing"),
    ("generate", ["model.path={sft}", "data.prompts={prompts}", "generation.top_p=0"],
     "generation.top_p: must be in (0, 1] (1 = off), got 0"),
    ("score", ["model.reward={rm}", "model.reward_fn=x:y", "data.rows={rows}"], "model.reward_fn are both set; keep one"),
])
def test_errors_are_one_line(tiny_lm, tmp_path, capsys, stage, overrides, needle):
    rows = _write(tmp_path / "rows.jsonl", [{"prompt": "w1", "response": "w2"}])
    from fourfold.tasks.tokenizer import build_word_tokenizer

    build_word_tokenizer([f"w{i}" for i in range(30)]).save_pretrained(tmp_path / "small_tok")  # another vocabulary
    names = dict(sft=tiny_lm / "sft", rm=tiny_lm / "rm", prompts=tiny_lm / "prompts.jsonl", rows=rows, root=tmp_path,
                 small_tok=tmp_path / "small_tok")
    rc, err = _cli(stage, [o.format(**names) for o in overrides], tmp_path / "out", capsys)
    assert rc == 2 and err.count("\n") == 1 and needle.format(**names) in err, err


def test_an_output_directory_that_is_a_file_is_one_line(tiny_lm, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    rc, err = _cli("score", [f"model.reward_fn={tiny_lm / 'reward_fn.py'}:reward",
                             f"data.rows={_write(tmp_path / 'rows.jsonl', [{'prompt': 'w1', 'response': 'w2'}])}"],
                   tmp_path / "file", capsys)
    assert rc == 2 and err.count("\n") == 1 and f"run.output_dir: {tmp_path / 'file'}: cannot write there" in err


@pytest.mark.parametrize("stage,overrides", [("generate", ["model.path={sft}", "data.prompts={prompts}"]),
                                              ("score", ["model.reward={rm}", "data.rows={prompts}"])])
def test_torchrun_is_refused_as_for_every_one_process_stage(tiny_lm, tmp_path, capsys, monkeypatch, stage, overrides):
    """The run scaffold's start (fourfold.run.scaffold.one_process_start): under torchrun's
    environment one line, before any model loads or anything is written."""
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(key, value)
    names = dict(sft=tiny_lm / "sft", rm=tiny_lm / "rm", prompts=tiny_lm / "prompts.jsonl")
    rc, err = _cli(stage, [o.format(**names) for o in overrides], tmp_path / "out", capsys)
    assert rc == 2 and err.count("\n") == 1 and "torchrun: this stage runs in one process only" in err, err
    assert not (tmp_path / "out").exists()


def test_reward_stage_reads_implicit_prompts_from_a_datasets_directory(tiny_lm, tmp_path, capsys):
    """`fourfold reward` on a DatasetDict of implicit-prompt pairs (one bad row skipped and counted),
    then `fourfold score` with the model it wrote."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    pairs = [{"chosen": f"w{i} w{i + 1} w7", "rejected": f"w{i} w{i + 1} w8"} for i in range(10)]
    pairs.append({"chosen": "w1 w7", "rejected": "w2 w8"})  # shares nothing: skipped, named by row
    data = tmp_path / "prefs"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(pairs)}).save_to_disk(str(data))
    rc = main(["reward", "model.from_scratch=true", f"model.tokenizer={tiny_lm / 'sft'}", "model.hidden_size=16",
               "model.num_layers=1", "model.num_heads=2", f"data.train={data}", "data.on_error=skip",
               "data.eval_fraction=0", "train.max_steps=2", "train.batch_size=4", "run.progress=false",
               "run.tensorboard=false", "run.threads=1", "--output-dir", str(tmp_path / "rm")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    events = [json.loads(line) for line in (tmp_path / "rm" / "events.jsonl").read_text().splitlines()]
    [warning] = [e for e in events if e["kind"] == "warning"]
    assert f"1 bad rows skipped (data.on_error=skip); first: {data}[train]:row 10: missing field 'prompt'" in warning["message"]
    rows = _write(tmp_path / "rows.jsonl", [{"prompt": "w1 w2", "response": " w7"}])
    assert len(_score(tmp_path / "s", capsys, rows, f"model.reward={tmp_path / 'rm' / 'model'}")) == 1
