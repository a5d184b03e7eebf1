"""`posttrainllm sweep`: a 2×2 grid on a tiny model completes, is skipped cell by cell when run again, and its
recommendation follows from the numbers in results.json (recomputed here independently)."""

import json
import statistics

import pytest
from harness import cli_args, run_args
from typer.testing import CliRunner

from posttrainllm.cli import app

runner = CliRunner()


def _grid(model, data, ood, out, *extra):
    return [
        "sweep",
        *run_args(
            "sft",
            model,
            data,
            out,
            *extra,
            steps=3,
            batch=4,
            max_length=128,
            lr="1e-3,3e-3",
            eval_split="0.25",
            ood_eval=ood,
            llrd="1.0,0.5",
            jobs=2,
        ),
    ]


def _recompute(cells, max_forgetting):
    """The recommendation from the raw cells, written without posttrainllm's code."""
    points = {}
    for c in cells:
        points.setdefault((c["gamma"], c["lr"], c["replay_ratio"]), []).append(c)
    rows = []
    for (g, lr, rr), runs in points.items():
        ev = statistics.fmean(r["eval_loss"] for r in runs)
        worst = max(statistics.fmean(r["ood_change_pct"][k] for r in runs) for k in runs[0]["ood_change_pct"])
        rows.append((g, lr, rr, ev, worst))
    ok = [r for r in rows if r[4] <= max_forgetting]
    best = min(ok, key=lambda r: (r[3], r[4], r[0], r[1], r[2])) if ok else None
    top = min(r[3] for r in rows)
    near = [r for r in rows if r[3] <= top * 1.01]
    least = min(near, key=lambda r: (r[4], r[3], r[0], r[1], r[2]))
    return best, least, rows


@pytest.mark.smoke
def test_sweep_runs_skips_done_cells_and_recommends_from_its_numbers(tiny_model_dir, alpaca_file, ood_file, tmp_path):
    out = tmp_path / "sweep"
    r = runner.invoke(app, _grid(tiny_model_dir, alpaca_file, ood_file, out))
    assert r.exit_code == 0, r.output
    result = json.loads((out / "results.json").read_text())
    assert len(result["cells"]) == 4 and not result["failed"]
    for name in ("results.md", "frontier.png"):
        assert (out / name).stat().st_size > 0
    for c in result["cells"]:  # each cell is a normal run with its own record
        cfg = json.loads((out / "cells" / c["cell"] / "run_config.json").read_text())
        assert cfg["lr"] == c["lr"] and cfg["llrd"] == c["gamma"]
        evals = json.loads((out / "cells" / c["cell"] / "eval_results.json").read_text())
        assert c["eval_loss"] == evals["train"]["eval_loss"]
        assert c["ood_change_pct"]["ood.txt"] == evals["ood"]["ood.txt"]["change_pct"]

    # recommendation: recomputed independently, for two budgets (one that every cell meets, one that none meets)
    for budget in (1e9, -1e9):
        best, least, rows = _recompute(result["cells"], budget)
        from posttrainllm.sweep import recommend, summarize

        rec = recommend(summarize(result["cells"]), budget)
        if best is None:
            assert rec["best"] is None
        else:
            assert (rec["best"]["llrd"], rec["best"]["lr"]) == best[:2]
            assert rec["best"]["eval_loss"] == pytest.approx(best[3])
        assert (rec["least_forgetting"]["llrd"], rec["least_forgetting"]["lr"]) == least[:2]
    best, least, _ = _recompute(result["cells"], result["max_forgetting_pct"])
    saved = result["recommendation"]
    assert (saved["least_forgetting"]["llrd"], saved["least_forgetting"]["lr"]) == least[:2]
    assert (saved["best"] is None) == (best is None)
    if best is not None:
        assert (saved["best"]["llrd"], saved["best"]["lr"]) == best[:2]

    # run again: every cell is skipped, no cell file is touched
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("*") if p.is_file()}
    again = runner.invoke(app, _grid(tiny_model_dir, alpaca_file, ood_file, out))
    assert again.exit_code == 0, again.output
    assert "4 already done, 0 to run" in again.output
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "cells").rglob("*") if p.is_file()}

    # a wider grid re-uses the finished cells and runs only the new ones
    wider = _grid(tiny_model_dir, alpaca_file, ood_file, out)
    wider[wider.index("1e-3,3e-3")] = "1e-3,3e-3,2e-3"
    third = runner.invoke(app, wider)
    assert third.exit_code == 0, third.output
    assert "4 already done, 2 to run" in third.output


@pytest.mark.parametrize(
    "extra,fragment",
    [
        (["--llrd", "1.0,0.3"], "[0.5, 1.0]"),
        (["--lr", "fast"], "comma-separated list of numbers"),
        (["--overwrite"], "not available in a sweep"),
        (["--jobs", "0"], "--jobs must be >= 1"),
    ],
)
def test_sweep_validates_every_cell_before_running_anything(
    extra, fragment, tiny_model_dir, alpaca_file, ood_file, tmp_path
):
    args = _grid(tiny_model_dir, alpaca_file, ood_file, tmp_path / "s")
    for flag, value in zip(extra[::2], extra[1::2] + [None] * len(extra)):
        if flag in args and value is not None:
            args[args.index(flag) + 1] = value
        else:
            args.append(flag)
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert fragment in r.output and not (tmp_path / "s" / "cells").exists()


def test_sweep_needs_in_domain_eval_and_ood_files(tiny_model_dir, alpaca_file, tmp_path):
    r = runner.invoke(
        app,
        ["sweep", *cli_args("sft", tiny_model_dir, alpaca_file, tmp_path / "s", lr="1e-3")],
    )
    assert r.exit_code == 2
    assert "--eval-split" in r.output and "--ood-eval" in r.output


@pytest.mark.smoke
def test_a_sweep_with_merges_puts_every_merge_on_one_frontier_and_skips_them_when_run_again(
    tiny_model_dir, alpaca_file, ood_file, tmp_path
):
    out = tmp_path / "sweep"
    args = [
        "sweep",
        *run_args(
            "sft",
            tiny_model_dir,
            alpaca_file,
            out,
            steps=3,
            batch=4,
            max_length=128,
            lr="3e-3",
            eval_dataset=alpaca_file,
            ood_eval=ood_file,
            llrd="1.0",
            merge_alpha="1.0,0.5",
            merge_llrd="1.0,0.7",
        ),
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    result = json.loads((out / "results.json").read_text())
    assert not result["failed"]
    methods = {row["method"]: row for row in result["summary"]}
    assert set(methods) == {
        "flat",
        "merge α=0.5 of flat",
        "merge α=1 depth γ=0.7 of flat",
        "merge α=0.5 depth γ=0.7 of flat",
    }
    cell = next(c for c in result["cells"] if not c.get("merge"))
    assert cell["trainer_eval_loss"] is not None  # the trainer's eval loss is kept, the frontier uses the merge's
    # the α = 1 merge is the cell itself: its held-out change agrees with the run's own forgetting report (within the
    # gap between the saved weights scored fresh and the in-memory model, a few thousandths of a percent point)
    own = json.loads((out / "cells" / cell["cell"] / "eval_results.json").read_text())["ood"]
    for name, change in cell["ood_change_pct"].items():
        assert change == pytest.approx(own[name]["change_pct"], abs=0.05)
    # moving back toward the base moves the model less: KL of α = 0.5 below the tuned cell's
    half = methods["merge α=0.5 of flat"]
    assert all(half["ood_kl"][n] < methods["flat"]["ood_kl"][n] for n in half["ood_kl"])
    assert "merge α=0.5 of flat" in (out / "results.md").read_text()
    # run again: the cell and every merge are skipped, no merge result is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in (out / "merges").rglob("*.json")}
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "1 already done, 0 to run" in again.output
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "merges").rglob("*.json")}
    assert json.loads((out / "results.json").read_text())["summary"] == result["summary"]


def test_merges_in_a_sweep_need_an_eval_dataset_file(tiny_model_dir, alpaca_file, ood_file, tmp_path):
    r = runner.invoke(app, [*_grid(tiny_model_dir, alpaca_file, ood_file, tmp_path / "s"), "--merge-alpha", "0.5"])
    assert r.exit_code == 2 and "--merge-alpha needs --eval-dataset" in r.output


@pytest.mark.smoke
def test_a_sweep_over_the_kl_anchor_and_self_replay_labels_each_method_and_skips_them_when_run_again(
    tiny_model_dir, alpaca_file, ood_file, tmp_path
):
    out = tmp_path / "sweep"
    # 3 steps × batch 4 × replay ratio 0.25: 3 replay rows, so at most 3 samples
    args = [
        "sweep", "sft", "--model", str(tiny_model_dir), "--dataset", str(alpaca_file), "--eval-split", "0.25",
        "--ood-eval", str(ood_file), "--lr", "3e-3", "--max-steps", "3", "--batch-size", "4", "--max-length", "128",
        "--output-dir", str(out), "--kl-to-base", "0,1", "--self-replay", "0,3", "--replay-ratio", "0,0.25",
    ]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    result = json.loads((out / "results.json").read_text())
    assert not result["failed"] and len(result["cells"]) == 4
    methods = {row["method"] for row in result["summary"]}
    assert methods == {"flat", "flat + KL β=1", "flat + self-replay 3 @0.25", "flat + self-replay 3 @0.25 + KL β=1"}
    for c in result["cells"]:  # each cell ran with its own settings
        cfg = json.loads((out / "cells" / c["cell"] / "run_config.json").read_text())
        assert cfg["kl_to_base"] == c["kl_to_base"] and cfg["self_replay"] == c["self_replay"]
        assert (out / "cells" / c["cell"] / "self_replay.jsonl").is_file() == bool(c["self_replay"])
    table = (out / "results.md").read_text()
    assert all(m in table for m in methods)
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "4 already done, 0 to run" in again.output


@pytest.mark.smoke
def test_a_sweep_scores_the_base_once_per_held_out_text_for_all_its_cells_and_merges(
    tiny_model_dir, alpaca_file, ood_file, tmp_path
):
    second = tmp_path / "ood2.txt"
    second.write_text("the quick brown fox jumps over the lazy dog. " * 80)
    out = tmp_path / "sweep"
    args = [
        "sweep", "sft", "--model", str(tiny_model_dir), "--dataset", str(alpaca_file), "--eval-dataset",
        str(alpaca_file), "--ood-eval", str(ood_file), "--ood-eval", str(second), "--lr", "1e-3",
        "--kl-to-base", "0,1", "--merge-alpha", "0.5", "--max-steps", "2", "--batch-size", "4", "--max-length",
        "128", "--output-dir", str(out),
    ]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    result = json.loads((out / "results.json").read_text())
    assert not result["failed"] and len([c for c in result["cells"] if not c.get("merge")]) == 2
    assert len([c for c in result["cells"] if c.get("merge")]) == 2
    # 2 trained cells and 2 merges, two held-out texts: the base was scored twice in all, once per text
    scored = [json.loads(line) for line in (out / "base_eval" / "recorded.jsonl").read_text().splitlines()]
    assert len(scored) == 2 and len({s["key"] for s in scored}) == 2
    for c in result["cells"]:
        assert set(c["ood_kl"]) == {"ood.txt", "ood2.txt"} and all(v >= 0 for v in c["ood_kl"].values())


def test_sweep_max_forgetting_puts_each_cells_budgeted_merge_on_the_frontier(tiny_model_dir, alpaca_file, tmp_path):
    ood_file = tmp_path / "held.txt"
    ood_file.write_text("@%&*" * 400)  # symbols the instructions never show: training on them forgets here
    out = tmp_path / "sweep"
    args = ["sweep", *run_args("sft", tiny_model_dir, alpaca_file, out, steps=6, batch=4, max_length=128, lr="1e-2",
        eval_dataset=alpaca_file, ood_eval=ood_file, max_forgetting="1", precision="fp32")]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    result = json.loads((out / "results.json").read_text())
    assert not result["failed"]
    methods = {row["method"]: row for row in result["summary"]}
    assert set(methods) == {"flat", "budget ≤1% of flat"}
    flat, budgeted = methods["flat"], methods["budget ≤1% of flat"]
    assert flat["forgetting_pct"] > 1  # the trained cell forgets more than the budget
    assert budgeted["forgetting_pct"] <= 1 and 0 < budgeted["budget_alphas"][0] < 1
    record = json.loads(next((out / "merges").glob("*-budget/merge_results.json")).read_text())
    assert record["budget"]["alpha"] == budgeted["budget_alphas"][0]
    assert budgeted["eval_loss"] >= flat["eval_loss"] - 1e-6  # a merge toward the base keeps part of the gain
    assert result["recommendation"]["best"]["merge"] == "budget"  # the only point within the budget
    assert "merge --max-forgetting" in (out / "results.md").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in (out / "merges").rglob("*.json")}
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "1 already done, 0 to run" in again.output, again.output
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "merges").rglob("*.json")}


def test_sdft_and_dft_cells_appear_on_the_frontier_labelled_by_method(tiny_model_dir, alpaca_file, ood_file, tmp_path):
    for command, extra, method in (("sdft", ["--max-completion-length", "8"], "SDFT flat"),
                                   ("sft", ["--loss-type", "nll,dft", "--max-length", "128"], "DFT flat")):  # fmt: skip
        out = tmp_path / command
        args = ["sweep", *run_args(command, tiny_model_dir, alpaca_file, out, *extra, steps=2, batch=4, lr="1e-3",
            max_length=None, eval_split="0.25", ood_eval=ood_file)]  # fmt: skip
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        result = json.loads((out / "results.json").read_text())
        methods = {row["method"] for row in result["summary"]}
        assert method in methods and not result["failed"]
        assert method in (out / "results.md").read_text()
