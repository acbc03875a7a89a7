"""The applications' stage cache (fourfold.apps.cache): a stage reruns when its settings or an upstream
stage's key change, never otherwise; its DONE record can be read and written from outside."""
import json

from fourfold.apps.cache import Stages, digest, done_key, read_done, stage_key, write_done


def _run_all(out, settings, calls, fresh=False):
    stages = Stages(out, fresh)

    def stage(name):
        def fn(d):
            calls.append(name)
            (d / "out.txt").write_text(name)
            return {"n": len(calls)}
        return fn

    return [stages.run(name, settings.get(name, {}), stage(name), lambda msg: None) for name in ("a", "b")], stages


def test_a_stage_reruns_when_its_settings_or_upstream_change(tmp_path):
    calls = []
    first, stages = _run_all(tmp_path, {"a": {"x": 1}}, calls)
    assert calls == ["a", "b"] and [r["n"] for r in first] == [1, 2] and all("wall_s" in r for r in first)
    assert stages.keys == {"a": stage_key({"x": 1}, {}), "b": stage_key({}, {"a": stage_key({"x": 1}, {})})}
    again, _ = _run_all(tmp_path, {"a": {"x": 1}}, calls)
    assert calls == ["a", "b"] and again == first  # cached: the recorded results come back
    _run_all(tmp_path, {"b": {"y": 2}, "a": {"x": 1}}, calls)
    assert calls == ["a", "b", "b"]  # only b's settings changed
    _run_all(tmp_path, {"a": {"x": 2}, "b": {"y": 2}}, calls)
    assert calls == ["a", "b", "b", "a", "b"]  # a changed: b is downstream of it
    _run_all(tmp_path, {"a": {"x": 2}, "b": {"y": 2}}, calls, fresh=True)
    assert calls == ["a", "b", "b", "a", "b", "a", "b"]  # --fresh: every stage again


def test_done_records_round_trip(tmp_path):
    assert read_done(tmp_path, "sft") is None and done_key(tmp_path, "sft") is None
    write_done(tmp_path, "sft", "0123456789abcdef", {"eval_loss": 1.5})
    record = json.loads((tmp_path / "stages" / "sft" / "DONE").read_text())
    assert record == read_done(tmp_path, "sft") == {"key": "0123456789abcdef", "result": {"eval_loss": 1.5}}
    assert done_key(tmp_path, "sft") == "0123456789abcdef"
    (tmp_path / "stages" / "sft" / "DONE").write_text("not json")
    assert read_done(tmp_path, "sft") is None


def test_digest_is_order_independent_and_short():
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2}) and len(digest({})) == 16


def test_an_unfinished_stage_of_another_config_is_cleared_and_one_of_this_config_resumes(tmp_path):
    """An interrupted full demo, then --quick in the same directory (issue 40, item 1): the quick
    run's sft stage must not find the full run's checkpoint; an interrupted run of the same config
    finds its own."""
    import pytest

    stages, logs = Stages(tmp_path, False), []

    def interrupted(d):
        (d / "checkpoint").write_text("full")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stages.run("sft", {"records": 20000}, interrupted, logs.append)
    seen = []

    def resumes(d):
        seen.append((d / "checkpoint").read_text() if (d / "checkpoint").exists() else None)
        return {}

    Stages(tmp_path, False).run("sft", {"records": 20000}, resumes, logs.append)  # the same config
    assert seen == ["full"] and logs == []
    with pytest.raises(KeyboardInterrupt):
        Stages(tmp_path, True).run("sft", {"records": 20000}, interrupted, logs.append)
    Stages(tmp_path, False).run("sft", {"records": 12000}, resumes, logs.append)  # --quick: another config
    assert seen == ["full", None]
    assert len(logs) == 1 and "an unfinished run of another configuration was in" in logs[0] and "cleared" in logs[0]
