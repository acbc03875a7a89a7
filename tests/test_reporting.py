"""Metric names, the JSONL/events sinks with resume truncation, and the HTML helpers."""
import base64
import json
import re
from html.parser import HTMLParser

import pytest
import torch

from fourfold.errors import DataError
from fourfold.reporting import (
    METRICS,
    MetricsLogger,
    fig_to_data_uri,
    html_image,
    html_page,
    is_timing_key,
    metrics_markdown_table,
    plot_curves,
    read_metrics,
    token_heatmap_html,
)

GROUPS = {"reward", "kl", "policy", "value", "rollout", "time", "train", "sft", "rm", "dpo", "gym", "env", "mismatch"}
REQUIRED = """reward/score_mean reward/score_std reward/gold_mean reward/token_reward_sum_mean
reward/no_eos_penalised kl/k1 kl/k3 kl/coef policy/loss policy/clipfrac policy/approx_kl policy/entropy
policy/lr policy/grad_norm value/loss value/clipfrac value/explained_variance value/mean value/lr
value/grad_norm rollout/response_length rollout/no_eos_share rollout/tokens time/generate_s time/score_s
time/train_s time/iteration_s time/gen_tokens_per_s time/train_tokens_per_s train/nonfinite_skips sft/loss
sft/token_accuracy rm/loss rm/accuracy rm/eval_accuracy rm/eval_loss dpo/loss dpo/reward_margin dpo/accuracy
dpo/chosen_logps dpo/rejected_logps dpo/chosen_reward dpo/rejected_reward dpo/eval_loss dpo/eval_accuracy
dpo/lr dpo/grad_norm gym/episodic_return
gym/episodic_length gym/eval_return iteration samples""".split()


# ---- names ---------------------------------------------------------------------------------------


def test_metric_names_follow_the_convention():
    assert set(REQUIRED) <= set(METRICS)
    for name, meaning in METRICS.items():
        assert meaning.strip(), name
        if "/" not in name:
            assert name in {"iteration", "samples"}
            continue
        group, leaf = name.split("/")
        assert group in GROUPS and re.fullmatch(r"[a-z0-9_]+", leaf), name
        # timing keys are exactly the time/* ones, so resume tests drop nothing else
        assert is_timing_key(name) == (group == "time"), name
        if group == "time":
            assert name.endswith("_s") or name.endswith("_per_s"), name


def test_is_timing_key():
    assert is_timing_key("time/generate_s") and is_timing_key("time/gen_tokens_per_s")
    assert is_timing_key("wall_time") and is_timing_key("custom/step_s")
    assert not is_timing_key("reward/score_mean") and not is_timing_key("rollout/tokens")
    assert not is_timing_key("train/nonfinite_skips") and not is_timing_key("samples")


def test_markdown_table_lists_every_metric():
    table = metrics_markdown_table()
    lines = table.strip().splitlines()
    assert lines[0] == "| Metric | Meaning | Logged by |" and lines[1] == "|---|---|---|"
    for name in METRICS:
        assert f"| `{name}` |" in table
    assert all(line.startswith("|") and line.endswith("|") and line.count("|") == 4 for line in lines)
    assert "| `value/lr` | Critic learning rate at the end of the iteration. | ppo (with a critic: ppo.advantage gae) |" \
        in lines


# ---- JSONL ---------------------------------------------------------------------------------------


def _logger(run_dir, **kw):
    return MetricsLogger(run_dir, progress=False, tensorboard=False, **kw)


def test_log_rows(tmp_path):
    with _logger(tmp_path) as lg:
        lg.log(1, {"reward/score_mean": 0.5, "iteration": 1, "kl/k1": torch.tensor(0.25), "policy/loss": float("nan")})
        lg.log(2, {"reward/score_mean": float("inf"), "iteration": 2})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert list(first) == ["step", "iteration", "kl/k1", "policy/loss", "reward/score_mean"]  # step, then sorted
    assert first == {"step": 1, "iteration": 1, "kl/k1": 0.25, "policy/loss": None, "reward/score_mean": 0.5}
    assert isinstance(first["iteration"], int)
    assert read_metrics(tmp_path / "metrics.jsonl")[1] == {"step": 2, "iteration": 2, "reward/score_mean": None}
    with pytest.raises(RuntimeError):
        lg.log(3, {})
    with _logger(tmp_path / "b") as lg, pytest.raises(TypeError, match="policy/loss"):
        lg.log(1, {"policy/loss": "high"})


def test_fresh_start_truncates(tmp_path):
    with _logger(tmp_path) as lg:
        lg.log(1, {"a/b": 1.0})
        lg.warn("boom")
    with _logger(tmp_path) as lg:
        lg.log(1, {"a/b": 2.0})
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "a/b": 2.0}]
    assert read_metrics(tmp_path / "events.jsonl") == []


def test_resume_drops_partial_line_and_later_rows(tmp_path):
    with _logger(tmp_path) as lg:
        for step in range(1, 6):
            lg.log(step, {"reward/score_mean": step / 10})
            if step in (2, 4):
                lg.event("nonfinite_skip", loss=float("nan"), where="policy")
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "reward/sc')  # the kill happened mid-write
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]

    with _logger(tmp_path, resume_step=3) as lg:
        assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
        lg.log(4, {"reward/score_mean": 0.4})
        lg.event("nonfinite_skip", where="policy")
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # no duplicates
    events = read_metrics(tmp_path / "events.jsonl")
    assert [(e["kind"], e["step"]) for e in events] == [("nonfinite_skip", 2), ("resume", 3), ("nonfinite_skip", 4)]
    assert events[0]["loss"] is None and events[0]["where"] == "policy"

    # resuming with no file at all is fine too
    with _logger(tmp_path / "new", resume_step=7) as lg:
        lg.log(8, {"x/y": 1})
    assert read_metrics(tmp_path / "new" / "metrics.jsonl") == [{"step": 8, "x/y": 1}]


def test_read_metrics_tolerance(tmp_path):
    p = tmp_path / "m.jsonl"
    assert read_metrics(p) == []
    p.write_text('{"step": 1}\n{"step": 2}\n{"st')
    assert read_metrics(p) == [{"step": 1}, {"step": 2}]
    p.write_text('{"step": 1}\n{"step": 2}')  # last line complete but without its newline
    assert read_metrics(p) == [{"step": 1}, {"step": 2}]
    p.write_text('{"step": 1}\ngarbage\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"m.jsonl:2"):
        read_metrics(p)


def test_progress_and_tensorboard_never_crash_without_tty(tmp_path, capsys):
    with MetricsLogger(tmp_path, progress="force", tensorboard=True, total=3, desc="ppo",
                       key_metrics=("reward/score_mean", "kl/k1")) as lg:
        for step in range(1, 4):
            lg.log(step, {"reward/score_mean": 0.1 * step, "kl/k1": float("nan")})
        lg.warn("non-finite loss, update skipped", step=2)
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3
    (ev,) = read_metrics(tmp_path / "events.jsonl")
    assert ev["kind"] == "warning" and ev["step"] == 2 and "non-finite" in ev["message"]
    with MetricsLogger(tmp_path / "auto", total=None) as lg:  # progress=True, stdout not a TTY: no bar
        lg.log(1, {"a/b": 1.0})


# ---- HTML ----------------------------------------------------------------------------------------


class _Checker(HTMLParser):
    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.imgs, self.spans, self.titles, self.text = [], [], 0, [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a["src"])
        if tag == "span":
            self.spans += 1
            self.titles.append(a.get("title"))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _parse(doc: str) -> _Checker:
    c = _Checker()
    c.feed(doc)
    c.close()
    assert c.stack == [], c.stack
    return c


def test_html_report_parses_with_embedded_png():
    uri = plot_curves(
        {"ppo": ([1, 2, 3], [0.1, None, 0.3]), "sft": ([1, 2, 3], [0.0, 0.1, 0.1])},
        "score", "iteration", "reward",
        bands={"ppo": ([0.0, 0.1, 0.2], [0.2, 0.3, 0.4]), "x": ([1, 3], [0, 0], [1, 1])},
    )
    body = "\n".join([
        html_image(uri, alt="score curve"),
        "<p>b &amp; c &lt;script&gt;</p>",
        token_heatmap_html(["Hello", " <world>", "\n", "!"], [1.0, -0.5, 0.0, float("nan")]),
    ])
    doc = html_page("Run <report>", body)
    checker = _parse(doc)
    assert doc.startswith("<!DOCTYPE html>") and "<title>Run &lt;report&gt;</title>" in doc
    assert "<script>" not in doc and "&lt;script&gt;" in doc and "b &amp; c" in doc
    (src,) = checker.imgs
    assert src.startswith("data:image/png;base64,")
    assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    assert checker.spans == 4 and checker.titles == ["1", "-0.5", "0", "nan"]


def test_heatmap_colours():
    h = token_heatmap_html(["good", "bad"], [2.0, -2.0])
    assert "rgba(0,170,60,0.850)" in h and "rgba(220,30,30,0.850)" in h
    with pytest.raises(ValueError):
        token_heatmap_html(["a"], [1.0, 2.0])


def test_fig_to_data_uri_closes_pyplot_figure():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    plt.plot([0, 1], [1, 0])
    uri = fig_to_data_uri(fig)
    assert uri.startswith("data:image/png;base64,") and fig.number not in plt.get_fignums()


def test_fmt_fixed_never_writes_minus_zero():
    from fourfold.sinks import fmt_fixed

    assert fmt_fixed(-0.0004) == "0.000" and fmt_fixed(-0.0) == "0.000"
    assert fmt_fixed(-0.0006) == "-0.001" and fmt_fixed(4.2184) == "4.218" and fmt_fixed(2.5, 1) == "2.5"


def test_the_plain_line_says_the_time_left_from_this_process_s_rate():
    """Hand cases: 3 of 10 steps in 6 s -> 2 s a step, 14 s left; resumed at 5, now 7 of 10 in 4 s ->
    2 s a step, 6.0 s left; none before a step or after the last."""
    from fourfold.sinks import eta_s, plain_line

    assert eta_s(6.0, 3, 7) == 14.0 and eta_s(0.0, 0, 10) is None and eta_s(5.0, 10, 0) is None
    row = {"reward/score_mean": 0.5}
    assert plain_line("ppo", 3, 10, row, ("reward/score_mean",), 6.0) == \
        "ppo 3/10: reward/score_mean=0.5 (6 s, about 14 s left)"
    assert plain_line("ppo", 7, 10, row, ("reward/score_mean",), 4.0, first_step=5) == \
        "ppo 7/10: reward/score_mean=0.5 (4 s, about 6 s left)"
    assert plain_line("ppo", 10, 10, row, ("reward/score_mean",), 20.0) == "ppo 10/10: reward/score_mean=0.5 (20 s)"
    assert plain_line("sft", 4, None, {}, (), 2.0) == "sft step 4 (2 s)"
