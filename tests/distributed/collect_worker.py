"""One ``collect()`` of a PPO rollout, run under torchrun by ``test_rollout_dist.py`` (and in the
test's own process for the 1-process result): ``python collect_worker.py TINY_LM_DIR OUT_PREFIX
[ENGINE WEIGHTS]`` writes ``OUT_PREFIX.<rank>.pt`` with the gathered rollout, responses and metrics
of each rank. With ENGINE and WEIGHTS (``generation.engine`` and ``generation.weights``) the policy
is sharded with FSDP2 over the ranks (as ``fourfold ppo`` places it) and the engine built from the
config samples, after one ``engine.sync(policy)``."""
import sys

import torch

from fourfold import dist
from fourfold.config import PPOConfig, load_config
from fourfold.models.build import build_roles
from fourfold.models.plan import plan_roles
from fourfold.models.reward_parts import load_functions
from fourfold.rollout.eager import EagerEngine
from fourfold.rollout.engine import make_engine
from fourfold.rollout.noise import RowNoise
from fourfold.run.fsdp import shard_model
from fourfold.trainers.prompts import PromptStream, repeat_prompts
from fourfold.trainers.rollouts import collect


def row_reward(prompts, responses, row):
    """A part of the weighted reward (``engine`` ``weighted``): the row's index, from its column."""
    return [float(r) for r in row]


def run(tiny_lm: str, world, engine: str = "", weights: str = "") -> dict:
    """Collect one iteration (4 prompts x 2 samples, temperature 2: EOS at different steps). With
    ``engine`` ``weighted`` the reward is the reward model plus :func:`row_reward` reading a ``row``
    column (each response's global row index), parts gathered like the scores."""
    over = {"model.policy": f"{tiny_lm}/sft", "model.reward": f"{tiny_lm}/rm", "data.prompts": f"{tiny_lm}/prompts.jsonl",
            "generation.max_new_tokens": 16, "generation.temperature": 2.0, "generation.missing_eos_score": -1.0}
    columns = None
    if engine == "weighted":
        over["model.reward_fns"] = f"[{{fn: '{__file__}:row_reward', weight: 0.5}}]"
        columns, engine = {"row": list(range(8))}, ""
    if engine:
        over.update({"generation.engine": engine, "generation.weights": weights})
        if engine == "static":  # the eager engine checks every step (stop_check_every is refused there)
            over["generation.stop_check_every"] = 3
    cfg = load_config(PPOConfig, None, [f"{k}={v}" for k, v in over.items()])
    plan = plan_roles("ppo", cfg)
    functions = load_functions(plan.reward_parts, tuple(columns or ()), "the test's columns")[0]
    roles = build_roles(plan, torch.device("cpu"), reward_functions=functions)
    rollout_engine = EagerEngine()  # one process: the eager engine over the policy itself
    if engine:
        if world.distributed:
            shard_model(roles.policy, torch.device("cpu"))
        rollout_engine = make_engine(cfg.generation, max_prompt_len=cfg.data.max_prompt_len)
        rollout_engine.sync(roles.policy)
    stream = PromptStream(cfg.data, roles.tokenizer, 4, seed=0)
    texts, ids, mask = repeat_prompts(*stream.next("cpu"), 2)
    probe = lambda prompts, responses: {"probe/words": sum(len(r.split()) for r in responses) / len(responses)}
    col = collect(roles, texts, ids, mask, cfg.generation, kl_coef=0.1, probe=probe, noise=RowNoise(0, 3),
                  engine=rollout_engine, columns=columns)
    r = col.rollout
    resolved = getattr(rollout_engine.weights, "resolved", weights) if rollout_engine is not None else None
    return {"responses": col.responses, "weights": resolved, "metrics": {k: v for k, v in col.metrics.items() if not k.startswith("time/")},
            "tensors": {"actions": r.actions, "mask": r.mask, "logprobs": r.logprobs, "values": r.values,
                        "rewards": r.rewards, "ref_logprobs": r.ref_logprobs, "scores": r.scores,
                        "input_ids": r.context["input_ids"], "attention_mask": r.context["attention_mask"],
                        "finished": col.samples.finished, **{f"part/{k}": v for k, v in col.parts.items()}}}


if __name__ == "__main__":
    torch.set_num_threads(1)
    world = dist.init_from_env()
    torch.save(run(sys.argv[1], world, *sys.argv[3:5]), f"{sys.argv[2]}.{world.rank}.pt")
    dist.shutdown()
