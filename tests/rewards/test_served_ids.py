"""Served = local, exactly: a reward model behind ``model.reward_url`` scores the tokens the policy
sampled, special tokens included. The tiny random policy of the suite samples pad and BOS inside
its responses; the client sends each row's ids beside the text when the server's tokenizer has the
run's fingerprint, so a PPO run through the server equals the local reward model's run. The null:
the same server answering without a fingerprint gets the decoded text (pad and BOS dropped) and
its run differs, so the equality above is not true by construction. Measured (seed 0, 6 GRPO
iterations of 8 rows): ids, every metric equal (largest gap 0.0); 8 of the 48 rows scored hold a
pad or BOS after the prompt's BOS; text only, metrics up to 0.10 apart."""


from fourfold.apps.reward_server import model_scorer
from fourfold.cli import main
from fourfold.models.loading import load_tokenizer
from fourfold.reporting import is_timing_key, read_metrics

ITERATIONS = 6
SEED = 0



def _run(tiny_lm, out, source, capsys):
    over = {"model.policy": tiny_lm / "sft", "data.prompts": tiny_lm / "prompts.jsonl", "ppo.advantage": "grpo",
            "ppo.samples_per_prompt": 2, "ppo.iterations": ITERATIONS, "ppo.rollout_batch_size": 8,
            "ppo.minibatch_size": 8, "ppo.ppo_epochs": 1, "ppo.lr": 1e-3, "generation.max_new_tokens": 8,
            "run.progress": False, "run.device": "cpu", "run.threads": 1, "run.seed": SEED,
            "run.output_dir": out, "model.reward_retries": 0}
    rc = main(["ppo", *[f"{k}={v}" for k, v in over.items()], source])
    assert rc == 0, capsys.readouterr().err
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(out / "metrics.jsonl")]


def _largest_gap(a, b):
    assert len(a) == len(b) == ITERATIONS and [set(r) for r in a] == [set(r) for r in b]
    return max(abs(x[k] - y[k]) for x, y in zip(a, b) for k in x if isinstance(x[k], float))


def test_a_ppo_run_through_the_server_equals_the_local_reward_models_run(tiny_lm, tmp_path, served, capsys):
    scorer = model_scorer(str(tiny_lm / "rm"))
    seen = []

    def with_ids(prompts, responses, finished, columns, **ids):  # the server, noting the ids it is sent
        seen.extend(ids.get("input_ids") or [])
        return scorer(prompts, responses, finished, columns, **ids)

    with_ids.fingerprint = scorer.fingerprint
    local = _run(tiny_lm, tmp_path / "local", f"model.reward={tiny_lm / 'rm'}", capsys)
    served_run = _run(tiny_lm, tmp_path / "ids", f"model.reward_url={served(with_ids)[1]}", capsys)
    assert _largest_gap(local, served_run) <= 1e-5

    # what makes it a test: the policy sampled special tokens other than EOS inside responses
    tok = load_tokenizer(str(tiny_lm / "sft"))
    specials = {tok.pad_token_id, tok.bos_token_id}
    assert len(seen) == ITERATIONS * 8
    assert sum(any(t in specials for t in row[1:]) for row in seen) >= 3

    def text_only(prompts, responses, finished, columns, **ids):  # a server that cannot read ids
        assert not ids
        return scorer(prompts, responses, finished, columns)

    text = _run(tiny_lm, tmp_path / "text", f"model.reward_url={served(text_only)[1]}", capsys)
    assert _largest_gap(local, text) > 1e-3  # the null: the decoded text loses those tokens
