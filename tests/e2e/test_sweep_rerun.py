"""A sweep is a resumable experiment: run again with a changed setting, a changed input file or an added merge α,
it re-runs what changed, keeps every other result, and never loses a point from results.json; with
--discard-weights no weights are kept at all. Every input of every sweep here is hashed before and after: a sweep
never writes into what it reads."""

import hashlib
import json
from pathlib import Path

import pytest
from harness import run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def _hashes(*paths: Path) -> dict[str, str]:
    """Every file under each input (a file, or a model folder), by path: its SHA-256."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*"))) if f.is_file()]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def _sweep(model, data, ood, out, *extra, steps=2, **options):
    args = run_args("sft", model, data, out, *extra, steps=steps, batch=4, max_length=128, lr="3e-3", **options)
    return runner.invoke(app, ["sweep", *args, "--ood-eval", str(ood)])


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def _points(records: list[dict]) -> dict[str, dict]:
    return {r["cell"]: r for r in records}


@pytest.mark.smoke
def test_a_changed_setting_reruns_its_cells_and_an_added_alpha_adds_points_keeping_every_earlier_one(
    tiny_model_dir, alpaca_file, ood_file, tmp_path
):
    before = _hashes(tiny_model_dir, alpaca_file, ood_file)
    out = tmp_path / "sweep"
    merge = dict(eval_dataset=alpaca_file)
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, merge_alpha="0.5", **merge)
    assert r.exit_code == 0, r.output
    first = _results(out)
    assert not first["failed"] and {c.get("merge") for c in first["cells"]} == {None, "merge-a0.5"}

    # a changed setting (--max-steps): the cell and its merge run again, with the new setting
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, steps=3, merge_alpha="0.5", **merge)
    assert r.exit_code == 0, r.output
    assert "0 already done, 1 to run" in r.output
    second = _results(out)
    assert not second["failed"] and len(second["cells"]) == 2 and second["summary"]
    (cell,) = [c for c in second["cells"] if not c.get("merge")]
    assert json.loads((out / "cells" / cell["cell"] / "run_config.json").read_text())["max_steps"] == 3
    assert cell["fingerprint"] != _points(first["cells"])[cell["cell"]]["fingerprint"]
    # ... and the points of the first run are kept, as earlier points (not on this frontier)
    kept = {(p["cell"], p["fingerprint"]) for p in second["earlier"]}
    assert {(p["cell"], p["fingerprint"]) for p in first["cells"]} <= kept
    assert "Earlier points" in (out / "results.md").read_text()

    # an added α: one more point; the cell is not trained again and the α = 0.5 point is kept as measured
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, steps=3, merge_alpha="0.5,0.25", **merge)
    assert r.exit_code == 0, r.output
    assert "1 already done, 0 to run" in r.output
    third = _results(out)
    assert not third["failed"]
    points = _points(third["cells"])
    assert set(points) == {cell["cell"], f"{cell['cell']}/merge-a0.5", f"{cell['cell']}/merge-a0.25"}
    assert points[f"{cell['cell']}/merge-a0.5"] == _points(second["cells"])[f"{cell['cell']}/merge-a0.5"]
    assert {(p["cell"], p["fingerprint"]) for p in first["cells"]} <= {
        (p["cell"], p["fingerprint"]) for p in third["earlier"]
    }
    log = (out / "logs" / f"{cell['cell']}.merge.log").read_text().splitlines()[0]
    assert log.split("--alpha ")[1].split()[0] == "0.25"  # only the new α was merged and measured
    assert _hashes(tiny_model_dir, alpaca_file, ood_file) == before


@pytest.mark.smoke
def test_discard_weights_keeps_no_weights_and_a_later_merge_says_how_to_get_them_back(
    tiny_model_dir, alpaca_file, ood_file, tmp_path
):
    before = _hashes(tiny_model_dir, alpaca_file, ood_file)
    out = tmp_path / "sweep"
    extra = dict(eval_dataset=alpaca_file, save_steps=1, discard_weights=True)
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, merge_alpha="0.5", **extra)
    assert r.exit_code == 0, r.output
    first = _results(out)
    assert not first["failed"]
    weights = [
        p for p in out.rglob("*") if p.suffix == ".safetensors" or p.name in ("optimizer.pt", "pytorch_model.bin")
    ]
    assert not weights and not list(out.rglob("checkpoint-*"))

    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, merge_alpha="0.5,0.25", **extra)
    assert r.exit_code == 1, r.output
    (line,) = [x for x in r.output.splitlines() if "error:" in x]
    assert "--discard-weights" in line and "run the sweep again" in line
    second = _results(out)
    assert _points(first["cells"]).items() <= _points(second["cells"]).items()  # every point measured is kept
    assert _hashes(tiny_model_dir, alpaca_file, ood_file) == before


@pytest.mark.smoke
def test_an_input_changed_in_place_reruns_the_cells_that_read_it(tiny_model_dir, alpaca_file, ood_file, tmp_path):
    replay = tmp_path / "replay.txt"
    replay.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = tmp_path / "sweep"
    extra = dict(eval_split="0.25", replay_dataset=replay, replay_ratio="0,0.25")
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, **extra)
    assert r.exit_code == 0, r.output
    first = _points(_results(out)["cells"])

    # the replay file rewritten in place: only the cell that mixes it in reads it
    replay.write_text("a rewritten replay text, other words entirely. " * 40)
    before = _hashes(tiny_model_dir, alpaca_file, ood_file, replay)
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, **extra)
    assert r.exit_code == 0, r.output
    assert "1 already done, 1 to run" in r.output
    second = _points(_results(out)["cells"])
    (changed,) = [n for n in second if second[n]["fingerprint"] != first[n]["fingerprint"]]
    assert second[changed]["replay_ratio"] == 0.25

    # the held-out text rewritten in place: every cell reads it
    ood_file.write_text("the held-out text, now another one. " * 80)
    before = _hashes(tiny_model_dir, alpaca_file, ood_file, replay)
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, **extra)
    assert r.exit_code == 0, r.output
    assert "0 already done, 2 to run" in r.output
    assert _hashes(tiny_model_dir, alpaca_file, ood_file, replay) == before
    # and the same contents again: nothing runs
    r = _sweep(tiny_model_dir, alpaca_file, ood_file, out, **extra)
    assert r.exit_code == 0 and "2 already done, 0 to run" in r.output
    assert _hashes(tiny_model_dir, alpaca_file, ood_file, replay) == before
