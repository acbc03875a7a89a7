"""The tail every experiment family's runner shares (fourfold.apps.experiments.jobs): what --fresh
removes, the jobs run with the config's workers and threads, and the notes and error on the jobs
that did not finish."""
import sys

import pytest

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.experiments.jobs import (
    ExperimentError,
    Job,
    clear_dirs,
    failed_notes,
    raise_unfinished,
    run_family_jobs,
    unfinished,
)
from fourfold.config import load_config

STATE = {"a/seed0": "done", "a/seed1": "failed: exit status 3 (log: logs/a_seed1.log)", "b/seed0": "cached",
         "c/seed0": "skipped: a/seed1 did not finish", "d": "failed: ValueError: bad config"}


def test_clear_dirs_removes_only_the_named_dirs_that_exist(tmp_path):
    for d in ("runs/ppo/seed0", "logs", "configs", "baseline", "keep"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "runs" / "ppo" / "seed0" / "final_eval.json").write_text("{}")
    (tmp_path / "results.json").write_text("{}")
    clear_dirs(tmp_path, ("runs", "bon", "configs", "logs"))  # "bon" does not exist: nothing to do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline", "keep", "results.json"]
    clear_dirs(tmp_path, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline", "keep", "results.json"]


def test_unfinished_jobs_notes_and_error():
    assert unfinished(STATE) == {"a/seed1": "failed: exit status 3 (log: logs/a_seed1.log)",
                                 "c/seed0": "skipped: a/seed1 did not finish", "d": "failed: ValueError: bad config"}
    assert failed_notes(STATE) == ["a/seed1: failed: exit status 3 (log: logs/a_seed1.log)",
                                   "c/seed0: skipped: a/seed1 did not finish", "d: failed: ValueError: bad config"]
    assert failed_notes({"a": "done", "b": "cached"}) == []
    raise_unfinished({"a": "done", "b": "cached"}, 2, "out/logs")  # every job finished: nothing raised
    with pytest.raises(ExperimentError) as e:
        raise_unfinished(STATE, 7, "out/logs")
    assert str(e.value) == ("3 of 7 jobs did not finish (a/seed1, c/seed0, d); the report covers the rest; "
                            "logs in out/logs; rerun to resume")


def test_run_family_jobs_logs_under_out(tmp_path):
    cfg = load_config(ExperimentsConfig, None, ["workers=1", "run.threads=1"])
    jobs = [Job("a/seed0", lambda: [[sys.executable, "-c", "print('hi')"]]), Job("b", lambda: [], deps=("a/seed0",))]
    lines = []
    state, jobs_s = run_family_jobs(cfg, tmp_path, lines.append, jobs)
    assert state == {"a/seed0": "done", "b": "cached"} and jobs_s > 0
    assert (tmp_path / "logs" / "a_seed0.log").read_text().splitlines()[-1] == "hi"
    assert lines[0] == "  start a/seed0" and lines[1].startswith("  done  a/seed0 in ")
