"""`fourfold reward` under torchrun (2 processes, gloo on CPU) is the same run as in one process:
the metrics of every step, the held-out figures, the normalisation folded into the head; and a
one-process checkpoint resumes under torchrun (sharded on load) into the same run."""
import json
import shutil

import pytest
from disttest_utils import max_relative_diff, max_weight_diff, metric_rows, model_overrides, torchrun

from fourfold.config import RewardConfig, load_config
from fourfold.trainers import reward


def _overrides(data, out, *extra):
    return [*model_overrides(data), f"data.train={data['pairs']}", "train.lr=3e-3", "train.max_steps=6",
            "train.eval_every=3", "run.save_every=3", f"run.output_dir={out}", *extra]


@pytest.fixture(scope="module")
def one(dist_data, tmp_path_factory):
    """The one-process run (6 steps, checkpoints at 3 and 6)."""
    out = tmp_path_factory.mktemp("reward") / "one"
    reward.train(load_config(RewardConfig, None, _overrides(dist_data, out)))
    return out


def test_two_processes_match_one_process(dist_data, one, tmp_path):
    two = tmp_path / "two"
    torchrun("reward", _overrides(dist_data, two))
    rows_1, rows_2 = metric_rows(one), metric_rows(two)
    assert len(rows_2) == 6 and sum("rm/eval_accuracy" in r for r in rows_2) == 2
    assert max_relative_diff(rows_1, rows_2) < 1e-4
    assert max_weight_diff(one / "model", two / "model") < 1e-4  # the score head after normalisation too
    shift = [json.loads((d / "model" / "config.json").read_text())["fourfold_score_shift"] for d in (one, two)]
    assert abs(shift[0] - shift[1]) < 1e-4
    normalize = [[json.loads(line) for line in (d / "events.jsonl").read_text().splitlines()
                  if '"normalize"' in line][0] for d in (one, two)]
    assert abs(normalize[0]["std"] - normalize[1]["std"]) < 1e-4 * normalize[0]["std"]


def test_a_one_process_checkpoint_resumes_under_torchrun(dist_data, one, tmp_path):
    out = tmp_path / "resumed"
    shutil.copytree(one, out, ignore=shutil.ignore_patterns("step-00000006", "model"))
    proc = torchrun("reward", _overrides(dist_data, out, "run.resume=true"))
    assert "step-00000003 was written by one process (no torchrun) and resumes on 2 ranks" in proc.stdout
    assert max_relative_diff(metric_rows(one), metric_rows(out)) < 1e-4
    assert max_weight_diff(one / "model", out / "model") < 1e-4
    assert (out / "checkpoints" / "step-00000006" / "rng-rank00001.json").is_file()  # sharded from there on
