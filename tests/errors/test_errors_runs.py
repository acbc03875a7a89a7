"""Output directories, resume and failed saves: a used directory needs --resume or --overwrite, a
bad output_dir is one line naming it, a corrupt checkpoint is passed over loudly (all corrupt: an
error), a changed model or batch size (or architecture) cannot be resumed, and a disk that fills up
while saving is one line naming the checkpoint, the last good one intact."""
import errno
import json
import os
import resource

import pytest
import safetensors.torch
from errortest_utils import cli, cli_output, copy_model, one_line_error, sft_args

from fourfold.checkpoint import checkpoint_dirs, latest_checkpoint, load_checkpoint
from fourfold.config import SFTConfig, load_config
from fourfold.errors import ConfigError
from fourfold.reporting import read_metrics
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers import sft


def _flag(argv: list[str], flag: str) -> list[str]:
    return [argv[0], flag, *argv[1:]]


def _steps(out) -> list[int]:
    return [r["step"] for r in read_metrics(out / "metrics.jsonl")]


def _checkpoints(out) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


def _trained(capsys, zoo, out, *extra) -> None:
    code, err = cli(capsys, sft_args(zoo, out, "run.save_every=1", *extra))
    assert code == 0, err


def _flip_a_byte(checkpoint) -> None:
    f = checkpoint / "modules" / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # same size, other content: only the sha256 tells
    f.write_bytes(bytes(data))


# ---- output directories ------------------------------------------------------------------------


def test_a_used_output_directory_needs_resume_or_overwrite(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=3")
    assert _checkpoints(out) == ["step-00000002", "step-00000003"]
    before = (out / "metrics.jsonl").read_bytes()
    one_line_error(capsys, sft_args(zoo, out), str(out), "already holds a run", "--resume", "--overwrite")
    assert (out / "metrics.jsonl").read_bytes() == before and _checkpoints(out) == ["step-00000002", "step-00000003"]
    code, err = cli(capsys, _flag(sft_args(zoo, out, "train.max_steps=1"), "--overwrite"))
    assert code == 0, err
    assert _steps(out) == [1] and _checkpoints(out) == ["step-00000001"]  # nothing of the old run is left
    one_line_error(capsys, _flag(sft_args(zoo, out), "--overwrite") + ["run.resume=true"], "run.overwrite", "run.resume")


def test_the_python_api_refuses_a_used_directory_too(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=1")
    cfg = load_config(SFTConfig, None, sft_args(zoo, out)[1:])
    with pytest.raises(ConfigError, match="already holds a run"):
        sft.train(cfg)


@pytest.mark.parametrize("case", ["empty", "a file", "under a file"])
def test_an_output_dir_that_cannot_be_one(zoo, tmp_path, capsys, case):
    (tmp_path / "file").write_text("x")
    value = {"empty": "", "a file": tmp_path / "file", "under a file": tmp_path / "file" / "run"}[case]
    line = one_line_error(capsys, sft_args(zoo, value), "run.output_dir")
    assert ("empty" in line) if case == "empty" else (str(value) in line)
    if case == "empty":  # the API, which does not go through the CLI's validation, refuses it too
        cfg = load_config(SFTConfig, None, sft_args(zoo, tmp_path / "x")[1:])
        cfg.run.output_dir = ""
        with pytest.raises(ConfigError, match="run.output_dir: must not be empty"):
            RunScaffold(cfg)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_dir(zoo, tmp_path, capsys):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        one_line_error(capsys, sft_args(zoo, out), "run.output_dir", str(out), "cannot be created or written")
    finally:
        out.chmod(0o755)


# ---- resume --------------------------------------------------------------------------------------


def test_resume_where_there_is_no_checkpoint_is_an_error_and_creates_nothing(zoo, tmp_path, capsys):
    """A mistyped --output-dir with --resume never starts a long run over from step 0."""
    typo = tmp_path / "rnu"
    one_line_error(capsys, _flag(sft_args(zoo, typo), "--resume"), "run.resume", str(typo), "holds no checkpoint")
    assert not typo.exists()
    out = tmp_path / "run"  # a run killed before its first checkpoint: --overwrite starts it over
    _trained(capsys, zoo, out, "train.max_steps=2", "run.save_every=0")
    for ckpt in checkpoint_dirs(out):
        for f in sorted(ckpt.rglob("*"), reverse=True):
            f.rmdir() if f.is_dir() else f.unlink()
        ckpt.rmdir()
    before = (out / "metrics.jsonl").read_bytes()
    one_line_error(capsys, _flag(sft_args(zoo, out), "--resume"), "holds no checkpoint", "--overwrite")
    assert (out / "metrics.jsonl").read_bytes() == before


def test_resume_past_the_end_of_a_shorter_run_is_refused(zoo, tmp_path, capsys):
    """A checkpoint at step 3 resumed with train.max_steps=2: refused, naming the key and the step,
    before anything is exported (the model/ of the longer run stays as it was)."""
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=3")
    model = (out / "model" / "model.safetensors").read_bytes()
    one_line_error(capsys, _flag(sft_args(zoo, out, "train.max_steps=2"), "--resume"), "train.max_steps: 2",
                   "step 3", "past the end")
    assert (out / "model" / "model.safetensors").read_bytes() == model and _steps(out) == [1, 2, 3]
    code, err = cli(capsys, _flag(sft_args(zoo, out, "train.max_steps=3"), "--resume"))  # the same end: done
    assert code == 0 and _steps(out) == [1, 2, 3], err


def test_resume_passes_over_a_corrupt_newest_checkpoint_and_says_so(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=2")
    _flip_a_byte(out / "checkpoints" / "step-00000002")
    code, shown, err = cli_output(capsys, _flag(sft_args(zoo, out, "train.max_steps=3"), "--resume"))
    assert code == 0 and err == "", err
    lines = [line for line in shown.splitlines() if "warning" in line]
    assert len(lines) == 1 and lines[0].startswith("fourfold sft: warning: ") and "Traceback" not in shown, shown
    assert "step-00000002" in lines[0] and "sha256" in lines[0] and "resuming from the older step-00000001" in lines[0]
    assert _steps(out) == [1, 2, 3]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "warning" and "step-00000002" in e["message"] for e in events)


def test_resume_with_every_checkpoint_corrupt_is_an_error(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=2")
    _flip_a_byte(out / "checkpoints" / "step-00000002")
    (out / "checkpoints" / "step-00000001" / "COMPLETE").unlink()
    before = (out / "metrics.jsonl").read_bytes()
    one_line_error(capsys, _flag(sft_args(zoo, out), "--resume"), "every checkpoint", "corrupt", "--overwrite")
    assert (out / "metrics.jsonl").read_bytes() == before  # never a silent restart


@pytest.mark.parametrize("change", ["train.batch_size=4", "model.path"])
def test_resume_with_another_batch_size_or_model_is_an_error(zoo, tmp_path, capsys, change):
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=1")
    if change == "model.path":
        change = f"model.path={copy_model(zoo['lm_other'], tmp_path / 'other')}"
    key = change.split("=")[0]
    one_line_error(capsys, _flag(sft_args(zoo, out, change), "--resume"), key, "when the checkpoints", str(out))
    code, err = cli(capsys, _flag(sft_args(zoo, out, "train.max_steps=2"), "--resume"))  # the same settings resume
    assert code == 0 and _steps(out) == [1, 2], err


def test_resume_into_another_architecture_names_the_key(zoo, tmp_path, capsys):
    model = copy_model(zoo["lm"], tmp_path / "model")
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=1", f"model.path={model}")
    for f in model.iterdir():
        f.unlink()
    copy_model(zoo["lm_wide"], tmp_path / "wide")
    for f in (tmp_path / "wide").iterdir():
        f.rename(model / f.name)  # the same path now holds a wider model
    one_line_error(capsys, _flag(sft_args(zoo, out, "train.max_steps=2", f"model.path={model}"), "--resume"),
                   "modules/model", "shape", "another architecture")


# ---- a disk that fills up while saving ---------------------------------------------------------


def test_a_full_disk_while_saving_names_the_checkpoint_and_keeps_the_last_good_one(zoo, tmp_path, capsys, monkeypatch):
    real = safetensors.torch.save_file

    def full_at_step_2(tensors, filename, metadata=None):
        if "step-00000002" in str(filename):
            raise OSError(errno.ENOSPC, "No space left on device")  # no file name: as a real full disk reports
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_at_step_2)
    out = tmp_path / "run"
    one_line_error(capsys, sft_args(zoo, out, "run.save_every=1", "train.max_steps=3"),
                   str(out / "checkpoints" / "step-00000002"), "No space left on device")
    assert _checkpoints(out) == ["step-00000001"]  # no half-written step-2, no temporary directory
    monkeypatch.undo()
    load_checkpoint(latest_checkpoint(out))  # whole: every sha256 matches
    code, err = cli(capsys, _flag(sft_args(zoo, out, "run.save_every=1", "train.max_steps=3"), "--resume"))
    assert code == 0 and _steps(out) == [1, 2, 3], err


def test_the_file_size_limit_while_saving(zoo, tmp_path, capsys):
    out = tmp_path / "run"
    _trained(capsys, zoo, out, "train.max_steps=1")
    good = latest_checkpoint(out)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (12_000, hard))  # below the model's weight files, above the logs
    try:
        code, err = cli(capsys, _flag(sft_args(zoo, out, "run.save_every=1", "train.max_steps=2"), "--resume"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert str(out / "checkpoints" / "step-00000002") in lines[0] and "File too large" in lines[0]
    assert checkpoint_dirs(out) == [good]
    load_checkpoint(good)
