"""``model.reward_url`` in a run: a reward model served on 127.0.0.1 gives the local one's iteration,
and a server that goes away mid-run ends it with one line naming the URL and the last complete
checkpoint; ``--resume`` once it is back ends exactly as the run that was never interrupted."""

import threading

import pytest
from safetensors.torch import load_file

from fourfold.apps.reward_server import model_scorer
from fourfold.cli import main
from fourfold.config import PPOConfig, load_config
from fourfold.reporting import is_timing_key, read_metrics


def _overrides(tiny_lm, **extra):
    over = {"model.policy": tiny_lm / "sft", "data.prompts": tiny_lm / "prompts.jsonl", "ppo.advantage": "grpo",
            "ppo.samples_per_prompt": 2, "ppo.iterations": 4, "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 8,
            "ppo.ppo_epochs": 1, "ppo.lr": 1e-3, "generation.max_new_tokens": 6, "run.progress": False,
            "run.device": "cpu", "run.save_every": 1, "run.threads": 1, "model.reward_retries": 2,
            "model.reward_backoff_s": 0.05, "model.reward_timeout_s": 30}
    over.update(extra)
    return [f"{k}={v}" for k, v in over.items()]


def _comparable(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def test_a_served_reward_model_gives_the_local_iteration(tiny_lm, tmp_path, served):
    """One iteration with model.reward_url = the local run's with model.reward, every metric within
    1e-5 (measured: equal). The server's tokenizer is the run's, so the client sends the sampled ids
    (special tokens included) and the server scores them as the local reward model does; the test
    with special tokens sampled, and its null, is tests/rewards/test_served_ids.py."""
    from fourfold.trainers.ppo import train

    _, url = served(model_scorer(str(tiny_lm / "rm")))
    runs = {}
    for name, source in (("local", f"model.reward={tiny_lm / 'rm'}"), ("served", f"model.reward_url={url}")):
        over = _overrides(tiny_lm, **{"ppo.iterations": 1, "run.output_dir": tmp_path / name, "run.seed": 2,
                                      "ppo.rollout_batch_size": 4, "ppo.minibatch_size": 4,
                                      "generation.max_new_tokens": 4}) + [source]
        train(load_config(PPOConfig, None, over))
        runs[name] = _comparable(read_metrics(tmp_path / name / "metrics.jsonl"))
    (local,), (remote,) = runs["local"], runs["served"]
    assert set(local) == set(remote)
    for key, value in local.items():
        assert remote[key] == pytest.approx(value, abs=1e-5), key


def _cli(args, capsys):
    rc = main(["ppo", *args])
    return rc, capsys.readouterr()


def test_a_server_gone_mid_run_is_one_line_and_resume_ends_as_the_uninterrupted_run(tiny_lm, tmp_path, served, capsys):
    scorer = model_scorer(str(tiny_lm / "rm"))
    _, url = served(scorer)
    rc, _ = _cli([*_overrides(tiny_lm), f"model.reward_url={url}", "--output-dir", str(tmp_path / "full")], capsys)
    assert rc == 0

    calls = [0]

    def going(prompts, responses, finished, columns, **ids):  # the third batch (iteration 3): the server goes away
        calls[0] += 1
        if calls[0] >= 3:
            threading.Thread(target=lambda: (server.shutdown(), server.server_close())).start()
            raise RuntimeError("shutting down")
        return scorer(prompts, responses, finished, columns, **ids)

    going.fingerprint = scorer.fingerprint  # the same tokenizer: the client sends the same ids

    server, url = served(going)
    port = server.server_address[1]
    args = [*_overrides(tiny_lm), f"model.reward_url={url}", "--output-dir", str(tmp_path / "cut")]
    rc, out = _cli(args, capsys)
    last = tmp_path / "cut" / "checkpoints" / "step-00000002"
    assert rc == 2 and out.err.count("\n") == 1, out.err
    assert out.err.startswith(f"fourfold ppo: error: model.reward_url: {url} did not answer after 3 tries")
    assert out.err.endswith(f"; the last complete checkpoint is {last}: continue with --resume once the server "
                            "answers again\n")
    served(scorer, port=port)  # back, at the same address
    rc, _ = _cli([*args, "--resume"], capsys)
    assert rc == 0
    full, cut = (read_metrics(tmp_path / d / "metrics.jsonl") for d in ("full", "cut"))
    assert _comparable(cut) == _comparable(full) and len(full) == 4
    a, b = (load_file(str(tmp_path / d / "policy" / "model.safetensors")) for d in ("full", "cut"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
