"""`fourfold dpo` under torchrun (2 processes, gloo on CPU) is the same run as in one process.

The reference is another model than the policy: with the policy's own weights every implicit reward
of step 1 is 0 in one process and float noise when sharded, and the accuracy (r_c > r_r strictly)
of such ties is noise too."""
from disttest_utils import max_relative_diff, max_weight_diff, metric_rows, torchrun

from fourfold.config import DPOConfig, load_config
from fourfold.trainers import dpo


def test_two_processes_match_one_process(dist_data, tmp_path):
    from fourfold.models.factory import llama_config, random_causal_lm
    from fourfold.models.loading import load_tokenizer

    tok = load_tokenizer(dist_data["tok"])
    cfg = llama_config(len(tok), hidden=32, layers=2, heads=4, max_positions=32, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    for name, seed in (("sft", 0), ("ref", 1)):  # a reference apart from the policy: no exact ties at step 1
        random_causal_lm(cfg, seed=seed).save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)

    def overrides(out):
        return [f"model.path={tmp_path / 'sft'}", f"dpo.reference={tmp_path / 'ref'}", f"data.train={dist_data['pairs']}", "train.max_len=16",
                "train.batch_size=8", "train.lr=3e-3", "train.max_steps=5", "train.log_every=1", "train.eval_every=3",
                "run.device=cpu", "run.progress=false", "run.tensorboard=false", f"run.output_dir={out}"]

    two, one = tmp_path / "two", tmp_path / "one"
    torchrun("dpo", overrides(two))
    dpo.train(load_config(DPOConfig, None, overrides(one)))
    rows_1, rows_2 = metric_rows(one), metric_rows(two)
    assert len(rows_2) == 5 and sum("dpo/eval_loss" in r for r in rows_2) == 2
    assert max_relative_diff(rows_1, rows_2) < 1e-4
    assert max_weight_diff(one / "model", two / "model") < 1e-4
