"""The run scaffold every trainer uses, and the one guarded optimizer step: on a linear model, so
each behaviour is checked on its own (the trainers' tests check them inside real runs)."""
import dataclasses
import math
import os
import signal

import pytest
import torch

from fourfold.config import RunConfig
from fourfold.errors import NonFiniteError
from fourfold.reporting import read_metrics
from fourfold.run.optim import NonFiniteGuard, guarded_step, make_optimizer, make_schedule
from fourfold.run.scaffold import RunScaffold


@dataclasses.dataclass
class _Cfg:
    run: RunConfig


def _cfg(out, **run) -> _Cfg:
    return _Cfg(RunConfig(output_dir=str(out), progress=False, tensorboard=False, **run))


def _model():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = make_optimizer(model.parameters(), lr=0.1)
    return model, opt, make_schedule(opt, total_steps=10)


def _loss(model, scale=1.0):
    return model(torch.ones(2, 3)).pow(2).mean() * scale


# ---- guarded_step ------------------------------------------------------------------------------


def test_guarded_step_takes_a_finite_step():
    model, opt, sched = _model()
    before = model.weight.detach().clone()
    guard = NonFiniteGuard()
    norm, taken = guarded_step(model, opt, sched, 1.0, guard, "step 1", [(_loss(model), {"loss": torch.tensor(1.0)})])
    assert taken and math.isfinite(norm) and norm > 0
    assert not torch.equal(before, model.weight) and sched.last_epoch == 1 and guard.total == 0


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_a_non_finite_check_skips_the_step_and_stops_at_the_first_bad_quantity():
    model, opt, sched = _model()
    before = model.weight.detach().clone()
    guard = NonFiniteGuard()
    checks = {"score": torch.tensor([1.0, float("nan")]), "loss": torch.tensor(float("inf"))}
    norm, taken = guarded_step(model, opt, sched, 1.0, guard, "step 1", [(_loss(model), checks)])
    assert norm is None and not taken
    assert torch.equal(before, model.weight) and all(p.grad is None for p in model.parameters())
    assert sched.last_epoch == 1  # the schedule still counts the step
    assert [(e["quantity"], e["where"]) for e in guard.events] == [("score", "step 1")]  # loss never asked
    assert guard.consecutive == 1  # resetting it is the caller's


def test_skipped_micro_batches_are_never_computed_and_ppo_keeps_its_schedule():
    model, opt, sched = _model()
    guard = NonFiniteGuard()
    computed = []

    def micro():
        for i, value in enumerate([1.0, float("nan"), 1.0]):
            computed.append(i)
            yield _loss(model, 0.5), {"policy_loss": torch.tensor(value)}

    norm, taken = guarded_step(model, opt, sched, 1.0, guard, "mb", micro(), schedule_on_skip=False)
    assert norm is None and not taken and computed == [0, 1]
    assert sched.last_epoch == 0 and all(p.grad is None for p in model.parameters())


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_a_non_finite_gradient_norm_skips_the_update():
    model, opt, sched = _model()
    before = model.weight.detach().clone()
    guard = NonFiniteGuard()
    norm, taken = guarded_step(model, opt, sched, 1.0, guard, "g", [(_loss(model, float("inf")), {})])
    assert not taken and not math.isfinite(norm)
    assert torch.equal(before, model.weight) and sched.last_epoch == 1
    assert guard.events[-1]["quantity"] == "grad_norm"


# ---- RunScaffold -------------------------------------------------------------------------------


def test_scaffold_seeds_first_and_writes_the_config(tmp_path):
    torch.manual_seed(123)
    run = RunScaffold(_cfg(tmp_path / "a", seed=7))
    drawn = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.rand(3))
    assert (tmp_path / "a" / "config.yaml").is_file() and "seed: 7" in (tmp_path / "a" / "config.yaml").read_text()
    assert (run.rank, run.world_size, run.is_main) == (0, 1, True)
    assert run.resume() is None and run.resumed_step is None


def test_checkpoints_when_due_and_resumes_into_the_tracked_objects(tmp_path):
    run = RunScaffold(_cfg(tmp_path, save_every=2))
    model, opt, sched = _model()
    run.track(modules={"m": model}, optimizers={"m": opt}, schedulers={"m": sched},
              state=lambda step: {"step": step, "nonfinite_total": run.guard.total})
    with run.loop(total=3, desc="t", key_metrics=()) as logger:
        for step in (1, 2, 3):
            logger.log(step, {"x": step})
            run.checkpoint_if_due(step, final=step == 3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002", "step-00000003"]

    again = RunScaffold(_cfg(tmp_path, resume=True))
    fresh, fresh_opt, fresh_sched = _model()
    with torch.no_grad():
        fresh.weight.zero_()
    again.track(modules={"m": fresh}, optimizers={"m": fresh_opt}, schedulers={"m": fresh_sched}, state=dict)
    assert again.resume() == {"step": 3, "nonfinite_total": 0}
    assert again.resumed_step == 3 and torch.equal(fresh.weight, model.weight)
    with again.loop(total=3, desc="t", key_metrics=()):
        pass
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]  # kept up to the resumed step


def test_stop_signal_checkpoints_then_interrupts_and_handlers_come_back(tmp_path):
    run = RunScaffold(_cfg(tmp_path))
    model, opt, sched = _model()
    run.track(modules={"m": model}, optimizers={"m": opt}, state=lambda step: {"step": step})
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with run.loop(total=5, desc="t", key_metrics=()):
            run.checkpoint_if_due(1)  # save_every=0: nothing due
            assert not (tmp_path / "checkpoints").exists()
            os.kill(os.getpid(), signal.SIGTERM)
            run.checkpoint_if_due(2)
    assert signal.getsignal(signal.SIGTERM) is before
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]


def test_stuck_run_saves_the_last_good_state_then_raises(tmp_path):
    run = RunScaffold(_cfg(tmp_path, max_consecutive_skips=2))
    model, opt, _ = _model()
    run.track(modules={"m": model}, optimizers={"m": opt}, state=lambda step: {"step": step})
    with run.loop(total=5, desc="t", key_metrics=()):
        run.guard.ok("loss", float("nan"), "step 1")
        run.log_skips(1)
        run.stop_if_stuck(1)  # one skip: carry on
        run.guard.ok("loss", float("nan"), "step 2")
        with pytest.raises(NonFiniteError, match="2 consecutive"):
            run.stop_if_stuck(1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000001"]
    events = read_metrics(tmp_path / "events.jsonl")
    assert [(e["kind"], e["step"], e["where"]) for e in events] == [("nonfinite_skip", 1, "step 1")]
