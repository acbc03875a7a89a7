"""The arithmetic world: its split, its partly-right corpus, its verifier and its reward function."""
import random
from pathlib import Path

import pytest

from fourfold.errors import ConfigError
from fourfold.models.reward_fn import column_plan
from fourfold.tasks import ArithmeticTask, ArithmeticTaskConfig, Task, build_word_tokenizer, get_task
from fourfold.tasks.arithmetic import (
    answer_reward,
    carry_columns,
    has_repetition,
    is_well_formed,
    parse_prompt,
    prompt_of,
    read_answer,
    reward,
    worked,
)

RIGHT = "7 + 8 = 1 5 , 6 + 5 + 1 = 1 2 , answer : 1 2 5"       # 67 + 58 = 125
DROPPED = "7 + 8 = 1 5 , 6 + 5 = 1 1 , answer : 1 1 5"         # the carry into the tens forgotten
P = "what is 6 7 + 5 8 ?"


def all_pairs(task):
    return [(a, b) for a in range(task.low, task.high) for b in range(task.low, task.high)]


def test_registered_and_a_task():
    task = get_task("arithmetic", digits=3)
    assert isinstance(task, ArithmeticTask) and isinstance(task, Task)
    assert task.config.digits == 3 and (task.low, task.high) == (100, 1000)
    assert ArithmeticTask(ArithmeticTaskConfig(), error_rate=0.1).config.error_rate == 0.1


@pytest.mark.parametrize("key, value", [("digits", 0), ("digits", 7), ("digits", True), ("error_rate", 1.5),
                                        ("heldout_share", 0.0), ("heldout_share", 1.0), ("labeler_noise", -0.1)])
def test_config_refuses_bad_values(key, value):
    with pytest.raises(ConfigError, match=f"ArithmeticTaskConfig.{key}"):
        ArithmeticTaskConfig(**{key: value})


# ---- the text ----------------------------------------------------------------------------------


def test_worked_solution_by_hand():
    assert worked(67, 58) == (RIGHT, 125)
    assert worked(67, 58, drop=1) == (DROPPED, 115)
    assert worked(62, 23, slip=(0, 1)) == ("2 + 3 = 6 , 6 + 2 = 8 , answer : 8 6", 86)
    # a slip up to 10 makes a carry the pupil then carries: 9 + 0 = 1 0
    assert worked(19, 10, slip=(0, 1)) == ("9 + 0 = 1 0 , 1 + 1 + 1 = 3 , answer : 3 0", 30)
    assert worked(999, 111) == ("9 + 1 = 1 0 , 9 + 1 + 1 = 1 1 , 9 + 1 + 1 = 1 1 , answer : 1 1 1 0", 1110)
    assert worked(999, 111, drop=2)[1] == 1010
    assert carry_columns(67, 58) == [1] and carry_columns(62, 23) == [] and carry_columns(999, 111) == [1, 2]
    assert carry_columns(91, 90) == []  # the carry out of the last column is the leading 1, not a carry to forget


def test_prompt_and_answer_read_back():
    assert prompt_of(67, 58) == P and parse_prompt(P) == (67, 58)
    assert parse_prompt(f"user: {P}\nassistant: ") == (67, 58)  # a chat template's text around it
    assert parse_prompt("what is 6 7 ?") is None
    assert read_answer(RIGHT) == "125"
    assert read_answer("answer : 0 1 2 5") == "125"              # normalised: leading zeros dropped
    assert read_answer("answer : 1 2 5 answer : 9") == "9"       # the last marker counts
    assert read_answer("7 + 8 = 1 5 , 6 + 5 + 1 = 1 2") is None   # no marker: no answer (not the last digit)
    assert read_answer("answer : 1 2 5 ,") is None               # anything after the digits
    assert read_answer("answer :") is None


def test_format_and_repetition():
    assert is_well_formed(RIGHT) and is_well_formed(DROPPED)
    assert not is_well_formed("answer : 1 2 5")                  # no working
    assert not is_well_formed(RIGHT + " ,")
    assert not is_well_formed("7 + 8 = 1 5 answer : 1 2 5")
    assert not has_repetition(P, RIGHT)
    assert not has_repetition("what is 2 2 + 5 5 ?", "2 + 5 = 7 , 2 + 5 = 7 , answer : 7 7")  # right, twice the same step
    assert has_repetition(P, "7 + 8 = 1 5 , 7 + 8 = 1 5 , 6 + 5 + 1 = 1 2 , answer : 1 2 5")


def test_tokenizer_round_trip():
    task = ArithmeticTask()
    tok = build_word_tokenizer(task.tokenizer_corpus())
    assert len(tok) == 4 + 18
    rows = task.sft_examples(50, random.Random(3))
    for text in [r["prompt"] + " " + r["completion"] for r in rows] + [RIGHT]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    digits = tok("0 1 2 3 4 5 6 7 8 9", add_special_tokens=False)["input_ids"]
    assert len(set(digits)) == 10  # one token per digit


# ---- the split ---------------------------------------------------------------------------------


def test_split_is_deterministic_disjoint_and_symmetric():
    task = ArithmeticTask()
    sides = {p: task.split_of(*p) for p in all_pairs(task)}
    assert sides == {p: ArithmeticTask().split_of(*p) for p in all_pairs(task)}  # same in a fresh task
    assert all(sides[(a, b)] == sides[(b, a)] for a, b in sides)                 # a + b and b + a together
    held = sum(s == "heldout" for s in sides.values())
    assert held == 1615  # of 8100 ordered pairs (816 of 4095 unordered): seed 0's split, pinned
    assert abs(held / len(sides) - 0.2) < 0.01
    other = ArithmeticTask(split_seed=1)
    assert sum(other.split_of(*p) != s for p, s in sides.items()) > 1000  # another seed, another split
    train = {r["prompt"] for r in task.problems(3000, random.Random(0))}
    heldout = {r["prompt"] for r in task.problems(1000, random.Random(0), split="heldout")}
    assert train and heldout and not train & heldout
    assert all(task.split_of(*parse_prompt(p)) == "heldout" for p in heldout)
    corpus = {r["prompt"] for r in task.sft_examples(3000, random.Random(1))}
    assert not corpus & heldout and not set(task.sample_prompts(500, random.Random(2))) & heldout
    assert task.problems(5, random.Random(7)) == task.problems(5, random.Random(7))
    with pytest.raises(ValueError, match="split"):
        task.problems(1, random.Random(0), split="test")


def test_problem_rows_carry_the_answer():
    rows = ArithmeticTask(digits=3).problems(200, random.Random(0), split="heldout")
    for r in rows:
        a, b = parse_prompt(r["prompt"])
        assert r["answer"] == str(a + b) and 100 <= a < 1000 and 100 <= b < 1000


# ---- the corpus --------------------------------------------------------------------------------


@pytest.mark.parametrize("error_rate, wrong", [(0.6, 5968), (0.25, 2428), (0.0, 0), (1.0, 10000)])
def test_sft_error_rate_is_the_configured_one(error_rate, wrong):
    task = ArithmeticTask(error_rate=error_rate)
    rows = task.sft_examples(10000, random.Random(0))
    gold = task.gold_reward([r["prompt"] for r in rows], [r["completion"] for r in rows])
    assert [g == 1.0 for g in gold] == [r["correct"] for r in rows]  # the row's flag is the verifier's
    assert sum(g == 0.0 for g in gold) == wrong                       # pinned for seed 0
    assert abs(wrong / 10000 - error_rate) < 0.015                     # 3 binomial sd at most
    for r in rows:
        assert is_well_formed(r["completion"])
        if not r["correct"]:  # the mistake is the documented one: a dropped carry where there is one
            a, b = parse_prompt(r["prompt"])
            dropped = {str(worked(a, b, drop=c)[1]) for c in carry_columns(a, b)}
            assert (read_answer(r["completion"]) in dropped) == bool(dropped)


# ---- gold, metrics, labels ---------------------------------------------------------------------


def test_gold_and_metrics_by_hand():
    task = ArithmeticTask()
    responses = [RIGHT, DROPPED, "answer : 1 2 5", "7 + 8 = 1 5 , 6 + 5 + 1 = 1 2"]
    prompts = [P] * 4
    assert task.gold_reward(prompts, responses) == [1.0, 0.0, 1.0, 0.0]
    m = task.response_metrics(prompts, responses)
    assert m == {"length": (21 + 19 + 5 + 15) / 4, "well_formed": 0.5, "repetition": 0.0, "gold": 0.5,
                 "accuracy": 0.5, "answered": 0.75, "dropped_carry": 0.25}
    assert task.response_metrics([], [])["accuracy"] == 0.0
    with pytest.raises(ValueError, match="not an arithmetic prompt"):
        task.gold_reward(["the blender"], [RIGHT])


def test_labelers_prefer_the_right_answer():
    clean, noisy = ArithmeticTask(labeler_noise=0.0), ArithmeticTask(labeler_noise=1.0)
    prompts, a, b = [P] * 400, [RIGHT, DROPPED] * 200, [DROPPED, RIGHT] * 200
    assert clean.label_pairs(prompts, a, b, random.Random(0)) == [0, 1] * 200
    ties = clean.label_pairs(prompts, a, a, random.Random(0))
    coins = noisy.label_pairs(prompts, a, b, random.Random(0))
    assert 150 < sum(ties) < 250 and 150 < sum(c != x for c, x in zip(coins, [0, 1] * 200)) < 250


# ---- the reward function -----------------------------------------------------------------------


def test_reward_by_hand():
    prompts = [P, P, P, P]
    responses = [RIGHT, DROPPED, "answer : 1 2 5", "nonsense"]
    assert reward(prompts, responses) == [1.1, 0.1, 1.0, 0.0]                         # from the prompt
    assert reward(prompts, responses, answer=["125", "115", "125", "125"]) == [1.1, 1.1, 1.0, 0.0]  # the column wins
    assert reward(prompts, responses, answer=[125, " 0125 ", "12", "125"]) == [1.1, 0.1, 0.0, 0.0]
    assert answer_reward(2.0, 0.0)(prompts, responses) == [2.0, 0.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="not an arithmetic prompt"):
        reward(["hello"], [RIGHT])
    with pytest.raises(ValueError, match="parallel"):
        reward(prompts, responses, answer=["125"])
    with pytest.raises(ValueError, match="finite"):
        answer_reward(float("nan"))


def test_reward_takes_the_answer_column_by_name():
    plan = column_plan(reward, "fourfold.tasks.arithmetic:reward", ["answer", "source"], "prompts.jsonl")
    assert plan.named == ("answer",) and plan.rest
    assert plan.select({"answer": ["125"], "source": ["x"]}) == {"answer": ["125"], "source": ["x"]}
    assert reward([P], [RIGHT], **plan.select({"answer": ["125"], "source": ["x"]})) == [1.1]


# ---- the example configs and learnability ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_example_configs_are_the_learnability_settings():
    """examples/arithmetic_{sft,grpo}.yaml load and say what tools/arithmetic_learnability.py runs
    with its defaults (the settings whose numbers the module docstring reports)."""
    from fourfold.config import PPOConfig, SFTConfig, load_config
    from fourfold.models.reward_fn import load_reward_fn

    sft = load_config(SFTConfig, ROOT / "examples" / "arithmetic_sft.yaml")
    grpo = load_config(PPOConfig, ROOT / "examples" / "arithmetic_grpo.yaml")
    d = _defaults()
    assert (sft.model.hidden_size, sft.model.num_layers, sft.train.max_steps, sft.train.batch_size, sft.train.lr) == (
        d.hidden, d.layers, d.sft_steps, d.sft_batch, d.sft_lr)
    algo = grpo.ppo
    assert (algo.advantage, algo.samples_per_prompt, algo.iterations, algo.rollout_batch_size, algo.minibatch_size,
            algo.ppo_epochs, algo.lr, algo.kl_coef) == ("grpo", d.group, d.iterations, d.rollout, d.minibatch, d.epochs,
                                                         d.lr, d.kl)
    assert (sft.train.max_len, grpo.data.max_prompt_len, grpo.generation.max_new_tokens) == (34, 10, 24)
    assert load_reward_fn(grpo.model.reward_fn) is reward


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("arithmetic_learnability", ROOT / "tools" / "arithmetic_learnability.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _defaults():
    return _script().parser().parse_args([])


@pytest.mark.slow  # about 3 minutes on 2 cores
def test_grpo_with_the_rule_reward_fixes_the_dropped_carry(tmp_path):
    """SFT on the partly-right corpus then GRPO with the shipped reward: held-out accuracy rises.
    Seed 0 measured 0.547 -> 0.955 greedy, 0.449 -> 0.730 sampled (the module docstring);
    thresholds leave a margin."""
    result = _script().main(["--out", str(tmp_path), "--seed", "0"])
    before, after = result["before"], result["after"]
    assert before["greedy"]["dropped_carry"] > 0.3           # SFT imitated the corpus's mistake
    assert after["greedy"]["accuracy"] > before["greedy"]["accuracy"] + 0.25
    assert after["sampled"]["accuracy"] > before["sampled"]["accuracy"] + 0.15
    assert after["greedy"]["dropped_carry"] < 0.1
