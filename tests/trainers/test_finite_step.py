"""The optimizer step that never leaves a NaN/Inf weight: the Adam bound behind its no-copy fast
path, the undo of an overflowing step, identical results for ordinary steps, and a whole run
with a learning rate that overflows float32 saving only finite weights."""
import copy

import pytest
import safetensors.torch
import torch

from fourfold.checkpoint import latest_checkpoint
from fourfold.config import SFTConfig, load_config
from fourfold.errors import NonFiniteError
from fourfold.reporting import read_metrics
from fourfold.run.finite_step import adam_update_bound, finite_step, may_overflow
from fourfold.run.optim import NonFiniteGuard, guarded_step, make_optimizer


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _backward(model, scale=1.0):
    x = torch.randn(16, 4)
    (model(x).pow(2).mean() * scale).backward()


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.9, 0.95), (0.0, 0.99), (0.5, 0.3)])
def test_adam_updates_stay_within_the_bound(betas):
    """Adversarial gradients (long quiet stretches, then spikes of either sign) never push one
    Adam update beyond lr * bound: the fact the no-copy path rests on."""
    bound = adam_update_bound(betas)
    p = torch.nn.Parameter(torch.zeros(64))
    opt = torch.optim.Adam([p], lr=1.0, betas=betas, eps=0.0)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for t in range(300):
        before = p.detach().clone()
        quiet = t % 50 < 45
        p.grad = torch.randn(64, generator=g) * (1e-6 if quiet else 1e3) * (1 if t % 7 else -1)
        opt.step()
        worst = max(worst, float((p.detach() - before).abs().max()))
    assert worst <= bound * (1 + 1e-5)


def test_no_bound_without_beta1_squared_below_beta2():
    assert adam_update_bound((0.9, 0.5)) is None
    assert adam_update_bound((0.9, 0.999)) == pytest.approx(72.7, abs=0.1)


def test_ordinary_steps_are_identical_and_keep_no_copy(monkeypatch):
    a, b = _model(), _model()
    opt_a, opt_b = make_optimizer(a.parameters(), 1e-3, 0.01), make_optimizer(b.parameters(), 1e-3, 0.01)
    copies = []
    real_deepcopy = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda x, *r: copies.append(x) or real_deepcopy(x, *r))
    for step in range(5):
        torch.manual_seed(step)
        _backward(a)
        torch.manual_seed(step)
        _backward(b)
        groups = [[p for p in g["params"] if p.grad is not None] for g in opt_a.param_groups]
        assert not may_overflow(opt_a, groups)
        assert finite_step(opt_a) is True
        opt_b.step()
        opt_a.zero_grad(set_to_none=True)
        opt_b.zero_grad(set_to_none=True)
    assert copies == []
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    sa, sb = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


def test_an_overflowing_step_is_undone_with_its_optimizer_state():
    model = _model()
    opt = make_optimizer(model.parameters(), 1e-3)
    _backward(model)
    opt.step()  # some optimizer state to restore
    opt.zero_grad()
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(opt.state_dict())
    for g in opt.param_groups:
        g["lr"] = 1e39  # finite as a Python float, overflows every float32 weight
    _backward(model)
    assert finite_step(opt) is False
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    after = opt.state_dict()["state"]
    assert all(torch.equal(state["state"][i][k], after[i][k]) for i in after for k in after[i])


def test_other_optimizers_always_keep_a_copy():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e39)
    _backward(model)
    groups = [[p for p in g["params"] if p.grad is not None] for g in opt.param_groups]
    assert may_overflow(opt, groups)
    before = copy.deepcopy(model.state_dict())
    assert finite_step(opt) is False
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_guarded_step_counts_the_undone_step_as_a_parameters_skip():
    model = _model()
    opt = make_optimizer(model.parameters(), 1e39)
    guard = NonFiniteGuard()
    x = torch.randn(16, 4)
    loss = model(x).pow(2).mean()
    norm, taken = guarded_step(model, opt, None, 1.0, guard, "step 1", [(loss, {"loss": loss.detach()})])
    assert norm is not None and not taken
    assert guard.total == 1 and guard.events[-1]["quantity"] == "parameters"
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_no_copy_and_a_non_finite_result_stops_before_saving(monkeypatch):
    from fourfold.run import finite_step as fs

    model = _model()
    opt = make_optimizer(model.parameters(), 1e39)
    _backward(model)
    monkeypatch.setattr(fs, "may_overflow", lambda *a: False)  # a bound that would have been wrong
    with pytest.raises(NonFiniteError, match="non-finite weights"):
        fs.finite_step(opt)


def test_sft_with_an_overflowing_learning_rate_saves_only_finite_weights(tmp_path):
    """lr=1e39 passes validation (finite) but overflows float32: every step is undone and counted;
    after run.max_consecutive_skips the run stops with a checkpoint of the (finite) last good state."""
    from fourfold.tasks.tokenizer import build_word_tokenizer
    from fourfold.trainers import sft

    build_word_tokenizer([f"w{i}" for i in range(8)], tmp_path / "tok")
    (tmp_path / "t.jsonl").write_text('{"prompt": "w1", "completion": "w2 w3"}\n' * 4)
    cfg = load_config(SFTConfig, None, [
        "model.from_scratch=true", f"model.tokenizer={tmp_path / 'tok'}", "model.hidden_size=8", "model.num_layers=1",
        "model.num_heads=2", "model.max_positions=16", f"data.train={tmp_path / 't.jsonl'}", "train.batch_size=2",
        "train.max_len=16", "train.max_steps=5", "train.lr=1e39", f"run.output_dir={tmp_path / 'run'}",
        "run.progress=false", "run.tensorboard=false", "run.device=cpu", "run.max_consecutive_skips=2"])
    with pytest.raises(NonFiniteError, match="2 consecutive non-finite updates.*parameters at step 2"):
        sft.train(cfg)
    ckpt = latest_checkpoint(tmp_path / "run")
    weights = safetensors.torch.load_file(str(ckpt / "modules" / "model.safetensors"))
    assert weights and all(bool(torch.isfinite(w).all()) for w in weights.values())
    events = [e for e in read_metrics(tmp_path / "run" / "events.jsonl") if e["kind"] == "nonfinite_skip"]
    assert [e["quantity"] for e in events] == ["parameters", "parameters"]


@pytest.mark.parametrize("kind", ["fused", "foreach", "for-loop"])
def test_adam_kernels_that_refuse_the_learning_rate_are_undone_too(kind):
    """The foreach and for-loop kernels raise half-way through a step whose lr the dtype cannot
    hold (the fused one writes inf): either way the step is undone, state included."""
    model = _model()
    flags = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for-loop": dict(foreach=False)}[kind]
    opt = torch.optim.AdamW(model.parameters(), lr=1e39, **flags)
    _backward(model)
    before = copy.deepcopy(model.state_dict())
    assert finite_step(opt) is False
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(not s for s in opt.state.values())  # the half-made first step left no state behind
