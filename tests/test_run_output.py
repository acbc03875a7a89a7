"""What a run shows and sends beside metrics.jsonl: plain console lines off a terminal, the final
summary line, samples.jsonl, TensorBoard text and the W&B sink (a fake wandb module here; the real
one in offline mode is in tests/trainers/test_trainer_output.py)."""
import dataclasses
import json
import re
import sys
import types

import pytest

from fourfold import reporting
from fourfold.config import RunConfig
from fourfold.errors import ConfigError
from fourfold.reporting import MetricsLogger, read_metrics
from fourfold.run.scaffold import RunScaffold
from fourfold.sinks import WandbSink, done_line, fmt_duration, fmt_number, open_sinks, require_sinks, samples_markdown

ROWS = [{"reward/score_mean": 0.123456789, "kl/k1": float("nan"), "policy/loss": 3.0},
        {"reward/score_mean": -12345.678, "kl/k1": 2e-7, "policy/loss": 3.0},
        {"reward/score_mean": 7, "policy/loss": 3.0}]


def _log_three(run_dir, **kw):
    with MetricsLogger(run_dir, total=3, desc="ppo", key_metrics=("reward/score_mean", "kl/k1"), **kw) as lg:
        for step, row in enumerate(ROWS, start=1):
            lg.log(step, row)


def test_one_plain_rounded_line_per_row_when_stdout_is_not_a_terminal(tmp_path, capsys):
    _log_three(tmp_path, tensorboard=False)  # progress=True; capsys is not a terminal
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    lines = out.splitlines()
    assert [re.sub(r" \([^)]*\)$", "", line) for line in lines] == [
        "ppo 1/3: reward/score_mean=0.1235 kl/k1=nan",
        "ppo 2/3: reward/score_mean=-1.235e+04 kl/k1=2e-07",
        "ppo 3/3: reward/score_mean=7",
    ]
    assert all(re.search(r" \(\d[\d.e-]* s(, about \d[\d.e-]* (s|min|h) left)?\)$", line) for line in lines)  # elapsed, rounded
    assert "left)" in lines[0] and "left" not in lines[-1]  # the time left while steps remain
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3  # the file keeps full precision
    assert read_metrics(tmp_path / "metrics.jsonl")[0]["reward/score_mean"] == 0.123456789


def test_no_lines_with_progress_off_and_no_plain_lines_under_the_bar(tmp_path, capsys, monkeypatch):
    _log_three(tmp_path / "off", tensorboard=False, progress=False)
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(reporting, "_stdout_is_tty", lambda: True)  # a terminal: the rich bar instead
    _log_three(tmp_path / "tty", tensorboard=False)
    assert "ppo 1/3:" not in capsys.readouterr().out


def test_console_number_and_duration_formats():
    assert [fmt_number(v) for v in (0.000123456, 123456.7, 12, None, True, float("inf"))] == [
        "0.0001235", "1.235e+05", "12", "nan", "True", "inf"]
    assert [fmt_duration(s) for s in (0.0412, 4.16, 12.4, 192, 5400)] == ["0.041 s", "4.2 s", "12 s", "3.2 min", "1.5 h"]
    assert done_line("ppo", 192, {"model": "runs/x/policy", "metrics": "runs/x/metrics.jsonl"}) == (
        "fourfold ppo: done in 3.2 min: model runs/x/policy, metrics runs/x/metrics.jsonl")


@dataclasses.dataclass
class _Cfg:
    run: RunConfig


def test_the_summary_line_names_what_the_run_wrote(tmp_path, capsys):
    run = RunScaffold(_Cfg(RunConfig(output_dir=str(tmp_path), progress=False, tensorboard=False)))
    run.track(modules={}, optimizers={}, state=lambda step: {})
    with run.loop(total=2, desc="t", key_metrics=()) as logger:
        logger.log(1, {"x": 1.0})
        run.save(1)
    run.stage = "sft"  # a stage's config class names it; this test's own config class is no stage's
    assert run.finish({"x": 1}, model=tmp_path / "model") == {"x": 1}
    line = capsys.readouterr().out.strip()
    head, _, where = line.partition(" s: ")
    assert re.fullmatch(r"fourfold sft: done in [\d.]+", head), line
    assert where == (f"model {tmp_path}/model, metrics {tmp_path}/metrics.jsonl, checkpoints {tmp_path}/checkpoints, "
                     "last checkpoint step-00000001 (--resume with more steps extends the run from it)")
    assert run.samples_due(10, 25) and run.samples_due(25, 25) and not run.samples_due(11, 25)
    run.run_cfg.samples_every = 0
    assert not run.samples_due(25, 25)


def test_samples_jsonl_tensorboard_text_and_resume(tmp_path):
    rows = [{"prompt": "w1 | w2", "response": "w3\nw4", "score": 0.5, "gold": None}]
    with MetricsLogger(tmp_path, progress=False, tensorboard=False) as lg:
        lg.log(1, {"x": 1.0})
        assert not (tmp_path / "samples.jsonl").exists()  # only a run that logs samples has the file
        for step in (1, 2, 3):
            lg.samples(step, rows)
    got = read_metrics(tmp_path / "samples.jsonl")
    assert [r["step"] for r in got] == [1, 2, 3] and got[0] == {"step": 1, **rows[0]}
    with MetricsLogger(tmp_path, progress=False, tensorboard=False, resume_step=2):
        pass
    assert [r["step"] for r in read_metrics(tmp_path / "samples.jsonl")] == [1, 2]  # cut back like metrics
    with MetricsLogger(tmp_path, progress=False, tensorboard=False):
        pass
    assert read_metrics(tmp_path / "samples.jsonl") == []  # a fresh start empties it
    table = samples_markdown(rows)
    assert table.splitlines() == ["| prompt | response | score | gold |", "|---|---|---|---|",
                                  "| w1 \\| w2 | w3 w4 | 0.5 | nan |"]


def test_tensorboard_gets_scalars_and_the_samples_text(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, progress=False) as lg:
        lg.log(1, {"reward/score_mean": 0.5})
        lg.samples(1, [{"prompt": "p", "response": "r", "score": 0.5}])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward/score_mean")] == [0.5]
    (text,) = acc.Tensors("samples/text_summary")
    assert b"| p | r | 0.5 |" in text.tensor_proto.string_val[0]


def test_missing_tensorboard_is_a_one_line_warning(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with MetricsLogger(tmp_path, progress=False, stage="sft") as lg:
        lg.log(1, {"x": 1.0})
    out, err = capsys.readouterr()
    assert err == "" and out.count("\n") == 1 and out.startswith("fourfold sft: warning: TensorBoard disabled"), out
    assert lg.tensorboard_dir is None and not (tmp_path / "tensorboard").exists()
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 1


class _FakeWandb(types.ModuleType):
    """Records what the sink sends: init kwargs, logged dicts, tables, finish."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []

    def init(self, **kw):
        self.calls.append(("init", kw))
        fake = self

        class Run:
            def log(self, data, step):
                fake.calls.append(("log", step, data))

            def finish(self):
                fake.calls.append(("finish",))

        return Run()

    def Table(self, columns, data):  # noqa: N802 (wandb's name)
        return ("table", columns, data)


def test_wandb_sink_contract_with_a_fake_module(tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    require_sinks(["tensorboard", "wandb"])
    (sink,) = open_sinks(["wandb"], tmp_path / "myrun", config={"run": {"seed": 3}})
    assert isinstance(sink, WandbSink) and open_sinks(["tensorboard"], tmp_path, config=None) == []
    with MetricsLogger(tmp_path / "myrun", progress=False, tensorboard=False, sinks=[sink]) as lg:
        lg.log(1, {"a/b": 1.5, "bad": float("nan")})
        lg.samples(1, [{"prompt": "p", "response": "r", "score": 0.25, "gold": 1.0}])
    assert fake.calls[0] == ("init", {"project": "fourfold", "name": "myrun", "dir": str(tmp_path / "myrun"),
                                      "config": {"run": {"seed": 3}}})
    assert fake.calls[1:] == [("log", 1, {"a/b": 1.5}),  # nulls (NaN/inf) are left out
                              ("log", 1, {"samples": ("table", ["prompt", "response", "score", "gold"],
                                                      [["p", "r", 0.25, 1.0]])}),
                              ("finish",)]


def test_wandb_requested_but_not_installed_is_a_one_line_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError) as e:
        RunScaffold(_Cfg(RunConfig(output_dir=str(tmp_path / "r"), report_to=["wandb"])))
    assert str(e.value) == "run.report_to: 'wandb' needs the wandb package: pip install 'fourfold[wandb]'"
    assert not (tmp_path / "r").exists()  # before anything is written
    require_sinks(["tensorboard"])  # only what is asked for is checked


def test_report_to_and_samples_every_are_validated():
    RunConfig(report_to=["tensorboard", "wandb"]).validate()
    with pytest.raises(ConfigError, match=r"run.report_to: unknown sink 'mlflow'"):
        RunConfig(report_to=["mlflow"]).validate()
    with pytest.raises(ConfigError, match=r"run.samples_every: must be >= 0"):
        RunConfig(samples_every=-1).validate()
    assert json.loads(json.dumps(dataclasses.asdict(RunConfig())))["report_to"] == []


def test_every_stage_that_trains_into_a_run_directory_takes_overwrite_and_resume():
    """The flags come from the stage table, not from a hand-kept list: every stage with a run
    directory (dpo included, which once lacked --overwrite) takes --overwrite and --resume; the
    others take neither."""
    from fourfold.cli import STAGES, build_parser

    parser = build_parser()
    trained = {name for name, stage in STAGES.items() if stage.run_dir}
    assert trained == {"sft", "reward", "dpo", "ppo", "reinforce", "gym"}
    for name in trained:
        args = parser.parse_args([name, "--overwrite"])
        assert (args.stage, args.overwrite, args.resume) == (name, True, False)
        assert parser.parse_args([name, "--resume"]).resume
    for name in set(STAGES) - trained - {"demo"}:  # the demo resumes its stages (--resume), never overwrites
        with pytest.raises(SystemExit):
            parser.parse_args([name, "--overwrite"])
