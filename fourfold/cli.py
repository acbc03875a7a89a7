"""The one command-line entry point: ``fourfold <stage> [--config FILE] [key=value ...]``.

Every stage takes a YAML config and dotted overrides (``ppo.kl_coef=0.02``); see
``fourfold.config`` for the convention. Errors fourfold raises on purpose (bad config, bad data,
a model that cannot be loaded) print one line and exit with status 2. ``fourfold <stage> --help``
lists every config key of the stage (:class:`StageParser`); ``--print-config`` prints the resolved
config as YAML, a file ``--config`` reads back unchanged.

Under ``torchrun`` (``torchrun --nproc-per-node N -m fourfold.cli sft --config CFG``) every rank
runs the same stage; such an error is printed by rank 0 alone (every rank meets the same ones:
an environment's error on one rank is raised on every rank, :func:`fourfold.dist.raise_first_error`,
with the user's traceback under rank 0's line), except that a rank whose peer died says so itself
(:class:`fourfold.dist.PeerLostError`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Callable, Sequence

from fourfold import __version__, dist
from fourfold.config.stages import STAGES, rollout_stages
from fourfold.errors import FourfoldError, user_traceback


def _print_user_traceback(error: BaseException) -> None:
    """Under a UserCodeError's line, the traceback of the user's code (nothing for another error)."""
    print(user_traceback(error), end="", file=sys.stderr)


def _resolve(spec: str) -> Callable:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def task_inputs(stage: str, cfg) -> dict:
    """The trainer arguments a language-model RL config's ``data.task`` names: the task's gold-reward
    probe and, when ``data.prompts`` is null, its prompts (the trainers never see the task)."""
    batch_key = STAGES[stage].rollout_batch
    if batch_key is None or cfg.data.task is None:
        return {}
    from fourfold.tasks import get_task, task_probe, task_prompts

    task = get_task(cfg.data.task, options_key="data.task_options", **cfg.data.task_options)
    inputs = {"probe": task_probe(task)}
    if cfg.data.prompts is None:
        section, _, key = batch_key.partition(".")
        inputs["prompts"] = task_prompts(task, getattr(getattr(cfg, section), key), cfg.run.seed)
    return inputs


ESTIMATE_HELP = "memory per device of a PPO or REINFORCE config, before anything is loaded"


def _add_estimate_parser(sub) -> None:
    p = sub.add_parser("estimate", help=ESTIMATE_HELP, description=ESTIMATE_HELP + " (config.json files only)")
    p.add_argument("--config", "-c", help="YAML config file of a ppo or reinforce run")
    p.add_argument("--stage", dest="config_stage", choices=rollout_stages(),
                   help="the config's stage (default: reinforce when the file has a reinforce section, else ppo)")
    p.add_argument("--nproc", type=int, default=1, help="devices the run is spread over (FSDP)")
    p.add_argument("--json", action="store_true", help="print the estimate as one JSON object")
    p.add_argument("--device-memory", type=float, metavar="GiB",
                   help="memory of one device, for the fits line (default: the CUDA device when there is one)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. ppo.rollout_batch_size=32")


SERVE_REWARD_HELP = "serve a reward model or a reward function over HTTP (for model.reward_url)"


def _add_serve_reward_parser(sub) -> None:
    p = sub.add_parser("serve-reward", help=SERVE_REWARD_HELP,
                       description=SERVE_REWARD_HELP + "; the protocol: docs/rewards.md. Stops on Ctrl-C or SIGTERM.")
    p.add_argument("--model", metavar="DIR", help="a reward-model directory (`fourfold reward`'s model/, or its "
                                           "LoRA model-adapter/)")
    p.add_argument("--fn", metavar="FILE.py:NAME", help="a reward function (file.py:name or module:name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; the server has no "
                                                       "authentication)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free one, the ready line says which)")
    p.add_argument("--batch-size", type=int, default=512, help="most rows scored in one batch (default 512)")
    p.add_argument("--max-wait-ms", type=float, default=10.0,
                   help="how long a batch waits for more concurrent requests after its first (default 10)")
    p.add_argument("--request-timeout-s", type=float, default=600.0, help="most seconds a request waits for its scores")
    p.add_argument("--device", default="cpu", help="device of the reward model (cpu, cuda, cuda:1)")
    p.add_argument("--dtype", default="float32", help="dtype of the reward model (float32, bfloat16, float16)")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer directory (default: the model's own)")
    p.add_argument("--max-len", type=int, default=512, help="most tokens of prompt + response")
    p.add_argument("--config", "-c", metavar="FILE", help="YAML file with a model section: `fourfold score`'s "
                                                         "scorer keys (reward, reward_fns, reward_weight, ...)")
    p.add_argument("overrides", nargs="*", metavar="model.key=value",
                   help="the scorer's keys, as `fourfold score`'s model section: e.g. "
                        "'model.reward_fns=[{fn: a.py:good, weight: 1.0}]' (weighted parts; with --model, --fn)")


def serve_reward(args) -> int:
    """``fourfold serve-reward``: :func:`fourfold.apps.reward_server.serve` with the command's flags."""
    from fourfold.apps.reward_server import serve
    from fourfold.errors import ConfigError

    bad = [o for o in args.overrides if not o.startswith("model.")]
    if bad:
        raise ConfigError(f"unexpected arguments {' '.join(bad)} (serve-reward takes flags and model.* keys)")
    return serve(model=args.model, fn=args.fn, host=args.host, port=args.port, batch_size=args.batch_size,
                 max_wait_ms=args.max_wait_ms, request_timeout_s=args.request_timeout_s, device=args.device,
                 dtype=args.dtype, tokenizer=args.tokenizer, max_len=args.max_len, config=args.config,
                 overrides=args.overrides)


def _estimate_stage(args) -> str:
    if args.config_stage:
        return args.config_stage
    if args.config:
        import yaml

        try:
            with open(args.config, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            return "ppo"  # load_config reports the problem with the file
        if isinstance(data, dict) and "reinforce" in data:
            return "reinforce"
    return "ppo"


def _device_capacity(device_memory_gib) -> tuple:
    """(bytes, name) of the device the fits line speaks of: --device-memory, else CUDA device 0."""
    if device_memory_gib is not None:
        return int(device_memory_gib * 2**30), "device"
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0)
    return None, "device"


def estimate(args) -> int:
    """``fourfold estimate``: the memory estimate of a config, as a table or (``--json``) one object."""
    stage = _estimate_stage(args)
    from fourfold.config import load_config
    from fourfold.models.estimate.from_config import estimate_config

    cfg = load_config(_resolve(STAGES[stage].config), args.config, list(args.overrides))
    est = estimate_config(stage, cfg, args.nproc)
    if args.json:
        print(json.dumps(est.to_json()))
    else:
        print(est.table(*_device_capacity(args.device_memory)))
        note = _bf16_note(cfg)
        if note is not None:
            print(f"fourfold estimate: warning: {note}")
    return 0


def _bf16_note(cfg):
    """The run's bf16-on-a-CPU-without-bf16 warning when it would run on this machine's CPU
    (``run.device`` cpu, or auto without CUDA): what the trainers say at their start."""
    import torch

    from fourfold.run.common import bf16_cpu_warning

    device = getattr(getattr(cfg, "run", None), "device", "cpu")
    if device not in ("cpu", "auto") or (device == "auto" and torch.cuda.is_available()):
        return None
    return bf16_cpu_warning(cfg, torch.device("cpu"))


class StageParser(argparse.ArgumentParser):
    """A stage's parser: its ``--help`` ends with every config key of the stage (and of each
    ``--task`` world), from the config classes' own docs (:func:`fourfold.config.keys.keys_help`),
    built only when the help is shown."""

    def __init__(self, *args, stage=None, **kwargs):
        super().__init__(*args, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        self.stage = stage

    def format_help(self) -> str:
        text = super().format_help()
        if self.stage is None:
            return text
        from fourfold.config.keys import keys_help

        worlds = [(None, self.stage.config), *((task, config) for task, config, _ in self.stage.tasks)]
        for task, config in worlds:
            title = "config keys" + (f" with --task {task}" if task else "")
            text += "\n" + keys_help(_resolve(config), title=title) + "\n"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fourfold", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fourfold {__version__}")
    sub = parser.add_subparsers(dest="stage", metavar="STAGE", parser_class=StageParser)
    _add_estimate_parser(sub)
    _add_serve_reward_parser(sub)
    from fourfold.apps import new_model

    new_model.add_parser(sub)
    for name, stage in STAGES.items():
        p = sub.add_parser(name, help=stage.help, description=stage.help, stage=stage)
        p.add_argument("--config", "-c", help="YAML config file")
        p.add_argument("--print-config", action="store_true",
                       help="print the resolved config (file, overrides, flags) as YAML and exit: a --config file")
        p.add_argument("--output-dir", help="shorthand for run.output_dir=DIR (the path as typed, never read as YAML)")
        p.add_argument("--seed", type=int, help="shorthand for run.seed=N")
        p.add_argument("--resume", action="store_true", help="shorthand for run.resume=true")
        if stage.run_dir:
            p.add_argument("--overwrite", action="store_true",
                           help="shorthand for run.overwrite=true: replace the run already in the output directory")
        if stage.tasks:
            p.add_argument("--task", choices=[stage.task, *(t for t, _, _ in stage.tasks)], default=stage.task,
                           help=f"the embedded world (default {stage.task})")
        if stage.cache:
            p.add_argument("--quick", action="store_true", help="a short budget for tests and a first look")
            p.add_argument("--fresh", action="store_true", help="ignore cached stage outputs and rerun all")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. ppo.kl_coef=0.02")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser``'s arguments, ``key=value`` overrides anywhere among the options: ``fourfold sft
    --config c.yaml train.lr=1e-4 --output-dir d train.max_steps=2`` takes both overrides, in the
    order given (argparse alone keeps the first run of positionals and refuses the rest). An
    unknown option is still refused (``unrecognized arguments``)."""
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if rest:
        args.overrides = [*getattr(args, "overrides", []), *rest]
    return args


def print_config(cfg) -> int:
    """``--print-config``: the resolved config as YAML on stdout (``--config`` reads it back)."""
    from fourfold.config.loader import config_yaml

    print(config_yaml(cfg), end="")
    return 0


def interrupted_line(stage: str, error: BaseException, cfg, argv: Sequence[str] | None) -> str:
    """What an interrupted (Ctrl-C, SIGTERM) run says: the checkpoint it kept and the command that
    continues it (``fourfold <the same arguments> --resume``), or that there is none yet; the demo
    continues by rerunning the same command (its finished stages are cached, the running one resumes)."""
    import shlex
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    spec = STAGES[stage]
    if spec.cache:
        return f"interrupted; rerun the same command to continue (what finished is cached, the run that was going " \
               f"resumes from its last checkpoint): {shlex.join(['fourfold', *args])}"
    if not spec.run_dir or cfg is None:
        return "interrupted"
    ckpt = getattr(error, "checkpoint", None)
    if ckpt is None:
        from fourfold.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(Path(cfg.run.output_dir))
    if ckpt is None:
        again = args if "--overwrite" in args else [*args, "--overwrite"]
        return f"interrupted before its first checkpoint (nothing to resume); start it again with: " \
               f"{shlex.join(['fourfold', *again])}"
    step = getattr(error, "step", None)
    at = f" after step {step}" if step is not None else ""
    resume = args if "--resume" in args or "run.resume=true" in args else [*args, "--resume"]
    return f"interrupted{at}; kept checkpoint {ckpt}; continue with: {shlex.join(['fourfold', *resume])}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if not args.stage:
        parser.print_help()
        return 2
    if args.stage == "estimate":
        try:
            return estimate(args)
        except (FourfoldError, ValueError, OSError) as e:
            print(f"fourfold estimate: error: {e}", file=sys.stderr)
            return 2
    if args.stage == "serve-reward":
        try:
            return serve_reward(args)
        except FourfoldError as e:
            print(f"fourfold serve-reward: error: {e}", file=sys.stderr)
            _print_user_traceback(e)
            return 2
    if args.stage == "new-model":
        from fourfold.apps import new_model

        try:
            return new_model.main(args)
        except FourfoldError as e:
            print(f"fourfold new-model: error: {e}", file=sys.stderr)
            return 2
    stage = STAGES[args.stage].for_task(getattr(args, "task", None))
    overrides = list(args.overrides)
    settings = {"run.output_dir": args.output_dir} if args.output_dir else {}  # a path: as typed, never YAML
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    if args.resume:
        overrides.append("run.resume=true")
    if getattr(args, "overwrite", False):
        overrides.append("run.overwrite=true")
    if getattr(args, "quick", False):
        overrides.insert(0, "quick=true")
    if getattr(args, "fresh", False):
        overrides.append("fresh=true")
    finished, together, cfg = False, False, None
    try:
        from fourfold.config import load_config

        cfg = load_config(_resolve(stage.config), args.config, overrides, settings=settings)
        if args.print_config:
            return print_config(cfg)
        if stage.rollout_batch and dist.rank_from_env() == 0:  # rank 0 alone under torchrun
            from fourfold.models.estimate.from_config import estimate_line

            print(f"fourfold {args.stage}: {estimate_line(args.stage, cfg, dist.world_size_from_env())}", flush=True)
        _resolve(stage.run)(cfg, **task_inputs(args.stage, cfg))
        finished = True
    except FourfoldError as e:
        if dist.world().is_main or isinstance(e, dist.PeerLostError):
            print(f"fourfold {args.stage}: error: {e}", file=sys.stderr, flush=True)
            _print_user_traceback(e)
        together = dist.raised_on_every_rank(e)  # every rank alive: none exits before rank 0 has said it
        return 2
    except KeyboardInterrupt as e:
        if dist.world().is_main:  # how the run stopped, on stdout with the rest of what it said
            print(f"fourfold {args.stage}: {interrupted_line(args.stage, e, cfg, argv)}", flush=True)
        return 130
    except Exception as e:
        if not dist.is_peer_failure(e):
            raise
        w = dist.world()
        print(f"fourfold {args.stage}: error: rank {w.rank} of {w.world_size}: another rank of this run is gone "
              "(killed or crashed; torchrun names it), so this one stops", file=sys.stderr)
        return 2
    finally:
        dist.shutdown(sync=finished, settle=together)
    return 0


if __name__ == "__main__":
    sys.exit(main())
