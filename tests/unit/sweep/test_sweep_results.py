"""The sweep's model-free parts: the grid's cells and their command lines, the axes refused before anything runs,
the merges per cell, the summary over seeds and the recommendation against flat at the same eval loss (moved from
tests/e2e/test_sweep.py with their assertions: none of them trains)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_replay_ratio_zero_cells_run_without_the_replay_dataset(tmp_path):
    from posttrainllm.sweep import Cell, SweepSpec

    spec = SweepSpec(
        "sft", [1.0], [1e-3], [0.0, 0.25], [0], 1, 5.0, tmp_path, ["--model", "m", "--replay-dataset", "r.txt"]
    )
    no_replay, replay = spec.argv(Cell(1.0, 1e-3, 0.0, 0)), spec.argv(Cell(1.0, 1e-3, 0.25, 0))
    assert "--replay-dataset" not in no_replay and "--replay-ratio" not in no_replay
    assert (
        replay[replay.index("--replay-dataset") + 1] == "r.txt" and replay[replay.index("--replay-ratio") + 1] == "0.25"
    )


def test_flat_at_the_same_eval_loss_ignores_flat_lrs_past_its_best_eval_loss():
    from posttrainllm.sweep import recommend

    def row(gamma, lr, loss, forgetting):
        return {"gamma": gamma, "lr": lr, "replay_ratio": 0, "eval_loss": loss, "forgetting_pct": forgetting}

    flat = [row(1.0, 1e-3, 4.86, 49.0), row(1.0, 2e-3, 4.81, 85.0), row(1.0, 3.5e-3, 4.85, 140.0)]  # 3.5e-3 overshoots
    decayed = row(0.8, 2e-3, 4.846, 32.0)
    got = recommend([*flat, decayed], max_forgetting=40)["best"]["vs_flat"]["flat_forgetting_pct_at_same_eval_loss"]
    assert got == pytest.approx(49.0 + (4.86 - 4.846) / (4.86 - 4.81) * (85.0 - 49.0))  # on the 1e-3 → 2e-3 branch


def test_the_new_axes_reach_each_cells_command_line_and_name():
    from posttrainllm.sweep.grid import SweepSpec

    spec = SweepSpec(
        "sft", [1.0], [1e-4], [0.0, 0.25], [0], 1, 5.0, Path("out"), ["--model", "m"],
        kl_values=[0.0, 0.1], self_replays=[0, 16],
    )  # fmt: skip
    cells = spec.cells()
    # self-replay needs a ratio to mix at; without --replay-dataset a ratio needs self-replay: 2 × 2 meaningful cells
    assert sorted((c.kl_to_base, c.self_replay, c.replay_ratio) for c in cells) == [
        (0.0, 0, 0.0), (0.0, 16, 0.25), (0.1, 0, 0.0), (0.1, 16, 0.25),
    ]  # fmt: skip
    kl_cell = next(c for c in cells if c.kl_to_base and c.self_replay)
    argv = spec.argv(kl_cell)
    assert argv[argv.index("--kl-to-base") + 1] == "0.1" and argv[argv.index("--self-replay") + 1] == "16"
    assert kl_cell.name == "g1-lr0.0001-replay0.25-kl0.1-selfreplay16-s0"
    plain = next(c for c in cells if not c.kl_to_base and not c.self_replay)
    assert plain.name == "g1-lr0.0001-replay0-s0"  # an older sweep's cells keep their names (and are skipped)
    assert "--kl-to-base" not in spec.argv(plain) and "--self-replay" not in spec.argv(plain)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--merge-alpha", "1.5"], "--merge-alpha"),
        (["--merge-alpha", "0.5", "--merge-llrd", "0.2"], "--merge-llrd"),
        (["--merge-llrd", "0.9"], "needs --merge-alpha"),
        (["--self-replay", "16"], "--replay-ratio above 0"),
    ],
)
def test_bad_method_axes_are_refused_before_anything_runs(extra, message):
    from posttrainllm.errors import ConfigErrors
    from posttrainllm.sweep import parse

    base = ["--model", "m", "--dataset", "d.jsonl", "--eval-split", "0.2", "--ood-eval", "o.txt", "--lr", "1e-4"]
    with pytest.raises(ConfigErrors) as e:
        parse("sft", [*base, *extra])
    assert any(message in p for p in e.value.problems)


def test_merges_per_cell_leave_out_the_cell_itself():
    from posttrainllm.sweep.grid import Merge, SweepSpec

    spec = SweepSpec(
        "sft", [1.0], [1e-3], [0.0], [0], 1, 5.0, Path("o"), [], merge_alphas=[1.0, 0.5], merge_gammas=[1.0, 0.9]
    )
    assert spec.merges() == [Merge(1.0, 0.9), Merge(0.5, 1.0), Merge(0.5, 0.9)]
    assert Merge(0.5, 0.9).args() == ["--alpha", "0.5", "--llrd", "0.9"] and Merge(0.5).args() == ["--alpha", "0.5"]


def test_the_summary_names_each_method_and_compares_each_with_flat():
    from posttrainllm.sweep import recommend, summarize

    def rec(lr, loss, forgetting, **axes):
        base = {"gamma": 1.0, "lr": lr, "replay_ratio": 0.0, "seed": 0, "eval_loss": loss}
        return {**base, **axes, "ood_change_pct": {"o": forgetting}, "ood_kl": {"o": forgetting / 100}}

    records = [
        rec(1e-4, 2.0, 10.0), rec(3e-4, 1.8, 30.0),  # flat
        rec(3e-4, 1.85, 5.0, kl_to_base=0.1),
        rec(3e-4, 1.9, 2.0, merge="merge-a0.5", merge_label="merge α=0.5"),
        rec(3e-4, 1.86, 4.0, gamma=0.9, replay_ratio=0.25, self_replay=64),
    ]  # fmt: skip
    summary = summarize(records)
    methods = {r["method"] for r in summary}
    assert methods == {"flat", "flat + KL β=0.1", "merge α=0.5 of flat", "γ=0.9 + self-replay 64 @0.25"}
    kl_row = next(r for r in summary if r["kl_to_base"])
    assert kl_row["ood_kl"] == {"o": 0.05}
    rec_ = recommend(summary, max_forgetting=6)
    assert rec_["best"]["method"] == "flat + KL β=0.1"
    flat_there = rec_["best"]["vs_flat"]["flat_forgetting_pct_at_same_eval_loss"]
    assert flat_there == pytest.approx(10.0 + (2.0 - 1.85) / (2.0 - 1.8) * 20.0)  # flat only: the KL row is not flat


def test_merges_of_a_cell_recorded_by_an_older_sweep_count_the_newer_axes_as_off():
    """A cell finished by a sweep from before --kl-to-base/--self-replay has no such keys in its record."""
    from posttrainllm.sweep.grid import Cell
    from posttrainllm.sweep.merges import _records

    old = {"gamma": 0.9, "lr": 1e-3, "replay_ratio": 0.0, "seed": 0, "eval_loss": 2.0, "fingerprint": "x"}
    results = {
        "points": [
            {"label": "base", "alpha": 0.0, "eval_loss": 3.0, "held_out": {}},
            {"label": "alpha=0.5", "alpha": 0.5, "eval_loss": 2.5, "held_out": {"o": {"change_pct": 1.0, "kl": 0.1}}},
        ]
    }
    (rec,) = _records(results, Cell(0.9, 1e-3, 0.0, 0), old, 1.0)
    assert (rec["kl_to_base"], rec["self_replay"], rec["merge"]) == (0, 0, "merge-a0.5")
    assert rec["ood_kl"] == {"o": 0.1} and rec["eval_loss"] == 2.5
