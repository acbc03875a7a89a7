"""Two nodes on one machine: two torchrun launchers (``--nnodes 2 --node-rank 0|1 --nproc-per-node 1``,
a c10d rendezvous on 127.0.0.1), each one rank, give the one-process run of the same SFT config
(with LoRA; full fine-tuning in the slow suite), and a node killed mid-run (its launcher and its
rank, SIGKILL) ends the other within 60 s with one line naming the last complete checkpoint."""
import time

import pytest
from disttest_utils import kill_job, max_scaled_diff, max_tensor_diff, metric_rows, two_nodes

from fourfold.cli import main


def _sft(tiny_lm, data, out, *extra) -> list[str]:
    return [f"model.path={tiny_lm / 'sft'}", f"data.train={data['sft']}", f"data.eval={data['sft_eval']}",
            "train.max_len=16", "train.batch_size=8", "train.lr=3e-3", "train.lr_schedule=constant", "train.log_every=1",
            "train.eval_every=3", "run.save_every=4", "run.device=cpu", "run.progress=false", "run.tensorboard=false",
            "run.threads=1", f"run.output_dir={out}", *extra]


def _two_nodes_match_one(tiny_lm, data, tmp_path, *extra) -> dict:
    """6 steps (through an epoch end where a rank's part is empty, two held-out evaluations) by two
    nodes and by one process: metrics and every exported directory within 1e-5 of max(|value|, 1)."""
    nodes = two_nodes("sft", _sft(tiny_lm, data, tmp_path / "two", "train.max_steps=6", *extra))
    assert [p.returncode for p in nodes] == [0, 0], nodes[0].err[-2000:] + nodes[1].err[-2000:]
    assert sum(p.out.count("fourfold sft: done") for p in nodes) == 1  # rank 0's summary line alone
    assert main(["sft", *_sft(tiny_lm, data, tmp_path / "one", "train.max_steps=6", *extra)]) == 0
    figures = {"metrics": max_scaled_diff(metric_rows(tmp_path / "one"), metric_rows(tmp_path / "two")),
               "model": max_tensor_diff(tmp_path / "one" / "model", tmp_path / "two" / "model")}
    if (tmp_path / "one" / "model-adapter").is_dir():
        figures["adapter"] = max_tensor_diff(tmp_path / "one" / "model-adapter", tmp_path / "two" / "model-adapter",
                                             "adapter_model.safetensors")
    assert len(metric_rows(tmp_path / "two")) == 6 and max(figures.values()) < 1e-5, figures
    print(f"2 nodes = 1 process: {figures}; wall {max(p.wall_s for p in nodes):.1f} s")
    return figures


def test_two_nodes_with_lora_match_one_process(tiny_lm, dist_data, tmp_path):
    _two_nodes_match_one(tiny_lm, dist_data, tmp_path, "model.lora.r=4")


@pytest.mark.slow  # the same launch as above without LoRA; ~20-30 s on 2 shared cores
def test_two_nodes_match_one_process(tiny_lm, dist_data, tmp_path):
    _two_nodes_match_one(tiny_lm, dist_data, tmp_path)


def test_a_killed_node_ends_the_other_with_one_line(tiny_lm, dist_data, tmp_path):
    """Node 1's launcher and rank SIGKILLed once the first checkpoint is complete: node 0's rank
    meets the broken connection at its next collective, says so in one line naming that checkpoint,
    and its launcher ends, all within 60 s."""
    out = tmp_path / "run"
    nodes = two_nodes("sft", _sft(tiny_lm, dist_data, out, "train.max_steps=400"), wait=False)
    first = out / "checkpoints" / "step-00000004"
    deadline = time.monotonic() + 180
    while not first.is_dir() and nodes[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first.is_dir() and nodes[0].poll() is None, nodes[0].communicate()[1][-2000:]
    kill_job(nodes[1])
    t_kill = time.monotonic()
    try:
        _, err = nodes[0].communicate(timeout=90)
    finally:
        nodes[0].kill()
    ended_s = time.monotonic() - t_kill
    from fourfold.checkpoint import latest_checkpoint

    lines = [line for line in err.splitlines() if line.startswith("fourfold sft: error:")]
    last = latest_checkpoint(out)
    assert nodes[0].returncode != 0 and ended_s < 60 and len(lines) == 1, err[-3000:]
    assert "of 2: another rank of this run is gone" in lines[0] and str(last) in lines[0]
    print(f"the killed node's peer ended in {ended_s:.1f} s: {lines[0]}")
