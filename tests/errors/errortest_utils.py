"""Helpers of the error-case tests: the CLI run in-process with the check that a failure is exactly
one line on stderr (no traceback), and argument lists of tiny runs over the ``zoo`` fixture."""
import shutil
from pathlib import Path

from fourfold.cli import main

WORDS = [f"w{i}" for i in range(20)]


def copy_model(src: str, dst: Path) -> Path:
    """A copy of the model directory ``src`` at ``dst`` (to damage without touching the zoo)."""
    shutil.copytree(src, dst)
    return dst


RUN = ["run.device=cpu", "run.progress=false", "run.tensorboard=false", "run.threads=1"]


def ppo_args(zoo, out, *extra) -> list[str]:
    """A one-iteration PPO run over the zoo's models (``extra`` overrides come last)."""
    return ["ppo", f"model.policy={zoo['lm']}", f"model.reward={zoo['rm']}", f"data.prompts={zoo['prompts']}",
            "ppo.iterations=1", "ppo.rollout_batch_size=2", "ppo.minibatch_size=2", "ppo.ppo_epochs=1",
            "generation.max_new_tokens=3", f"run.output_dir={out}", *RUN, *extra]


def reinforce_args(zoo, out, *extra) -> list[str]:
    """A one-iteration REINFORCE run over the zoo's policy (give ``model.reward`` or ``model.reward_fn``)."""
    return ["reinforce", f"model.policy={zoo['lm']}", f"data.prompts={zoo['prompts']}", "reinforce.iterations=1",
            "reinforce.rollout_batch_size=2", "generation.max_new_tokens=3", f"run.output_dir={out}", *RUN, *extra]


def sft_args(zoo, out, *extra) -> list[str]:
    """A two-step SFT run from the zoo's causal LM."""
    return ["sft", f"model.path={zoo['lm']}", f"data.train={zoo['sft']}", "train.max_steps=2", "train.batch_size=2",
            "train.max_len=16", "train.log_every=1", f"run.output_dir={out}", *RUN, *extra]


def reward_args(zoo, out, *extra) -> list[str]:
    """A two-step reward-model run from the zoo's reward model."""
    return ["reward", f"model.path={zoo['rm']}", f"data.train={zoo['prefs']}", "data.eval_fraction=0",
            "train.max_steps=2", "train.batch_size=2", "train.max_len=16", "train.log_every=1",
            f"run.output_dir={out}", *RUN, *extra]


def cli_output(capsys, argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``fourfold argv`` run in this process: stdout what the run says
    (its lines, warnings, the summary), stderr its error alone."""
    capsys.readouterr()  # what the test printed before (a progress bar of save_pretrained) is not the run's
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli(capsys, argv) -> tuple[int, str]:
    """(exit code, stderr) of ``fourfold argv`` run in this process."""
    code, _, err = cli_output(capsys, argv)
    return code, err


def one_line_error(capsys, argv, *needles) -> str:
    """Run the CLI; assert exit code 2 and exactly one stderr line, the error, holding every needle."""
    code, err = cli(capsys, argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"fourfold {argv[0]}: error: "), err
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]
