"""Metric names, metric sinks (JSONL, TensorBoard, a rich progress bar) and HTML report helpers.

Metric names are stable strings documented once, in ``METRICS`` (:mod:`fourfold.names`) (the README embeds
``metrics_markdown_table()``; a name made from the config, ``reward/<name>_mean``, by its pattern in
``METRIC_PATTERNS``; which trainers log each, and when, in ``LOGGED_BY``). Names are ``group/name``;
the groups are ``reward/``, ``kl/``, ``policy/``,
``value/``, ``mismatch/``, ``rollout/``, ``time/`` for PPO/REINFORCE, ``env/`` for environments, ``train/`` for training
health, ``sft/``, ``rm/``, ``dpo/`` and ``gym/`` for the other stages, plus the bare counters
``iteration`` and ``samples``. Timing keys live under ``time/`` and end in ``_s`` (seconds) or
``_per_s`` (a rate); ``is_timing_key`` recognises them so that resume-equality tests can drop them.

``metrics.jsonl`` format: one JSON object per line, ``{"step": <int>, <key>: <value>, ...}`` with
the metric keys sorted. Values are JSON numbers (ints stay ints); NaN and +/-inf are written as
``null`` (strict JSON that every reader accepts) and therefore read back as ``None``. Every line is
flushed and fsynced when written, so after a kill at most the last line is partial; readers drop
it. ``events.jsonl`` holds one object per event: ``{"kind", "step", "wall_time", ...fields}``.
``samples.jsonl`` (PPO and REINFORCE, every ``run.samples_every`` iterations) holds one object per
sample completion: ``{"step", "prompt", "response", "score", ...}`` (a weighted reward's
``parts``: name -> that part's score). The console lines, the summary
line and the optional W&B sink are in :mod:`fourfold.sinks`.

Plotting uses matplotlib's object API (``matplotlib.figure.Figure``), imported lazily inside the
functions: importing this module neither imports matplotlib nor changes its global backend.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import numbers
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fourfold.atomic import write_text_atomic
from fourfold.errors import DataError
from fourfold.names import LOGGED_BY, METRIC_GROUPS, METRIC_PATTERNS, METRICS, logged_by
from fourfold.sinks import fmt_number, plain_line, samples_markdown

__all__ = [
    "LOGGED_BY", "METRICS", "METRIC_PATTERNS", "MetricsLogger", "logged_by", "documented", "fig_to_data_uri", "html_image", "html_page",
    "is_timing_key", "metrics_markdown_table", "plot_curves", "read_metrics", "token_heatmap_html",
]

# the metric table lives in fourfold.names (re-exported here)


def documented(name: str) -> bool:
    """Whether a logged name is in :data:`METRICS` or matches a :data:`METRIC_PATTERNS` name (<name>: no '/')."""
    return name in METRICS or any(name.startswith(h) and name.endswith(t) and "/" not in name[len(h):-len(t)] and
                                  len(name) > len(h + t) for h, _, t in (p.partition("<name>") for p in METRIC_PATTERNS))


def is_timing_key(key: str) -> bool:
    """True for wall-clock dependent keys: ending in ``_s`` or ``_per_s``, or containing ``time``."""
    return key.endswith("_s") or key.endswith("_per_s") or "time" in key


_RL_ANY = "ppo, reinforce (several reward parts)"


def metrics_markdown_table() -> str:
    """The ``METRICS`` table as GitHub markdown, one section row per group, in table order, with the
    trainers that log each metric and when (``LOGGED_BY``)."""
    lines = ["| Metric | Meaning | Logged by |", "|---|---|---|"]
    group = None
    for name, meaning in METRICS.items():
        g = name.split("/", 1)[0] if "/" in name else ""
        if g != group:
            group = g
            lines.append(f"| **{METRIC_GROUPS.get(g, g)}** | | |")
        lines.append(f"| `{name}` | {meaning.replace('|', '&#124;')} | {LOGGED_BY[name]} |")
        lines += [f"| `{k}` | {v} | {_RL_ANY} |" for k, v in METRIC_PATTERNS.items()] if name == "reward/no_eos_penalised" else []
    return "\n".join(lines) + "\n"


# ---- JSONL ---------------------------------------------------------------------------------------


def _read_jsonl_lines(path: Path) -> list[tuple[str, dict]]:
    """(line text, parsed object) for every complete line. Trailing lines that do not parse (a
    write cut by a kill) are dropped; a bad line followed by good ones is a DataError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[tuple[str, dict]] = []
    bad: int | None = None  # first unparseable line number (1-based) not yet followed by a good one
    for lineno, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError:
            bad = bad or lineno
            continue
        if bad is not None:
            raise DataError(f"{path}:{bad}: not a JSON object, and valid rows follow it (file corrupted)")
        out.append((line, obj))
    return out


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``metrics.jsonl`` (or ``events.jsonl``) file; a partial last line is dropped,
    a missing file gives ``[]``. NaN/inf were written as ``null`` and come back as ``None``."""
    return [obj for _, obj in _read_jsonl_lines(Path(path))]


def _rewrite_atomically(path: Path, lines: Iterable[str]) -> None:
    write_text_atomic(path, "".join(line + "\n" for line in lines))


def _to_number(key: str, value: Any) -> int | float | bool | None:
    """A JSON-ready scalar: tensors/numpy scalars unwrapped, non-finite floats -> None."""
    if value is None or isinstance(value, bool):
        return value
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, numbers.Number):
        numel = value.numel() if hasattr(value, "numel") else getattr(value, "size", 1)
        if numel != 1:
            raise TypeError(f"metric {key!r}: expected a scalar, got a tensor/array of {numel} elements")
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}")


def _jsonable(value: Any) -> Any:
    """Event fields: numbers via _to_number, containers recursively, anything else as str()."""
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    try:
        return _to_number("", value)
    except TypeError:
        return str(value)


class MetricsLogger:
    """Writes metrics to ``run_dir/metrics.jsonl``, TensorBoard, extra sinks and the console.

    ``progress``: True shows a rich progress bar when stdout is a TTY and one plain line per
    logged row otherwise (:func:`fourfold.sinks.plain_line`); ``"force"`` shows the bar regardless;
    False shows neither. ``tensorboard``: write ``run_dir/tensorboard/`` event files (a one-line
    warning when ``torch.utils.tensorboard`` does not import). ``sinks``: more sinks (objects with
    ``log``, ``samples`` and ``close``, see :mod:`fourfold.sinks`). ``total``: steps of the run,
    for the bar. ``key_metrics``: shown next to the bar and in the plain lines. ``resume_step=N``:
    keep the complete rows of the existing ``metrics.jsonl`` (and the events and samples) with
    ``step <= N``, rewritten atomically, then append; ``None``: start the files empty. ``stage``:
    the name warnings carry (``fourfold ppo: warning: ...``; default ``desc``).

    Everything it shows goes to stdout, warnings too (whatever ``progress`` is): the bar, the plain
    lines and the warnings read in the order they happened, and ``> log`` keeps them all.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        progress: bool | str = True,
        tensorboard: bool = True,
        total: int | None = None,
        desc: str = "",
        key_metrics: Sequence[str] = ("reward/score_mean",),
        resume_step: int | None = None,
        sinks: Sequence[Any] = (),
        stage: str | None = None,
    ):
        self.run_dir = Path(run_dir)
        self._warn_prefix = f"fourfold {stage or desc or 'train'}: warning:"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.events_path = self.run_dir / "events.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        self.key_metrics = tuple(key_metrics)
        self.resume_step = resume_step
        self.last_step: int | None = resume_step
        self._closed = False
        self._sinks = list(sinks)
        self._samples_f = None  # opened by the first samples() call

        if resume_step is None:
            for p in (self.metrics_path, self.events_path, self.samples_path):
                if p.exists():
                    _rewrite_atomically(p, [])
        else:
            kept = [line for line, obj in _read_jsonl_lines(self.metrics_path) if _step_of(obj, keep_none=False) <= resume_step]
            _rewrite_atomically(self.metrics_path, kept)
            kept = [line for line, obj in _read_jsonl_lines(self.events_path) if _step_of(obj, keep_none=True) <= resume_step]
            _rewrite_atomically(self.events_path, kept)
            if self.samples_path.exists():
                kept = [line for line, obj in _read_jsonl_lines(self.samples_path) if _step_of(obj, keep_none=False) <= resume_step]
                _rewrite_atomically(self.samples_path, kept)
        self._metrics_f = open(self.metrics_path, "a", encoding="utf-8")
        self._events_f = open(self.events_path, "a", encoding="utf-8")

        self._progress = None  # the rich bar, started below (warnings before it are plain lines)
        self._task = None
        self._writer = _tensorboard_writer(self.run_dir / "tensorboard", resume_step, self._say) if tensorboard else None
        # set when TensorBoard event files are written
        self.tensorboard_dir: Path | None = None if self._writer is None else self.run_dir / "tensorboard"

        show = progress == "force" or (progress is True and _stdout_is_tty())
        self._plain = progress is True and not show  # off a terminal: one plain line per row
        self._desc, self._total, self._t0 = desc, total, time.perf_counter()
        if show:
            try:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )

                self._progress = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    TextColumn("{task.fields[metrics]}"),
                )
                self._task = self._progress.add_task(desc or "train", total=total, completed=resume_step or 0, metrics="")
                self._progress.start()
            except Exception as e:  # a progress bar must never take a run down
                self._progress = None
                self._say(f"progress bar disabled: {e}")
        if resume_step is not None:
            self.event("resume", step=resume_step)

    # -- context manager
    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- writing
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append ``{"step": step, **metrics}`` (keys sorted; NaN/inf -> null), flushed and fsynced."""
        if self._closed:
            raise RuntimeError("MetricsLogger.log after close()")
        if "step" in metrics:
            raise ValueError("'step' is reserved: pass it as the first argument")
        step = int(step)
        row: dict[str, Any] = {"step": step}
        for key in sorted(metrics):
            if not isinstance(key, str):
                raise TypeError(f"metric names must be strings, got {key!r}")
            row[key] = _to_number(key, metrics[key])
        self._write_line(self._metrics_f, row)
        self.last_step = step
        if self._writer is not None:
            for key, value in row.items():
                if key != "step" and value is not None:
                    self._writer.add_scalar(key, float(value), step)
        for sink in self._sinks:
            sink.log(step, row)
        if self._progress is not None:
            shown = "  ".join(
                f"{k.rsplit('/', 1)[-1]}={fmt_number(row[k])}" for k in self.key_metrics if isinstance(row.get(k), (int, float))
            )
            self._progress.update(self._task, completed=step, metrics=shown)
        if self._plain:
            print(plain_line(self._desc, step, self._total, row, self.key_metrics, time.perf_counter() - self._t0,
                             first_step=self.resume_step or 0), flush=True)

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Append sample completions (``{"step": step, **row}`` per row, e.g. prompt, response,
        score) to ``samples.jsonl``, flushed and fsynced, and send them to TensorBoard (a text
        table) and the sinks."""
        if self._closed:
            raise RuntimeError("MetricsLogger.samples after close()")
        if self._samples_f is None:
            self._samples_f = open(self.samples_path, "a", encoding="utf-8")
        rows = [{k: _jsonable(v) for k, v in r.items()} for r in rows]
        for r in rows:
            self._write_line(self._samples_f, {"step": int(step), **r})
        if self._writer is not None:
            self._writer.add_text("samples", samples_markdown(rows), int(step))
        for sink in self._sinks:
            sink.samples(int(step), rows)

    def event(self, kind: str, *, step: int | None = None, **fields: Any) -> None:
        """Append ``{"kind", "step", "wall_time", **fields}`` to ``events.jsonl`` (``step``
        defaults to the last logged step)."""
        if self._closed:
            raise RuntimeError("MetricsLogger.event after close()")
        row = {"kind": str(kind), "step": self.last_step if step is None else int(step), "wall_time": time.time()}
        for k, v in fields.items():
            row[k] = _jsonable(v)
        self._write_line(self._events_f, row)

    def warn(self, msg: str, *, step: int | None = None, **fields: Any) -> None:
        """An event of kind ``"warning"`` with ``message=msg``, also shown on the console (stdout):
        ``fourfold ppo: warning: msg``."""
        self.event("warning", step=step, message=str(msg), **fields)
        self._say(msg)

    def _say(self, msg: Any) -> None:
        """One warning line on stdout, above the bar when there is one."""
        if self._progress is not None:
            from rich.markup import escape

            self._progress.console.print(f"[yellow]{escape(self._warn_prefix)}[/yellow] {escape(str(msg))}")
        else:
            print(f"{self._warn_prefix} {msg}", flush=True)

    @staticmethod
    def _write_line(f: Any, row: Mapping[str, Any]) -> None:
        f.write(json.dumps(row, allow_nan=False, separators=(", ", ": ")) + "\n")
        f.flush()
        os.fsync(f.fileno())

    def close(self) -> None:
        """Stop the bar, close TensorBoard and the files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._progress is not None:
            try:
                self._progress.stop()
            except Exception:
                pass
        if self._writer is not None:
            self._writer.close()
        for sink in self._sinks:
            sink.close()
        self._metrics_f.close()
        self._events_f.close()
        if self._samples_f is not None:
            self._samples_f.close()


def _tensorboard_writer(log_dir: Path, resume_step: int | None, warn=print):
    """A TensorBoard ``SummaryWriter`` into ``log_dir`` (its events after ``resume_step`` purged), or
    None with a one-line warning (``warn``) when ``torch.utils.tensorboard`` does not import."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception as e:  # tensorboard not installed (or broken): JSONL is the record
        warn(f"TensorBoard disabled ({type(e).__name__}: {e}); metrics.jsonl has every metric (pip install tensorboard)")
        return None
    purge = resume_step + 1 if resume_step is not None else None
    return SummaryWriter(log_dir=str(log_dir), purge_step=purge)


def _step_of(obj: Mapping[str, Any], *, keep_none: bool) -> float:
    step = obj.get("step")
    if isinstance(step, int) and not isinstance(step, bool):
        return step
    return -math.inf if keep_none else math.inf  # metrics rows without a step are dropped on resume


def _stdout_is_tty() -> bool:
    try:
        return bool(sys.stdout is not None and sys.stdout.isatty())
    except (AttributeError, ValueError, OSError):
        return False


# ---- HTML report helpers -------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1,h2,h3{line-height:1.2}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%}
.tokens{white-space:pre-wrap;font-family:ui-monospace,Menlo,Consolas,monospace;line-height:1.9}
.tokens span{border-radius:3px;padding:1px 0}
""".strip()


def html_page(title: str, body_html: str) -> str:
    """A self-contained HTML document (inline CSS, no external resources) with ``title`` as <h1>.
    ``body_html`` is inserted as is (it is HTML)."""
    t = html.escape(str(title))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{t}</title>\n"
        f"<style>\n{_CSS}\n</style>\n</head>\n<body>\n<h1>{t}</h1>\n{body_html}\n</body>\n</html>\n"
    )


def html_image(data_uri: str, alt: str = "") -> str:
    """An <img> tag for a data URI (from ``fig_to_data_uri``/``plot_curves``)."""
    return f'<img src="{html.escape(data_uri, quote=True)}" alt="{html.escape(alt, quote=True)}">'


def fig_to_data_uri(fig: Any, *, dpi: int = 100) -> str:
    """Render a matplotlib figure to ``data:image/png;base64,...`` and close it (Agg renderer;
    works for ``Figure()`` objects and for pyplot figures alike)."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    finally:
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _floats(values: Iterable[Any]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def plot_curves(
    series: Mapping[str, tuple[Sequence[Any], Sequence[Any]]],
    title: str,
    xlabel: str,
    ylabel: str,
    bands: Mapping[str, tuple] | None = None,
) -> str:
    """Line plot of ``{label: (xs, ys)}`` as a PNG data URI. ``bands``: ``{label: (low, high)}``
    (shaded around the series of the same label, sharing its xs) or ``{label: (xs, low, high)}``.
    ``None`` values are gaps."""
    from matplotlib.figure import Figure  # lazy, and no pyplot: no global backend state

    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    colors: dict[str, Any] = {}
    for label, (xs, ys) in series.items():
        (line,) = ax.plot(list(xs), _floats(ys), label=str(label), linewidth=1.5)
        colors[label] = line.get_color()
    for label, band in (bands or {}).items():
        if len(band) == 3:
            xs, low, high = band
        elif len(band) == 2 and label in series:
            (xs, _), (low, high) = series[label], band
        else:
            raise ValueError(f"band {label!r}: expected (low, high) for a plotted series or (xs, low, high)")
        ax.fill_between(list(xs), _floats(low), _floats(high), alpha=0.2, color=colors.get(label), linewidth=0)
    ax.set_title(str(title))
    ax.set_xlabel(str(xlabel))
    ax.set_ylabel(str(ylabel))
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize="small")
    return fig_to_data_uri(fig)


def token_heatmap_html(tokens: Sequence[str], values: Sequence[float], *, scale: float | None = None) -> str:
    """Tokens as <span>s coloured red (negative) <-> green (positive), opacity proportional to
    ``|value| / scale`` (``scale`` defaults to the largest finite ``|value|``); each span's title
    tooltip shows the value. Non-finite values are grey. Everything is escaped."""
    if len(tokens) != len(values):
        raise ValueError(f"{len(tokens)} tokens but {len(values)} values")
    vals = _floats(values)
    finite = [abs(v) for v in vals if math.isfinite(v)]
    s = scale if scale is not None else (max(finite) if finite else 0.0)
    spans = []
    for tok, v in zip(tokens, vals):
        if not math.isfinite(v):
            bg, tip = "rgba(128,128,128,0.35)", str(v)
        else:
            a = 0.0 if s <= 0 else min(1.0, abs(v) / s) * 0.85
            bg = f"rgba(0,170,60,{a:.3f})" if v >= 0 else f"rgba(220,30,30,{a:.3f})"
            tip = f"{v:.4g}"
        spans.append(
            f'<span style="background:{bg}" title="{html.escape(tip, quote=True)}">{html.escape(str(tok))}</span>'
        )
    return '<div class="tokens">' + "".join(spans) + "</div>"
