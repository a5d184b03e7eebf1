"""What a sweep keeps between runs (posttrainllm/sweep/records.py): a cell's identity holds its inputs' contents
as --resume reads them, no earlier point is dropped from results.json, and --discard-weights leaves no weights."""

import json

import pytest

from posttrainllm.rundir.fingerprint import identity
from posttrainllm.sweep.grid import Cell, SweepSpec
from posttrainllm.sweep.records import (
    cell_identity,
    discard_weights,
    earlier_points,
    has_weights,
    why_again,
    write_record,
)
from posttrainllm.sweep.runner import _identity


@pytest.fixture
def files(tmp_path):
    row = '{"instruction": "Add 1 and 2.", "input": "", "output": "3"}\n'
    found = {}
    for name, text in (("d.jsonl", row), ("e.jsonl", row), ("o.txt", "held-out. " * 8), ("r.txt", "replay. ")):
        (tmp_path / name).write_text(text)
        found[name] = tmp_path / name
    return found


def _spec(files, tmp_path):
    options = ["--model", "m", "--dataset", str(files["d.jsonl"]), "--eval-dataset", str(files["e.jsonl"])]
    options += ["--ood-eval", str(files["o.txt"]), "--replay-dataset", str(files["r.txt"])]
    return SweepSpec("sft", [1.0], [1e-3], [0.0, 0.25], [0], 1, 5.0, tmp_path / "sweep", options)


def test_a_cells_inputs_are_read_as_resume_reads_them(files, tmp_path):
    spec = _spec(files, tmp_path)
    ident = _identity(spec, Cell(1.0, 1e-3, 0.25, 0), {})
    assert ident["inputs"]["dataset"] == identity("path", str(files["d.jsonl"]))
    assert ident["inputs"]["ood_eval"] == identity("path", [str(files["o.txt"])])
    assert ident["inputs"]["replay_dataset"] == identity("path", str(files["r.txt"]))
    assert ident["inputs"]["model"] is None  # a hub id: compared as typed, in the command line
    assert "--eval-cache" not in ident["argv"]


@pytest.mark.parametrize(
    "name, readers", [("r.txt", {0.25}), ("o.txt", {0.0, 0.25}), ("d.jsonl", {0.0, 0.25}), ("e.jsonl", {0.0, 0.25})]
)
def test_a_file_rewritten_in_place_changes_the_fingerprint_of_the_cells_that_read_it(name, readers, files, tmp_path):
    spec = _spec(files, tmp_path)
    cells = spec.cells()
    before = {c.replay_ratio: _identity(spec, c, {}) for c in cells}
    files[name].write_text(files[name].read_text() + "one more line\n")
    after = {c.replay_ratio: _identity(spec, c, {}) for c in cells}
    changed = {r for r in before if before[r]["fingerprint"] != after[r]["fingerprint"]}
    assert changed == readers
    for r in changed:
        option = {
            "r.txt": "--replay-dataset",
            "o.txt": "--ood-eval",
            "d.jsonl": "--dataset",
            "e.jsonl": "--eval-dataset",
        }
        option = option[name]
        saved = {"settings": {"argv": before[r]["argv"], "inputs": before[r]["inputs"]}}
        assert why_again(saved, after[r]) == f"the contents of {option} changed"


def test_the_same_contents_under_the_same_settings_are_the_same_cell(files, tmp_path):
    spec = _spec(files, tmp_path)
    cell = Cell(1.0, 1e-3, 0.25, 0)
    first = _identity(spec, cell, {})
    files["r.txt"].write_text(files["r.txt"].read_text())  # written again, same bytes
    assert _identity(spec, cell, {})["fingerprint"] == first["fingerprint"]
    other = cell_identity("sft", [*first["argv"], "--max-steps", "3"], {})
    assert other["fingerprint"] != first["fingerprint"]
    assert why_again({"settings": {"argv": first["argv"], "inputs": first["inputs"]}}, other) == "its settings changed"
    assert why_again({"fingerprint": "old"}, other) == "recorded by an earlier version of the sweep"


def test_no_earlier_point_is_dropped():
    first = [{"cell": "a", "fingerprint": "1", "eval_loss": 2.0}, {"cell": "a/merge-a0.5", "fingerprint": "m1"}]
    now = [{"cell": "a", "fingerprint": "2", "eval_loss": 1.9}]
    kept = earlier_points({"cells": first}, now)
    assert kept == first
    again = earlier_points({"cells": now, "earlier": kept}, [{"cell": "a", "fingerprint": "3"}])
    assert again == [*now, *first]
    assert earlier_points({"cells": now, "earlier": kept}, now) == first  # measured again: not earlier
    assert earlier_points(None, now) == [] and earlier_points({"cells": "garbage"}, now) == []


def test_discard_weights_leaves_no_weights_and_no_checkpoints_and_keeps_the_records(tmp_path):
    d = tmp_path / "cell"
    (d / "checkpoint-2").mkdir(parents=True)
    for name in ("model.safetensors", "adapter_model.safetensors", "training_args.bin", "eval_results.json"):
        (d / name).write_text("x")
    (d / "checkpoint-2" / "optimizer.pt").write_text("x")
    write_record(d, "sweep_cell.json", {"cell": "c"})
    assert has_weights(d)
    discard_weights(d)
    assert not has_weights(d) and not (d / "checkpoint-2").exists()
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == [
        "eval_results.json",
        "sweep_cell.json",
        "training_args.bin",
    ]


def test_the_sweeps_records_are_recorded_as_posttrainllms_so_overwrite_replaces_them(tmp_path):
    from posttrainllm.rundir.outdir import foreign

    d = tmp_path / "cell"
    d.mkdir()
    write_record(d, "sweep_cell.json", {"cell": "c"})
    assert json.loads((d / "sweep_cell.json").read_text()) == {"cell": "c"} and foreign(d) == []
