"""posttrainllm/rundir/checkpoints.py without a trainer: which checkpoint a resume starts from and which it skips,
run_config.json and its history, a resume of another run refused, and a failed save told apart from a full disk."""

from __future__ import annotations

import errno
import json

import pytest

from posttrainllm.errors import TrainingError, UsageError
from posttrainllm.rundir import checkpoints
from posttrainllm.rundir.layout import MARKER, RUN_CONFIG, file_sizes


def _checkpoint(out, step: int, *, complete: bool = True):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x" * step)
    if complete:
        (d / MARKER).write_text(json.dumps({"files": file_sizes(d)}))
    return d


def test_a_resume_starts_from_the_newest_complete_checkpoint_and_says_what_it_skipped(tmp_path):
    _checkpoint(tmp_path, 2)
    good = _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 6, complete=False)
    found, skipped = checkpoints.resume_checkpoint(tmp_path)
    assert found == good
    assert [(d.name, why) for d, why in skipped] == [("checkpoint-6", "no COMPLETE marker: its save was cut short")]
    assert checkpoints.describe_skipped(skipped) == "checkpoint-6 (no COMPLETE marker: its save was cut short)"


def test_a_resume_with_no_complete_checkpoint_is_a_usage_error_naming_them(tmp_path):
    with pytest.raises(UsageError, match="no complete checkpoint"):
        checkpoints.resume_checkpoint(tmp_path)
    _checkpoint(tmp_path, 3, complete=False)
    with pytest.raises(UsageError, match=r"1 checkpoint\(s\) skipped: checkpoint-3 \(no COMPLETE marker"):
        checkpoints.resume_checkpoint(tmp_path)


def test_run_config_keeps_the_replaced_settings_as_history(tmp_path):
    first = {"command": "sft", "lr": 1e-5, "logging_steps": 5}
    checkpoints.write_run_config(tmp_path, first, resume=False)
    assert json.loads((tmp_path / RUN_CONFIG).read_text()) == first
    checkpoints.write_run_config(tmp_path, dict(first), resume=True)  # the same run: left as it is
    assert json.loads((tmp_path / RUN_CONFIG).read_text()) == first
    second = {**first, "logging_steps": 10}  # a free setting: recorded, the old one kept
    checkpoints.write_run_config(tmp_path, second, resume=True)
    assert json.loads((tmp_path / RUN_CONFIG).read_text()) == {**second, "history": [first]}
    third = {**second, "lr": 2e-5}
    checkpoints.write_run_config(tmp_path, third, resume=True)
    assert json.loads((tmp_path / RUN_CONFIG).read_text()) == {**third, "history": [first, second]}
    checkpoints.write_run_config(tmp_path, first, resume=False)  # a new run: no history
    assert json.loads((tmp_path / RUN_CONFIG).read_text()) == first


def test_a_resume_of_another_run_is_refused_unless_the_change_is_allowed(tmp_path):
    saved = {"command": "sft", "lr": 1e-5, "logging_steps": 5, "max_steps": 50}
    checkpoints.check_resume_config(tmp_path, saved, allow_change=False)  # no record yet: nothing to compare
    checkpoints.write_run_config(tmp_path, saved, resume=False)
    checkpoints.check_resume_config(tmp_path, {**saved, "logging_steps": 50}, allow_change=False)  # free
    assert not checkpoints.asks_for_more(tmp_path, {**saved, "logging_steps": 50})
    assert checkpoints.asks_for_more(tmp_path, {**saved, "max_steps": 100})
    with pytest.raises(UsageError, match="--allow-config-change"):
        checkpoints.check_resume_config(tmp_path, {**saved, "lr": 2e-5}, allow_change=False)
    checkpoints.check_resume_config(tmp_path, {**saved, "lr": 2e-5}, allow_change=True)
    assert checkpoints.config_diffs(tmp_path, {**saved, "lr": 2e-5}) == [("lr", "1e-05", "2e-05")]


def test_a_full_disk_removes_the_half_written_checkpoint_and_names_the_last_good_one(tmp_path):
    _checkpoint(tmp_path, 2)
    half = _checkpoint(tmp_path, 4, complete=False)
    wrapped = RuntimeError("writer failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    error = checkpoints.disk_full_error(wrapped, half, 1000)
    assert isinstance(error, TrainingError) and not half.exists()
    assert "No space left on device while saving checkpoint-4" in str(error)
    assert "the last good checkpoint, checkpoint-2, is kept" in str(error)


def test_an_unrelated_save_error_is_not_called_a_full_disk(tmp_path):
    from posttrainllm.rundir.checkpoints import disk_full_error

    assert disk_full_error(RuntimeError("some other failure"), tmp_path / "checkpoint-3", 1000) is None
    assert disk_full_error(OSError(13, "Permission denied"), tmp_path / "checkpoint-3", 1000) is None
