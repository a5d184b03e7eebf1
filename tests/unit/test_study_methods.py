"""studies/methods.py's comparison at equal in-domain loss: the names it parses, the interpolation along a family's
knob (LR or a merge's alpha) and the levels of kept in-domain gain, on made-up points with known answers."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def methods():
    sys.path.insert(0, str(ROOT / "studies"))
    try:
        spec = importlib.util.spec_from_file_location("study_methods", ROOT / "studies" / "methods.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.use_setting("shakespeare")
        yield module
    finally:
        sys.path.remove(str(ROOT / "studies"))


def result(ind: float, code: float, prose: float, sft: float) -> dict:
    """An evaluation result as regime.evaluate writes it (perplexities, NLL of the in-domain text, SFT loss)."""
    return {"shakespeare_eval.txt": {"nll": ind}, "code.txt": {"perplexity": code, "kl": 0.1},
            "prose.txt": {"perplexity": prose, "kl": 0.2}, "sft": {"loss": sft}}  # fmt: skip


def test_a_point_is_named_and_measured_against_the_base(methods):
    base = result(4.0, 10.0, 20.0, 1.0)
    p = methods._point("merge-uniform-a0.75-flat-lr1e-4-s2", result(3.5, 11.0, 25.0, 1.0), base, "3 (merge)")
    assert (p["family"], p["seed"], p["knob"]) == ("merge uniform of flat-lr1e-4", "2", 0.75)
    assert p["code"] == pytest.approx(10.0) and p["prose"] == pytest.approx(25.0) and p["alpaca"] == pytest.approx(0)
    assert p["forget"] == pytest.approx((10.0 + 25.0 + 0.0) / 3)
    q = methods._point("kl-lr3e-4-s1", result(3.5, 10.0, 20.0, 1.0), base, "")
    assert (q["family"], q["seed"], q["knob"]) == ("kl", "1", 3e-4)


def test_the_least_forgetting_at_a_loss_interpolates_between_neighbouring_lrs_only(methods):
    fam = [dict(name="a", knob=3e-5, ind=3.30, forget=5.0), dict(name="b", knob=1e-4, ind=3.20, forget=20.0),
           dict(name="c", knob=3e-4, ind=3.21, forget=60.0)]  # fmt: skip
    for p in fam:
        p.update({k: p["forget"] for k in ("code", "prose", "alpaca")}, kl=0.0)
    best = methods._best_at_most(fam, 3.25)
    # halfway from a to b (LR neighbours); sorted by loss instead, a would pair with c: 35.6, and the answer be b's 20
    assert best["forget"] == pytest.approx(12.5) and best["ind"] == pytest.approx(3.25)
    assert methods._best_at_most(fam, 3.205)["forget"] == pytest.approx(5 + 0.95 * 15)  # a-b again; b-c gives 40
    assert methods._best_at_most(fam, 3.1) is None  # never that low


def test_levels_of_kept_gain_are_measured_from_the_tuned_flat_run(methods):
    base = result(4.0, 10.0, 10.0, 1.0)
    named = {
        "flat-lr1e-4-s1": result(3.0, 12.0, 12.0, 1.0),  # tuned: gain 1.0 nat, forgetting +20%
        "flat-lr3e-5-s1": result(3.2, 10.5, 10.5, 1.0),  # keeps 80% of the gain
        "merge-uniform-a0.5-flat-lr1e-4-s1": result(3.1, 10.0, 10.0, 1.0),  # keeps 90%, forgets nothing
    }
    pts = [methods._point("healed base", base, base, "0")]
    pts += [methods._point(n, r, base, "") for n, r in named.items()]
    text = methods.at_gains(pts, "1")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    flat = [c.strip(" |") for c in rows["flat"].split(" | ")[1:]]
    merge = [c.strip(" |") for c in rows["merge uniform of flat-lr1e-4"].split(" | ")[1:]]
    # flat at 100% kept: the tuned run (20% / 3 texts, Alpaca 0) ; at 90% (NLL 3.1): halfway to 3e-5's 5%/3 ...
    assert flat[0] == f"{(20 + 20 + 0) / 3:+.1f}%"
    assert flat[2] == f"{((20 + 20) / 3 + (5 + 5) / 3) / 2:+.1f}%"
    assert merge[2] == "+0.0%" and merge[0] == f"{40 / 3:+.1f}%"  # the trained cell is the merge at alpha 1


def test_demonstrations_cut_the_training_text_into_prompts_and_their_true_continuations(methods):
    text = "".join(f"line {i:03d} of the play\n" for i in range(40))  # 21 characters a line
    rows = methods.demonstrations(text, chars=50)
    # a piece ends at the first line end after 50 characters: 3 lines (63 characters), so 6 lines a row
    assert len(rows) == 40 // 6
    assert "".join(r["prompt"] + r["completion"] for r in rows) == text[: 6 * 21 * len(rows)]
    assert rows[1] == {"prompt": text[126:189], "completion": text[189:252]}
    assert all(r["prompt"].endswith("\n") and r["completion"].endswith("\n") for r in rows)
    assert methods.demonstrations("no line end at all", chars=5) == []


def test_a_flat_cell_reuses_the_regime_run_only_at_the_same_step_count(methods, tmp_path, monkeypatch):
    monkeypatch.setattr(methods, "REGIME_OUT", tmp_path)
    run = tmp_path / "runs" / "shakespeare-flat-lr3e-5-s1"
    run.mkdir(parents=True)
    cell = {"method": "flat", "lr": "3e-5", "seed": 1}
    monkeypatch.setattr(methods, "STEPS", 80)
    assert methods._regime_run(cell) is None  # not finished
    (run / "training_complete.json").write_text("{}")
    (run / "run_config.json").write_text('{"command": "finetune", "max_steps": 80}')
    assert methods._regime_run(cell) == run
    monkeypatch.setattr(methods, "STEPS", 160)
    assert methods._regime_run(cell) is None  # trained 80 steps: a 160-step study trains its own
    assert methods._regime_run({**cell, "seed": 2}) is None
