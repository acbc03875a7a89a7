"""Every published figure from run outputs: ``make results`` runs the demos and the sweeps, then
``python -m fourfold.apps.publish collect`` and ``render``.

1. ``collect`` reads the run outputs (the demo's ``eval.json`` and stage records, the sweeps'
   ``results.json``, each run's ``provenance.json``: commit, machine, date, command) and writes the
   small summaries committed as the source of the published numbers, in ``results/``: ``demo.json``
   (the full and the quick demo, per seed), ``experiments.json`` (the claims sweep: per-arm
   summaries, claims), ``horizon.json``, ``overoptimization.json``, ``turns.json`` (those families),
   ``practice.json`` (the practice sweep, examples/practice.yaml), ``measure.json`` (the measurement
   sweep, examples/measure.yaml), ``staleness.json`` (examples/staleness.yaml), ``arithmetic.json`` (``fourfold
   demo --task arithmetic``, per seed) and, untouched, ``benchmarks.json`` (measured by hand, see
   docs/benchmarks.md; ``make results`` does not rerun them, workload G needs an H200).
2. ``render`` rewrites, from ``results/*.json`` alone, the marked blocks of README.md (the headline
   table, the quick demo's numbers, the arithmetic demo's line), docs/arithmetic.md (its seeds),
   docs/demo.md (the seed table, the quick demo), docs/experiments.md (the full sweep's table and
   claims count, the families' tables, figures and claims) and docs/correction.md (the practice
   sweep's): the text between ``<!-- publish:NAME -->`` and ``<!-- /publish:NAME -->``. Each block
   says on which commit and machine its numbers were made.
3. ``check`` renders to memory and exits 1 when a file differs (the test suite runs it).

Nothing here runs a model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from fourfold.apps.claim_kit import claims_md, counts_text, headline_row
from fourfold.apps.claim_reeval import annotate_record
from fourfold.apps.demo.arithmetic_results import RUNS as ARITHMETIC_RUNS
from fourfold.apps.demo.arithmetic_results import arithmetic_line, arithmetic_table, collect_arithmetic
from fourfold.apps.publish_demo import (
    collect_demo,
    demo_seed_table,
    file_by_machine,
    machine_spread_text,
    machines_table,
    quick_demo_text,
    seed_order,
)
from fourfold.apps.publish_io import made as _made
from fourfold.apps.publish_io import read, run_provenance
from fourfold.apps.publish_markers import check_markers
from fourfold.apps.publish_measure import measure_headline, measure_record, measure_text
from fourfold.apps.publish_overopt import overopt_headline, overopt_record, overopt_text
from fourfold.apps.publish_practice import practice_headline, practice_record, practice_text
from fourfold.apps.publish_staleness import staleness_headline, staleness_record, staleness_text
from fourfold.apps.publish_turns import turns_headline, turns_record, turns_text
from fourfold.apps.publish_warmup import warmup_headline, warmup_record, warmup_text
from fourfold.apps.report_kit import fmt, mean, pct, signed
from fourfold.atomic import write_text_atomic
from fourfold.errors import DataError, FourfoldError

REPO = Path(__file__).resolve().parents[2]  # fourfold/apps/publish.py -> the checkout
RESULTS = "results"
MARK = re.compile(r"<!-- publish:(?P<name>[a-z-]+) -->(?P<body>.*?)<!-- /publish:(?P=name) -->", re.S)


# ---------------------------------------------------------------------------------------------
# collect: run outputs -> results/*.json
# ---------------------------------------------------------------------------------------------


def collect_sweep(out: Path, keep: Sequence[str] = ()) -> dict:
    """A sweep's results.json, less what only its own report needs: settings, SFT, RM accuracy, the
    per-arm summaries, the claims (without their long texts' rows), time, and its provenance."""
    res = read(out / "results.json")
    if not res:
        raise FileNotFoundError(f"{out / 'results.json'}: no sweep results (run the sweep first)")
    cfg = res["config"]
    record = {"provenance": run_provenance(out), "wall_s": res["wall_s"], "seeds": cfg["seeds"],
              "iterations": cfg["iterations"], "eval_prompts": cfg["eval_prompts"],
              "claims": [{k: c[k] for k in ("group", "claim", "measured", "threshold", "holds")} for c in res["claims"]]}
    return {**record, **{k: res[k] for k in keep if k in res}}


def collect_experiments(out: Path) -> dict:
    """results/experiments.json from a claims sweep's output directory."""
    res = read(out / "results.json") or {}
    record = collect_sweep(out, keep=("summaries",))
    cfg = res.get("config", {})
    ppo = cfg.get("demo", {}).get("ppo", {})
    labels = {"ppo": f"ppo (beta {ppo.get('kl_coef', 0):g}, {ppo.get('ppo_epochs')} epochs)",
              "ppo-beta-high": f"ppo-beta-high (beta {ppo.get('kl_coef', 0) * cfg.get('beta_high_multiplier', 0):g})",
              "grpo": f"grpo (K = {cfg.get('group_size')})", "rloo": f"rloo (K = {cfg.get('group_size')})",
              "dpo": f"dpo (beta {cfg.get('dpo_beta', 0):g})", "ppo-unbiased-rm": "ppo, RM from unbiased labelers"}
    labels.update({a: f"reinforce, lr x{a[len('reinforce-lr'):-1]}" for a in record["summaries"]
                   if a.startswith("reinforce-lr")})
    sft = res.get("sft", {})
    rm = res.get("demo", {}).get("reward_result", {})
    return {**record, "labels": labels, "rollout_batch_size": ppo.get("rollout_batch_size"),
            "dpo_steps": cfg.get("demo", {}).get("reward", {}).get("steps"),
            "dpo_batch": cfg.get("demo", {}).get("reward", {}).get("batch_size"),
            "sft": {k: sft.get(k) for k in ("gold_std", "length", "well_formed", "repetition")},
            "rm": {k: rm.get(k) for k in ("accuracy_vs_labelers", "accuracy_vs_gold")}}


def collect_horizon(out: Path) -> dict:
    """results/horizon.json from the horizon family's output directory (its figure copied to the docs
    by :func:`main`)."""
    res = read(out / "results.json") or {}
    record = collect_sweep(out, keep=("summaries", "worlds", "rm"))
    h = res.get("config", {}).get("horizon", {})
    finals = res.get("finals", {})
    record["sentences"] = {w: {a: mean([r.get("sentences") for r in rows]) for a, rows in arms.items()}
                           for w, arms in finals.items()}
    record["sft"] = {w: {k: s.get(k) for k in ("gold_std", "length", "sentences", "well_formed")}
                     for w, s in res.get("sft", {}).items()}
    return {**record, "horizons": h.get("horizons"), "arms": h.get("arms"), "group_size": res.get("config", {}).get("group_size")}


def collect_overopt(out: Path) -> dict:
    """results/overoptimization.json (:func:`fourfold.apps.publish_overopt.overopt_record`)."""
    return overopt_record(read(out / "results.json") or {}, run_provenance(out))


# ---------------------------------------------------------------------------------------------
# render: results/*.json -> the marked blocks
# ---------------------------------------------------------------------------------------------


def arm_order(arm: str) -> tuple:
    """Arms in the order the sweeps run them (EXPERIMENT_ARMS; reinforce by learning rate)."""
    from fourfold.apps.experiments.config import EXPERIMENT_ARMS

    base = "reinforce" if arm.startswith("reinforce-lr") else arm
    lr = float(arm[len("reinforce-lr"):-1]) if base == "reinforce" and arm != "reinforce" else 0.0
    return (EXPERIMENT_ARMS.index(base) if base in EXPERIMENT_ARMS else len(EXPERIMENT_ARMS), lr, arm)


def world_order(world: str) -> tuple:
    """Worlds by horizon, each horizon's variants after it: h1, h3, h6, h6-k2, h6-k8, h6-noisy."""
    k, _, variant = world[1:].partition("-")
    return (int(k) if k.isdigit() else 0, variant)


def _cell(s: Mapping, key: str, digits: int, sign: bool = False) -> str:
    m, sd = s.get(key), s.get(key + "_sd")
    text = signed(m, digits) if sign else fmt(m, digits)
    return text + (f" ± {sd:.{digits}f}" if isinstance(sd, (int, float)) and sd == sd and text != "n/a" else "")


def experiments_table(res: Mapping) -> str:
    e = res["experiments"]
    sft = e["sft"]
    lines = [f"`fourfold experiments --config examples/experiments.yaml` ({len(e['summaries'])} arms x "
             f"{len(e['seeds'])} seeds, {e['iterations']} iterations x {e['rollout_batch_size']} responses per RL run, "
             f"dpo {e['dpo_steps']} steps x {e['dpo_batch']} pairs, {e['eval_prompts']} held-out prompts): "
             f"{e['wall_s'] / 60:.1f} minutes, {_made(e['provenance'])}. The demo's reward model agrees with "
             f"held-out labels {pct(e['rm']['accuracy_vs_labelers'], 1)} of the time and with gold "
             f"{pct(e['rm']['accuracy_vs_gold'], 1)}. Mean ± sd over seeds; gold and proxy changes in units of the SFT "
             f"samples' standard deviation (gold sd {fmt(sft['gold_std'])}); the last four columns are what each "
             "removal saves:", "",
             "| arm | proxy - SFT | gold - SFT | KL (nats) | length (words) | well-formed | repetition | models "
             "(trained+frozen) | peak RSS (MB) | s / iteration | train s |",
             "|---|---|---|---|---|---|---|---|---|---|---|",
             f"| SFT | 0 | 0 | 0 | {fmt(sft['length'], 1)} | {fmt(sft['well_formed'], 2)} | {fmt(sft['repetition'], 2)} "
             "| | | | |"]
    for arm in sorted(e["summaries"], key=arm_order):
        s = e["summaries"][arm]
        lines.append(f"| {e['labels'].get(arm, arm)} | {_cell(s, 'proxy_delta_sd', 2, True)} | "
                     f"{_cell(s, 'gold_delta_sd', 2, True)} | {fmt(s['kl'], 1 if s['kl'] >= 0.95 else 2)} | "
                     f"{fmt(s['length'], 1)} | {fmt(s['well_formed'], 2)} | {fmt(s['repetition'], 2)} | {s['models']} | "
                     f"{_cell(s, 'peak_rss_mb', 0)} | {fmt(s['s_per_iteration'], 2)} | {_cell(s, 'train_s', 0)} |")
    lines += ["", f"**{counts_text(e['claims'])}, in {len(e['seeds'])}/{len(e['seeds'])} seeds** (`summary.md` has each "
                  "one's kind, measured value, threshold, yes/no and null; a finding holds only if its null is not yes)."]
    return "\n".join(lines)


def horizon_text(h: Optional[Mapping], made: Callable[[Mapping], str] = _made) -> str:
    """docs/experiments.md's horizon block: the per-world table, the figure, the claims."""
    if not h:
        return ("*Not yet run.* The commands above run it and put its table, figure and claims here (`make "
                "results` too).")
    lines = [f"`fourfold experiments --config examples/horizon.yaml`: {h['wall_s'] / 60:.1f} minutes, "
             f"{made(h['provenance'])}; {len(h['seeds'])} seeds, {h['iterations']} iterations x 64 responses per run, "
             f"{h['eval_prompts']} held-out prompts. Gold and proxy in units of each world's SFT sd; mean ± sd over "
             "seeds:", "",
             "| world | arm | proxy - SFT | gold - SFT | KL (nats) | length (words) | sentences | models | peak RSS (MB) "
             "| s / iteration | train s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for world in sorted(h["summaries"], key=world_order):
        arms, sft = h["summaries"][world], h["sft"].get(world, {})
        lines.append(f"| {world} | SFT | 0 | 0 | 0 | {fmt(sft.get('length'), 1)} | {fmt(sft.get('sentences'), 2)} "
                     "| | | | |")
        for arm in sorted(arms, key=arm_order):
            s = arms[arm]
            lines.append(f"| {world} | {arm} | {_cell(s, 'proxy_delta_sd', 2, True)} | {_cell(s, 'gold_delta_sd', 2, True)} "
                         f"| {fmt(s['kl'], 1)} | {fmt(s['length'], 1)} | {fmt(h['sentences'][world][arm], 2)} | "
                         f"{s['models']} | {_cell(s, 'peak_rss_mb', 0)} | {fmt(s['s_per_iteration'], 2)} | "
                         f"{_cell(s, 'train_s', 0)} |")
    lines += ["", "![gold gain and KL against the horizon](img/horizon.png)", "",
              claims_md(h["claims"])]
    return "\n".join(lines)


def horizon_headline(h: Optional[Mapping]) -> list[str]:
    """The README's horizon row (none until the family is published)."""
    if not h:
        return []
    critic = "; ".join(f"{re.sub(r' [(][^()]*[)]$', '', c['claim'])}: {c['holds']}" for c in h["claims"]
                       if c["group"] in ("critic", "match"))
    return [headline_row(f"when the critic pays: horizons {', '.join(map(str, h['horizons']))}", h["claims"],
                         critic, "fourfold experiments --config examples/horizon.yaml",
                         "[docs/experiments.md](docs/experiments.md#the-horizon-family-when-does-the-critic-pay)")]


def collect_turns(out: Path) -> dict:
    """results/turns.json (:func:`fourfold.apps.publish_turns.turns_record`)."""
    return turns_record(read(out / "results.json") or {}, run_provenance(out))


def collect_practice(out: Path) -> dict:
    """results/practice.json (:func:`fourfold.apps.publish_practice.practice_record`)."""
    return practice_record(collect_experiments(out), read(out / "results.json"), out)


def collect_measure(out: Path) -> dict:
    """results/measure.json (:func:`fourfold.apps.publish_measure.measure_record`)."""
    return measure_record(read(out / "results.json") or {}, run_provenance(out), out)


def collect_staleness(out: Path) -> dict:
    """results/staleness.json (:func:`fourfold.apps.publish_staleness.staleness_record`)."""
    return staleness_record(read(out / "results.json") or {}, run_provenance(out))


def collect_warmup(out: Path) -> dict:
    """results/warmup.json (:func:`fourfold.apps.publish_warmup.warmup_record`)."""
    return warmup_record(read(out / "results.json") or {}, run_provenance(out))


@dataclasses.dataclass(frozen=True)
class Family:
    """One published family: results/<name>.json collected from its run output (``runs/<out>`` by
    default, ``--<name>`` on the command line) by ``collect``, with the top-level ``keys`` rendering
    needs; its README rows (``headline(record or None)``), its block ``<!-- publish:<name> -->`` in
    ``doc`` (``text(record or None, made)``), its figure ``<out>/<name>.png`` copied to
    docs/img/<name>.png when ``figure``. ``quiet``: an output that is not there is passed over without
    a word (the file kept); else collect says it kept the file."""

    name: str
    out: str
    keys: tuple[str, ...]
    collect: Callable[[Path], dict]
    headline: Callable[[Optional[Mapping]], list[str]]
    text: Callable[[Optional[Mapping], Callable[[Mapping], str]], str]
    doc: str = "docs/experiments.md"
    figure: bool = False
    quiet: bool = True


FAMILIES: tuple[Family, ...] = (
    Family("horizon", "horizon", ("claims", "summaries", "seeds", "sft", "sentences", "horizons", "iterations",
                                  "eval_prompts", "wall_s", "provenance"),
           collect_horizon, horizon_headline, horizon_text, figure=True, quiet=False),
    Family("overoptimization", "overoptimization", ("claims", "summaries", "seeds", "rm_pairs", "bon_n", "kl_coef",
                                                    "lr_multiplier", "default", "default_kl_coef", "iterations", "wall_s",
                                                    "provenance"),
           collect_overopt, overopt_headline, overopt_text, figure=True),
    Family("turns", "turns", ("claims", "summaries", "sft", "worlds", "seeds", "iterations", "eval_prompts", "wall_s",
                              "provenance"), collect_turns, turns_headline, turns_text, figure=True),
    Family("practice", "experiments-practice", ("claims", "summaries", "arms", "metrics", "notes", "critic_warmup", "seeds",
                                                "wall_s", "provenance"),
           collect_practice, practice_headline, practice_text, doc="docs/correction.md"),
    Family("measure", "experiments-measure", ("claims", "summaries", "arms", "metrics", "notes", "sft", "seeds", "wall_s",
                                              "provenance"), collect_measure, measure_headline, measure_text),
    Family("staleness", "staleness", ("claims", "worlds", "arms", "sft", "finals", "stats", "seeds", "ks", "top_p", "wall_s",
                                      "provenance"), collect_staleness, staleness_headline, staleness_text),
    Family("warmup", "warmup", ("claims", "world", "arms", "sft", "finals", "stats", "ceiling", "seeds", "iterations",
                                "warmup", "wall_s", "provenance"), collect_warmup, warmup_headline, warmup_text),
)
"""The families published beside the demo and the claims sweep, in the README's order. A new family
is one row here (and its publish_<family>.py)."""


def headline_table(res: Mapping) -> str:
    d, e, b = res["demo"]["full"], res["experiments"], res["benchmarks"]
    seeds = seed_order(d)
    gains = " / ".join(signed(d[s]["gold_gain_sd"]) for s in seeds)
    s = e["summaries"]
    claims = {(c["group"], c["claim"]): c["holds"] for c in e["claims"]}
    raise_all = all(v == "yes" for (g, c), v in claims.items() if "raises gold above" in c and g in ("critic-free", "dpo"))
    rows = ["| what | result | command | details |", "|---|---|---|---|",
            f"| the demo: gold gain of PPO over SFT | {gains} sd (seeds {', '.join(seeds)}; "
            f"{d[seeds[0]]['eval_prompts']} held-out prompts) | `fourfold demo --output-dir runs/demo-s$SEED --seed $SEED` "
            "| [docs/demo.md](docs/demo.md) |",
            f"| the method's claims as experiments | {counts_text(e['claims'])} "
            f"in {len(e['seeds'])}/{len(e['seeds'])} seeds ({len(s)} arms x {len(e['seeds'])} seeds, {e['eval_prompts']} "
            f"held-out prompts, {e['wall_s'] / 60:.1f} min on 2 cores); grpo, rloo and DPO "
            + ("raise gold in every seed " if raise_all else "raise gold ")
            + f"({signed(s['grpo']['gold_delta_sd'])}, {signed(s['rloo']['gold_delta_sd'])}, "
            f"{signed(s['dpo']['gold_delta_sd'])} sd against PPO's {signed(s['ppo']['gold_delta_sd'])}) | "
            "`fourfold experiments` | [docs/experiments.md](docs/experiments.md) |"]
    for fam in FAMILIES:
        rows += fam.headline(res.get(fam.name))
    rows += [f"| {r['what']} | {r['result']} | `{r['command']}` | {r['details']} |" for r in b["rows"]]
    return "\n".join(rows) + f"\n\n(Demo and experiments: {_made(e['provenance'])}; benchmarks: {b['source']}.)"


def _blocks() -> dict[str, dict[str, Callable[[Mapping], str]]]:
    blocks: dict[str, dict[str, Callable[[Mapping], str]]] = {
        "README.md": {"headline": headline_table, "quick-demo": quick_demo_text, "machine-spread": machine_spread_text,
                      "arithmetic-demo": arithmetic_line},
        "docs/arithmetic.md": {"arithmetic-seeds": arithmetic_table},
        "docs/demo.md": {"demo-seeds": demo_seed_table, "quick-demo": quick_demo_text, "demo-machines": machines_table},
        "docs/experiments.md": {"experiments-table": experiments_table},
    }
    for fam in FAMILIES:
        blocks.setdefault(fam.doc, {})[fam.name] = lambda res, fam=fam: fam.text(res.get(fam.name), _made)
    return blocks


BLOCKS = _blocks()
"""Which generator writes each marked block of each file."""


REQUIRED_KEYS = {
    "demo": ("full", "quick"),
    "experiments": ("claims", "summaries", "seeds", "sft", "rm", "labels", "iterations", "rollout_batch_size",
                    "dpo_steps", "dpo_batch", "eval_prompts", "wall_s", "provenance"),
    **{fam.name: fam.keys for fam in FAMILIES},
    "benchmarks": ("rows", "source"),
    "machines": ("machines",),
    "arithmetic": ("runs",),
}
OPTIONAL = {"machines", "arithmetic", *(fam.name for fam in FAMILIES)}
"""The top-level keys each results/<name>.json must hold for the blocks to render."""


def load_results(root: Path) -> dict:
    """results/*.json of the checkout ``root`` (:data:`OPTIONAL`'s, the families, machines, arithmetic: None until
    made). A missing one (but those), one that does not parse, or one without a key of :data:`REQUIRED_KEYS` is a
    DataError naming the file."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"--root {root}: no such directory (the checkout whose results/ and docs are read)")
    d, res = root / RESULTS, {}
    for name, keys in REQUIRED_KEYS.items():
        path = d / f"{name}.json"
        res[name] = rec = read(path)
        if rec is None and name not in OPTIONAL:
            raise DataError(f"{path}: missing (is --root {root} a fourfold checkout? `python -m "
                            "fourfold.apps.publish collect` writes it from run outputs)")
        if rec is not None and not isinstance(rec, dict):
            raise DataError(f"{path}: expected a JSON object, got {type(rec).__name__}")
        missing = [k for k in keys if rec is not None and k not in rec]
        if missing:
            raise DataError(f"{path}: no {', '.join(repr(k) for k in missing)} key(s) (cut or from another version? "
                            "rerun `python -m fourfold.apps.publish collect`, or restore it from git)")
    return res


def render_text(text: str, blocks: Mapping[str, Callable[[Mapping], str]], res: Mapping, where: str = "") -> str:
    """``text`` with each marked block rewritten; an unknown or missing block, a marker without its
    partner and results without a key a block reads are DataErrors naming the file (and line)."""
    check_markers(text, where)
    seen = set()

    def repl(m: re.Match) -> str:
        name = m.group("name")
        if name not in blocks:
            raise DataError(f"{where}: unknown publish block {name!r}")
        seen.add(name)
        try:
            body = blocks[name](res)
        except (KeyError, TypeError, IndexError) as e:  # a results file whose inner records lack a field
            raise DataError(f"{where}: publish block {name!r}: results/*.json lack what it reads ({type(e).__name__}: "
                            f"{e}); rerun `python -m fourfold.apps.publish collect`, or restore results/ from git") from None
        inline = "\n" not in m.group("body")
        return f"<!-- publish:{name} -->" + (body if inline else f"\n{body}\n") + f"<!-- /publish:{name} -->"

    out = MARK.sub(repl, text)
    missing = set(blocks) - seen
    if missing:
        raise DataError(f"{where}: no publish block {', '.join(sorted(missing))}")
    return out


def render(root: Path, res: Optional[Mapping] = None) -> dict[str, str]:
    """{file: its text with every block rewritten} for the files of :data:`BLOCKS` under ``root``."""
    res = res or load_results(root)
    return {f: render_text(_read_doc(root / f), blocks, res, str(root / f)) for f, blocks in BLOCKS.items()}


def _read_doc(path: Path) -> str:
    """The text of a published document, or a DataError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None


def write_results(root: Path, demo: Sequence[Path], demo_quick: Sequence[Path], experiments: Path, horizon: Path,
                  machines_only: bool = False, arithmetic: Sequence[Path] = (), **outs: Optional[Path]) -> list[str]:
    """Write each results/*.json of the module's list (and the families' figures) whose run outputs exist; keep the
    others; file the demo runs by machine in results/machines.json too (with ``machines_only``, there alone: another
    machine's runs, the published ones kept). ``outs``: a family's run output by its name (default
    ``root/runs/<its out>``, :data:`FAMILIES`). Returns (and prints) what it did."""
    d = root / RESULTS
    done = []
    unknown = set(outs) - {fam.name for fam in FAMILIES}
    if unknown:
        raise TypeError(f"write_results: no family {', '.join(sorted(unknown))} (FAMILIES)")

    def write(name: str, rec: dict) -> None:
        write_text_atomic(d / name, json.dumps(annotate_record(name, rec), indent=1, sort_keys=True) + "\n")
        done.append(f"wrote {d / name}")

    record = read(d / "demo.json") or {}
    fresh = {part: runs for part, runs in (("full", demo), ("quick", demo_quick))
             if runs and all((r / "eval.json").is_file() for r in runs)}
    if fresh:
        new = collect_demo(fresh.get("full", []), fresh.get("quick", []))
        if not machines_only:
            write("demo.json", {**record, **{part: new[part] for part in fresh}})
        machines = (read(d / "machines.json") or {}).get("machines", {})
        write("machines.json", {"machines": file_by_machine(machines, {part: new[part] for part in fresh})})
    for part in sorted({"full", "quick"} - set(fresh)):
        done.append(f"kept the {part} demo of {d / 'demo.json'} (not every run of it has an eval.json)")
    if machines_only:
        print("\n".join(done))
        return done
    outs = {**outs, "horizon": horizon}
    fams = [("experiments", experiments, collect_experiments, False)]
    fams += [(f.name, Path(outs.get(f.name) or root / "runs" / f.out), f.collect, f.quiet) for f in FAMILIES]
    for name, out, fn, quiet in fams:
        if (out / "results.json").is_file():
            write(f"{name}.json", fn(out))
        elif not quiet:
            done.append(f"kept {d / name}.json (no {out / 'results.json'})" if (d / f"{name}.json").is_file()
                        else f"no {d / name}.json: no {out / 'results.json'}")
    arith = collect_arithmetic(arithmetic)
    if arith:
        write("arithmetic.json", arith)
    else:
        done.append(f"kept {d / 'arithmetic.json'} (no arithmetic demo run has a result.json)")
    for name, out, _, _ in fams:
        src, dst = out / f"{name}.png", f"docs/img/{name}.png"
        if any(f.name == name and f.figure for f in FAMILIES) and src.is_file():
            shutil.copyfile(src, root / dst)
            done.append(f"wrote {root / dst}")
    print("\n".join(done))
    return done


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fourfold.apps.publish", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("collect", "render", "check"))
    p.add_argument("--root", default=str(REPO), help="the checkout whose results/ and docs are read and written")
    p.add_argument("--demo", nargs="*", default=["runs/demo-s0", "runs/demo-s1", "runs/demo-s2"])
    p.add_argument("--demo-quick", nargs="*", default=["runs/demo-quick-s0", "runs/demo-quick-s1", "runs/demo-quick-s2"])
    for name, default in (("experiments", "experiments"), *((f.name, f.out) for f in FAMILIES)):  # each sweep's output
        p.add_argument(f"--{name}", default=f"runs/{default}")
    p.add_argument("--arithmetic", nargs="*", default=list(ARITHMETIC_RUNS), help="the `fourfold demo --task arithmetic` runs")
    p.add_argument("--machines-only", action="store_true",
                   help="collect: file the demo runs in results/machines.json alone (another machine's runs)")
    args = p.parse_args(argv)
    try:
        return _run(args)
    except (FourfoldError, FileNotFoundError) as e:  # a run output or results file missing, cut or incomplete
        print(f"{p.prog} {args.command}: error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    """One command of :func:`main` (its errors: a FourfoldError or a missing file)."""
    root = Path(args.root)
    if not root.is_dir():
        raise DataError(f"--root {root}: no such directory (the checkout whose results/ and docs are read)")
    if args.command == "collect":
        write_results(root, [root / r for r in args.demo], [root / r for r in args.demo_quick], root / args.experiments,
                      root / args.horizon, machines_only=args.machines_only,
                      arithmetic=[root / r for r in args.arithmetic],
                      **{f.name: root / getattr(args, f.name) for f in FAMILIES if f.name != "horizon"})
        return 0
    files = render(root)
    changed = [f for f, text in files.items() if (root / f).read_text(encoding="utf-8") != text]
    if args.command == "check":
        print("\n".join(f"{f}: differs from what results/ gives (python -m fourfold.apps.publish render)" for f in changed)
              or "published numbers match results/")
        return 1 if changed else 0
    for f in changed:
        write_text_atomic(root / f, files[f])
    print(f"rewrote {', '.join(changed) or 'nothing (already up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
