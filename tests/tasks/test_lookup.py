"""The lookup world (fourfold.tasks.lookup): the environment's semantics by hand, the corpus's
imperfect play, gold = the world's own success, and the corpus tokenised as the rollout tokenises
the same episode (SFT's multi-turn rows and the environment's observations agree)."""
import json
import random

import pytest

from fourfold.data import encode_sft, load_sft
from fourfold.data.observations import ObservationEncoder
from fourfold.errors import ConfigError
from fourfold.rollout.env import make_envs
from fourfold.tasks.lookup import UNKNOWN, WORDS, LookupEnv, LookupTask, LookupTaskConfig, make_env, parse_action, parse_chain
from fourfold.tasks.tokenizer import build_word_tokenizer


def user(text):
    return [{"role": "user", "content": text}]


def test_the_environment_answers_lookups_and_scores_the_answer():
    env = make_env({"prompt": "find c", "chain": "c f 7", "hops": 2})
    assert env.reset() == user("find c")
    assert env.step("look c") == (user("c is f ."), 0.0, False)
    assert env.step("look f") == (user("f is 7 ."), 0.0, False)
    assert env.step("look q") == (user(UNKNOWN), 0.0, False)      # not in the chain
    assert env.step("look c f") == (user(UNKNOWN), 0.0, False)    # malformed
    assert env.step("answer 7 .") == (user(UNKNOWN), 0.0, False)  # the whole turn must be the action
    assert not env.success
    assert env.step("answer 7") == (user("."), 1.0, True) and env.success
    wrong = make_env({"chain": "c f 7"})
    assert wrong.hops == 2 and wrong.step("answer 3") == (user("."), 0.0, True) and not wrong.success


def test_hops_zero_tells_the_fact_in_the_prompt():
    env = make_env({"chain": "c 7", "hops": 0})
    assert env.reset() == user("c is 7 . find c")
    assert env.step("answer 7")[1:] == (1.0, True)
    assert LookupTask.perfect_actions(["c", "7"], 0) == ["answer 7"]
    assert LookupTask.perfect_actions(["c", "f", "7"], 2) == ["look c", "look f", "answer 7"]


def test_bad_rows_and_options_are_one_line_errors():
    with pytest.raises(ConfigError, match="no 'chain' column"):
        make_env({"prompt": "find c"})
    for bad in ("c", "c c 7", "c f", "7", "C 7", "c 7 f", 3):
        with pytest.raises(ConfigError, match="chain: expected distinct keys"):
            parse_chain(bad)
    with pytest.raises(ConfigError, match="hops 1 does not fit"):
        LookupEnv(["c", "f", "7"], 1)
    with pytest.raises(ConfigError, match="LookupTaskConfig.hops"):
        LookupTaskConfig(hops=4)
    with pytest.raises(ConfigError, match="LookupTaskConfig.error_rate"):
        LookupTaskConfig(error_rate=1.5)
    # through the interface's boundary: a ConfigError raised by make_env names the row
    with pytest.raises(Exception, match="p.jsonl:3"):
        make_envs("fourfold.tasks.lookup:make_env", [{"prompt": "x"}], ["p.jsonl:3"])


def test_values_of_several_digits():
    task = LookupTask(hops=2, value_digits=2)
    (row,) = task.problems(1, random.Random(5))
    chain = parse_chain(row["chain"])
    assert len(chain) == 3 and len(chain[-1].split()) == 2 and row["answer"] == chain[-1]
    env = make_env(row)
    actions = task.perfect_actions(chain, 2)
    assert actions[-1] == f"answer {chain[-1]}"
    assert [env.step(a)[1] for a in actions] == [0.0, 0.0, 1.0]
    assert parse_chain("c f 4 7") == ["c", "f", "4 7"]
    assert make_env({"chain": "c 4 7"}).step("answer 4")[1:] == (0.0, True)
    with pytest.raises(ConfigError, match="value_digits"):
        LookupTaskConfig(value_digits=0)
    rows = task.sft_rows(400, random.Random(0))
    assert 0.4 < sum(r["correct"] for r in rows) / 400 < 0.65
    for r in rows:  # a slip with two digits says the value's digits in reverse order
        told = r["messages"][-2]["content"].split()[2:4] if len(r["messages"]) > 2 else None
        said = r["messages"][-1]["content"].split()[1:]
        if told and not r["correct"]:
            assert said == told[::-1]


def test_parse_action():
    assert parse_action("look c") == ("look", "c")
    assert parse_action(" answer  4 ") == ("answer", "4")
    assert parse_action("answer 4 7") == ("answer", "4 7")
    for bad in ("", "look", "look 4", "answer c", "answer", "answer 4 c", "find c", "look c look d"):
        assert parse_action(bad) == ("bad", None)


@pytest.mark.parametrize("hops", [0, 1, 2, 3])
def test_problems_are_rows_whose_perfect_play_wins_in_hops_plus_one_turns(hops):
    task = LookupTask(hops=hops)
    rows = task.problems(50, random.Random(0))
    assert rows == task.problems(50, random.Random(0))  # seeded
    for row in rows:
        env = make_env(json.loads(json.dumps(row)))  # as read back from a prompts file
        assert env.reset()[0]["content"] == row["prompt"]
        actions = task.perfect_actions(parse_chain(row["chain"]), hops)
        assert len(actions) == hops + 1
        rewards = [env.step(a)[1] for a in actions]
        assert rewards == [0.0] * hops + [1.0] and env.success and row["answer"] == row["chain"].split()[-1]
        assert task.split_of(row["chain"].split()) == "train"
    held = task.problems(50, random.Random(0), split="heldout")
    assert {r["chain"] for r in held}.isdisjoint({r["chain"] for r in rows})
    if hops >= 1:  # the answer is drawn per row: the key does not tell it
        assert len({r["answer"] for r in rows}) > 5


def test_the_corpus_plays_imperfectly_at_the_error_rate():
    task = LookupTask(hops=1, error_rate=0.5, guess_share=0.5)
    rows = task.sft_rows(2000, random.Random(1))
    right = sum(r["correct"] for r in rows) / len(rows)
    # 50% perfect; mistakes: half guesses (right 1 in 10), half slips (never right)
    assert abs(right - (0.5 + 0.25 * 0.1)) < 0.04
    guesses = [r for r in rows if len(r["messages"]) == 2]
    assert abs(len(guesses) / len(rows) - 0.25) < 0.04
    for r in rows[:50]:  # each row replays in its environment to its own "correct"
        m = r["messages"]
        assert [x["role"] for x in m] == ["user"] + ["assistant", "user"] * ((len(m) - 2) // 2) + ["assistant"]
        assert parse_action(m[-1]["content"])[0] == "answer"
    perfect = LookupTask(hops=2, error_rate=0.0).sft_rows(20, random.Random(2))
    assert all(r["correct"] and len(r["messages"]) == 6 for r in perfect)


def test_gold_is_the_share_answered_right():
    assert LookupTask.gold([1.0, 0.0, 1.0, 0.0]) == 0.5
    assert LookupTask.gold([]) == 0.0


def test_the_corpus_tokenises_as_the_rollout_appends_the_same_episode(tmp_path):
    """An SFT row (data.assistant_turns: all, the word tokenizer's plain chat fallback) is the ids
    a rollout of the same actions builds: the first observation's ids, each action's ids + EOS,
    each observation's ids from ObservationEncoder.next."""
    tok = build_word_tokenizer(WORDS)
    task = LookupTask(hops=2, error_rate=0.0)
    (row,) = task.sft_rows(1, random.Random(3))
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (ex,) = encode_sft(load_sft(path, assistant_turns="all"), tok, 64)
    enc = ObservationEncoder(tok)
    msgs = row["messages"]
    ids, trained = list(enc.first(msgs[:1], "x:1", 64)), []
    trained += [0] * len(ids)
    for k in range(1, len(msgs), 2):
        action = tok(msgs[k]["content"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids += action
        trained += [1] * len(action)
        if k + 1 < len(msgs):
            obs = enc.next(msgs[k + 1:k + 2], "x:1")
            ids += obs
            trained += [0] * len(obs)
    assert tok.unk_token_id not in ids
    assert list(ex.input_ids) == ids and list(ex.loss_mask) == trained
