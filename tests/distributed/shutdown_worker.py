"""Run under torchrun by test_sft_dist.py: a tiny sharded SFT run, then ``fourfold.dist.shutdown``
as the CLI calls it; prints, per rank, how many FSDP objects the garbage collector still tracks
(unreachable cycles freed later would be freed at interpreter exit, after the group is gone)."""
import gc
import sys

import torch.distributed as tdist

from fourfold import dist
from fourfold.config import SFTConfig, load_config
from fourfold.trainers import sft


def main(tok: str, data: str, out: str) -> None:
    sft.train(load_config(SFTConfig, None, [
        "model.from_scratch=true", f"model.tokenizer={tok}", "model.hidden_size=32", "model.num_layers=2",
        "model.num_heads=4", "model.max_positions=32", "train.max_len=16", "train.batch_size=8",
        "train.max_steps=2", f"data.train={data}", "run.device=cpu", "run.progress=false",
        "run.tensorboard=false", f"run.output_dir={out}"]))
    rank = tdist.get_rank()
    dist.shutdown(sync=True)
    alive = sum(type(o).__name__.startswith("FSDP") for o in gc.get_objects())
    sys.stdout.write(f"rank {rank}: FSDP objects after shutdown: {alive}\n")  # one write: the ranks share the pipe
    sys.stdout.flush()


if __name__ == "__main__":
    main(*sys.argv[1:])
