"""`fourfold score` with reward functions as PPO calls them: the rows' other columns by name, several
weighted parts (each written beside the score), chat rows rendered as PPO renders them (the policy
tokenizer's chat template) and refused without a tokenizer, a missing column one line before
anything is written."""
import json

from fourfold.cli import main


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


RULES = '''
def exact(prompts, responses, answer):
    return [float(r.split()[-1] == a) for r, a in zip(responses, answer)]

def words(prompts, responses, per_word=1.0):
    return [per_word * len(r.split()) for r in responses]

def needs(prompts, responses, solution):
    return [0.0] * len(responses)
'''


def _args(tmp_path, rows, *extra):
    rules = tmp_path / "rules.py"
    rules.write_text(RULES)
    return ["score", f"data.rows={_write(tmp_path / 'rows.jsonl', rows)}", "run.threads=1",
            "--output-dir", str(tmp_path / "out"), *[e.format(rules=rules) for e in extra]]


def test_weighted_functions_see_the_columns_and_each_part_is_written(tmp_path, capsys):
    rows = [{"prompt": "w1", "response": "w2 w3", "answer": "w3", "id": 1},
            {"prompt": "w4", "response": "w5", "answer": "w6", "id": 2}]
    rc = main(_args(tmp_path, rows, "model.reward_fns=[{{fn: '{rules}:exact', weight: 2.0}}, "
                                    "{{fn: '{rules}:words', weight: -0.5, name: length, options: {{per_word: 2.0}}}}]"))
    out = capsys.readouterr().out
    assert rc == 0, out
    scored = _rows(tmp_path / "out" / "scores.jsonl")
    assert [r["parts"] for r in scored] == [{"exact": 1.0, "length": 4.0}, {"exact": 0.0, "length": 2.0}]
    assert [r["score"] for r in scored] == [2.0 * 1.0 - 0.5 * 4.0, 2.0 * 0.0 - 0.5 * 2.0]
    assert [r["id"] for r in scored] == [1, 2]  # every column kept in the output
    assert f"does not take the column(s) answer, id of {tmp_path / 'rows.jsonl'}" in out  # words: said once
    assert out.count("does not take the column(s)") == 2  # exact does not take id; words takes neither


def test_a_missing_column_is_one_line_and_nothing_is_written(tmp_path, capsys):
    rc = main(_args(tmp_path, [{"prompt": "w1", "response": "w2"}], "model.reward_fn={rules}:needs"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "model.reward_fn: " in err and "takes 'solution'" in err
    assert not (tmp_path / "out").exists()


def test_chat_rows_need_a_tokenizer_and_are_rendered_as_ppo_renders_them(tiny_lm, tmp_path, capsys):
    from fourfold.config import PPOConfig, load_config
    from fourfold.models.loading import load_tokenizer
    from fourfold.trainers.prompts import PromptStream

    tok = load_tokenizer(str(tiny_lm / "sft"))
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    tok.save_pretrained(tmp_path / "chat_tok")
    msgs = [{"role": "user", "content": "w3 w4"}]
    rows = [{"messages": msgs + [{"role": "assistant", "content": "w6"}], "answer": "w6"}]
    rc = main(_args(tmp_path, rows, "model.reward_fn={rules}:exact"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "set model.tokenizer (the policy's directory)" in err, err
    assert not (tmp_path / "out" / "scores.jsonl").exists()
    # PPO's prompt of the same messages, with the same tokenizer; the function scores 1 when it gets that text
    _write(tmp_path / "prompts.jsonl", [{"messages": msgs}])
    cfg = load_config(PPOConfig, None, [f"model.policy={tiny_lm / 'sft'}", f"data.prompts={tmp_path / 'prompts.jsonl'}",
                                        f"model.reward={tiny_lm / 'rm'}"])
    (ppo_text,) = PromptStream(cfg.data, load_tokenizer(str(tmp_path / "chat_tok")), 1, 0).texts
    assert ppo_text.startswith("<user> w3 w4")
    (tmp_path / "same.py").write_text(f"def same(prompts, responses):\n    return [float(p == {str(ppo_text)!r}) for p in prompts]\n")
    rc = main(_args(tmp_path, rows, f"model.reward_fn={tmp_path / 'same.py'}:same", f"model.tokenizer={tmp_path / 'chat_tok'}"))
    assert rc == 0, capsys.readouterr()
    assert _rows(tmp_path / "out" / "scores.jsonl")[0]["score"] == 1.0


FIRST_HOUR = '''
import torch

def everything(prompts, responses, **columns):
    return [float(len(columns)) for _ in responses]

def meta(prompts, responses):
    return torch.empty(len(responses), device="meta")
'''


def test_an_option_the_function_does_not_take_is_one_line_before_anything_runs(tmp_path, capsys):
    """A typo in options (per_wrd for per_word): one line naming the key, nothing written (issue 40, 5)."""
    rows = [{"prompt": "w1", "response": "w2 w3"}]
    rc = main(_args(tmp_path, rows, "model.reward_fns=[{{fn: '{rules}:words', options: {{per_wrd: 0.5}}}}]"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert "model.reward_fns[0].options.per_wrd: " in err and "has no parameter 'per_wrd'" in err and "per_word" in err
    assert not (tmp_path / "out").exists()
    rc = main(_args(tmp_path, rows, "model.reward_fns=[{{fn: '{rules}:words', options: {{per_word: 0.5}}}}]"))
    assert rc == 0 and _rows(tmp_path / "out" / "scores.jsonl")[0]["score"] == 1.0


def test_columns_named_like_the_call_s_arguments_are_left_out_of_columns_with_a_warning(tmp_path, capsys):
    """A `prompts` or `responses` column and a function taking **columns: the call's own arguments
    win, the columns are left out with a warning (issue 40, 6); the other columns still arrive."""
    (tmp_path / "fh.py").write_text(FIRST_HOUR)
    rows = [{"prompt": "w1", "response": "w2", "prompts": "x", "responses": "y", "id": 1}]
    rc = main(_args(tmp_path, rows, f"model.reward_fn={tmp_path / 'fh.py'}:everything"))
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert _rows(tmp_path / "out" / "scores.jsonl")[0]["score"] == 1.0  # only `id`
    assert "has the column(s) prompts, responses" in cap.err + cap.out


def test_a_meta_tensor_returned_is_the_one_line_of_other_bad_returns(tmp_path, capsys):
    (tmp_path / "fh.py").write_text(FIRST_HOUR)
    rc = main(_args(tmp_path, [{"prompt": "w1", "response": "w2"}], f"model.reward_fn={tmp_path / 'fh.py'}:meta"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "returned a tensor on the meta device" in err, err
