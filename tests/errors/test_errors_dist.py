"""One-line errors of the `dist` section and of what does not run under torchrun. The torchrun cases
set torchrun's variables in this process: the refusals come before the process group would start.
(A batch that does not divide by the world size needs a real launch: tests/distributed.)"""
import pytest
from errortest_utils import one_line_error, ppo_args, reward_args, sft_args

from fourfold import dist
from fourfold.errors import ConfigError
from fourfold.run.fsdp import shard_model


@pytest.fixture
def under_torchrun(monkeypatch):
    """Rank 0 of 2 as torchrun would start it (no group is started by the tests below)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(key, value)


def test_placements_are_fsdp_or_replicate_and_an_adapter_critic_goes_with_the_policy(zoo, tmp_path, capsys):
    one_line_error(capsys, sft_args(zoo, tmp_path / "a", "dist.model=sharded"), "dist.model", "'fsdp'")
    one_line_error(capsys, reward_args(zoo, tmp_path / "r", "dist.model=everywhere"), "dist.model", "'replicate'")
    one_line_error(capsys, ppo_args(zoo, tmp_path / "b", "dist.reference=sharded"), "dist.reference", "'fsdp'")
    one_line_error(capsys, ppo_args(zoo, tmp_path / "c", "model.lora.r=4", "model.critic_mode=adapter",
                                    "model.critic_init=policy", "dist.critic=replicate"),
                   "dist.critic: replicate, and dist.policy is fsdp", "give both the same")


def test_mixed_precision_and_offload_need_what_they_act_on(zoo, tmp_path, capsys):
    one_line_error(capsys, sft_args(zoo, tmp_path / "a", "dist.mixed_precision=true"),
                   "dist.mixed_precision: bf16 mixed precision needs CUDA, and run.device is cpu")
    one_line_error(capsys, ppo_args(zoo, tmp_path / "b", "dist.cpu_offload=true"),
                   "dist.cpu_offload: offloads the frozen roles placed fsdp")
    with pytest.raises(ConfigError, match="dist.mixed_precision: bf16 mixed precision needs CUDA, and this run is on cpu"):
        shard_model(None, "cpu", mixed_precision=True)  # run.device=auto on a machine without CUDA


def test_stages_that_run_in_one_process_refuse_torchrun(zoo, tmp_path, capsys, under_torchrun):
    one_line_error(capsys, ["gym", f"run.output_dir={tmp_path / 'a'}", "run.device=cpu"],
                   "torchrun: this stage runs in one process only", "start it without torchrun")
    assert not dist.started() and not (tmp_path / "a").exists()


def test_batch_sizes_are_global_and_divide_by_the_world():
    with pytest.raises(ConfigError, match=r"^train.batch_size: 7 does not divide by the world size 2 "):
        dist.check_divisible("train.batch_size", 7, dist.World(0, 2, 0))
    dist.check_divisible("train.batch_size", 8, dist.World(1, 2, 1))
