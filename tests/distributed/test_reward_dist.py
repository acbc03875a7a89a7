"""`fourfold reward` under torchrun (2 processes, gloo on CPU) is the same run as in one process:
the metrics of every step, the held-out figures, the normalisation folded into the head."""
import json

from disttest_utils import max_relative_diff, max_weight_diff, metric_rows, model_overrides, torchrun

from fourfold.config import RewardConfig, load_config
from fourfold.trainers import reward


def test_two_processes_match_one_process(dist_data, tmp_path):
    def overrides(out):
        return [*model_overrides(dist_data), f"data.train={dist_data['pairs']}", "train.lr=3e-3", "train.max_steps=6",
                "train.eval_every=3", "run.save_every=3", f"run.output_dir={out}"]

    two, one = tmp_path / "two", tmp_path / "one"
    torchrun("reward", overrides(two))
    reward.train(load_config(RewardConfig, None, overrides(one)))
    rows_1, rows_2 = metric_rows(one), metric_rows(two)
    assert len(rows_2) == 6 and sum("rm/eval_accuracy" in r for r in rows_2) == 2
    assert max_relative_diff(rows_1, rows_2) < 1e-4
    assert max_weight_diff(one / "model", two / "model") < 1e-4  # the score head after normalisation too
    shift = [json.loads((d / "model" / "config.json").read_text())["fourfold_score_shift"] for d in (one, two)]
    assert abs(shift[0] - shift[1]) < 1e-4
    normalize = [[json.loads(line) for line in (d / "events.jsonl").read_text().splitlines()
                  if '"normalize"' in line][0] for d in (one, two)]
    assert abs(normalize[0]["std"] - normalize[1]["std"]) < 1e-4 * normalize[0]["std"]
