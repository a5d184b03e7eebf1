"""posttrainllm/rundir/outdir.py's checks, on directories laid out by hand: what is posttrainllm's, what is another
tool's run, what counts as results, the moved-aside slots and the lock. No model, no run."""

from __future__ import annotations

import json

import pytest

from posttrainllm.errors import UsageError
from posttrainllm.rundir import outdir as O
from posttrainllm.rundir.layout import FINAL_MARKER, HIDDEN, MANIFEST, MARKER, RUN_CONFIG, own


def _run_config(out, command: str = "sft") -> None:
    (out / RUN_CONFIG).write_text(json.dumps({"command": command}))


def test_entries_of_a_missing_directory_are_none(tmp_path):
    assert O.entries(tmp_path / "missing") == []
    (tmp_path / "b").write_text("")
    (tmp_path / "a").mkdir()
    assert O.entries(tmp_path) == ["a", "b"]


def test_a_run_is_posttrainllms_by_its_manifest_or_its_run_config(tmp_path):
    assert not O.made_by_posttrainllm(tmp_path)
    (tmp_path / HIDDEN).mkdir()
    assert not O.made_by_posttrainllm(tmp_path)  # an empty hidden folder proves nothing
    _run_config(tmp_path, "eval")
    assert not O.made_by_posttrainllm(tmp_path)  # not a training command
    (tmp_path / RUN_CONFIG).write_text("{broken")
    assert not O.made_by_posttrainllm(tmp_path)
    _run_config(tmp_path, "sft")
    assert O.made_by_posttrainllm(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    own(other, ["model.safetensors"])
    assert O.made_by_posttrainllm(other)


def test_a_linked_run_config_is_not_taken_for_posttrainllms(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"command": "sft"}))
    out = tmp_path / "out"
    out.mkdir()
    (out / RUN_CONFIG).symlink_to(real)
    assert not O.made_by_posttrainllm(out)


def test_foreign_entries_are_what_posttrainllm_did_not_write(tmp_path):
    _run_config(tmp_path)
    own(tmp_path, ["model.safetensors"])
    for name in ("model.safetensors", "notes.txt", "eval_results.json", "param_groups.json.tmp"):
        (tmp_path / name).write_text("")
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-4").write_text("a file")
    (tmp_path / "linked").symlink_to(tmp_path / "notes.txt")
    assert O.foreign(tmp_path) == ["checkpoint-4", "linked", "notes.txt"]


def test_another_tools_run_is_its_checkpoints_and_trainer_records(tmp_path):
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "trainer_state.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("")
    assert O.another_tools_run(tmp_path) == ["checkpoint-8", "trainer_state.json"]
    assert O.foreign(tmp_path) == ["checkpoint-8", "notes.txt", "trainer_state.json"]  # no run of ours: none ours
    _run_config(tmp_path)
    assert O.another_tools_run(tmp_path) == []


def test_only_pre_training_records_is_a_failed_start_or_a_dry_run(tmp_path):
    assert O.only_pre_training_records(tmp_path)  # empty
    _run_config(tmp_path)
    (tmp_path / "param_groups.json").write_text("{}")
    (tmp_path / "tokenizer").mkdir()
    assert not O.only_pre_training_records(tmp_path)  # a tokenizer/ posttrainllm did not record is the user's
    own(tmp_path, ["tokenizer"])  # pretrain records its tokenizer/ before writing it
    assert O.only_pre_training_records(tmp_path)
    (tmp_path / "checkpoint-1").mkdir()
    assert not O.only_pre_training_records(tmp_path)


def test_results_are_a_complete_checkpoint_or_a_finished_save(tmp_path):
    assert not O.has_results(tmp_path)
    (tmp_path / "checkpoint-2").mkdir()
    assert not O.has_results(tmp_path)  # cut short: no marker
    (tmp_path / "checkpoint-2" / MARKER).write_text("{}")
    assert O.has_results(tmp_path)
    done = tmp_path / "done"
    done.mkdir()
    (done / FINAL_MARKER).write_text("{}")
    assert O.has_results(done)


def test_slots_are_the_moved_aside_contents_oldest_first(tmp_path):
    assert O.slots(tmp_path) == []
    hidden = tmp_path / HIDDEN
    for name in (f"{O.SLOT_PREFIX}10", f"{O.SLOT_PREFIX}2", f"{O.SLOT_PREFIX}x", "other"):
        (hidden / name).mkdir(parents=True)
    (hidden / f"{O.SLOT_PREFIX}5").write_text("a file")
    assert [p.name for p in O.slots(tmp_path)] == [f"{O.SLOT_PREFIX}2", f"{O.SLOT_PREFIX}10"]
    assert O.made_by_posttrainllm(tmp_path)  # moved-aside contents are posttrainllm's doing
    assert O.needs_recovery(tmp_path)  # and nothing to keep came after them


def test_recover_puts_the_moved_aside_contents_back(tmp_path):
    slot = tmp_path / HIDDEN / f"{O.SLOT_PREFIX}1"
    slot.mkdir(parents=True)
    (slot / "model.safetensors").write_text("old")
    (slot / O.SLOT_MANIFEST).write_text(json.dumps({"files": ["model.safetensors"]}))
    (tmp_path / "run_config.json").write_text(json.dumps({"command": "sft"}))  # the unfinished run's record
    note = O.recover(tmp_path)
    assert note and "restored the previous contents" in note
    assert (tmp_path / "model.safetensors").read_text() == "old" and not (tmp_path / RUN_CONFIG).exists()
    assert json.loads((tmp_path / HIDDEN / MANIFEST).read_text()) == {"files": ["model.safetensors"]}
    assert O.slots(tmp_path) == [] and O.recover(tmp_path) is None


def test_recover_leaves_everything_when_something_foreign_appeared(tmp_path):
    slot = tmp_path / HIDDEN / f"{O.SLOT_PREFIX}1"
    slot.mkdir(parents=True)
    (slot / "model.safetensors").write_text("old")
    (tmp_path / "notes.txt").write_text("the user's")
    assert O.recover(tmp_path) is None
    assert (slot / "model.safetensors").is_file() and (tmp_path / "notes.txt").is_file()


def test_the_lock_is_exclusive_and_names_its_holder(tmp_path):
    first, second = O.Lock(tmp_path), O.Lock(tmp_path)
    assert first.acquire("OUT") is None
    held = json.loads((tmp_path / HIDDEN / O.LOCK_NAME).read_text())
    assert set(held) == {"pid", "host", "started"}
    with pytest.raises(UsageError, match="in use by another posttrainllm run"):
        second.acquire("OUT")
    first.release()
    assert not (tmp_path / HIDDEN / O.LOCK_NAME).exists()
    first.release()  # a second release does nothing
    assert second.acquire("OUT") is None
    second.release()


def test_a_dead_runs_lock_is_taken_over_with_a_note(tmp_path):
    (tmp_path / HIDDEN).mkdir()
    (tmp_path / HIDDEN / O.LOCK_NAME).write_text(json.dumps({"pid": 999999999, "host": "h", "started": 0}))
    lock = O.Lock(tmp_path)
    note = lock.acquire("OUT")
    assert note and "no longer running" in note and "PID 999999999 on h" in note
    lock.release()


def test_describe_names_an_unknown_holder_plainly():
    assert O.Lock.describe({}) == "PID ? on ?, started ?"


def test_a_users_dot_final_tmp_is_not_taken_for_posttrainllms(tmp_path):
    """The final save goes through OUT/.posttrainllm/final-tmp; a top-level `.final-tmp` is not ours, so
    --overwrite must refuse to replace it (it was once listed among the run's own records)."""
    from posttrainllm.rundir import outdir

    out = tmp_path / "o"
    out.mkdir()
    (out / ".final-tmp").write_text("the user's")
    (out / "run_config.json").write_text('{"command": "sft"}')  # a run of posttrainllm's (its record says so)
    assert outdir.foreign(out) == [".final-tmp"]
