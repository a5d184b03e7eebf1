"""--max-forgetting's search (posttrainllm/merging/budget.py): the bisection over α in closed form, what counts as
within the budget, and the in-place interpolation's exact weights."""

from __future__ import annotations

import math

import pytest
import torch

from posttrainllm.merging import budget as B


def test_the_trained_model_within_the_budget_is_alpha_one_measured_once():
    calls = []
    found = B.search(lambda a: calls.append(a) or 0.5, 1.0)
    assert found == {"alpha": 1.0, "tried": [{"alpha": 1.0, "ppl_change_pct": 0.5}], "only_base": False}
    assert calls == [1.0]
    assert B.search(lambda a: pytest.fail("measured again"), 1.0, at_one=1.0)["alpha"] == 1.0  # at the budget


@pytest.mark.parametrize("slope,budget", [(8.0, 1.0), (20.0, 3.0), (3.0, 2.9)])
def test_bisection_finds_the_largest_alpha_within_the_budget_to_one_128th(slope, budget):
    """A change linear in α (slope × α): the budget is met up to α* = budget / slope; the search keeps the largest
    of the dyadic α it measured that are ≤ α*, so α* − 1/128 < α ≤ α*."""
    found = B.search(lambda a: slope * a, budget)
    star = budget / slope
    assert star - 1 / 2**B.STEPS < found["alpha"] <= star and not found["only_base"]
    assert [t["alpha"] for t in found["tried"]][:3] == [1.0, 0.5, 0.25 if star < 0.5 else 0.75]
    assert len(found["tried"]) == 1 + B.STEPS
    assert all(t["ppl_change_pct"] == pytest.approx(slope * t["alpha"]) for t in found["tried"])


@pytest.mark.parametrize("bad", [None, math.nan, math.inf])
def test_a_missing_or_non_finite_change_is_over_the_budget(bad):
    found = B.search(lambda a: bad if a > 0.3 else 0.0, 1.0)
    assert 0.3 - 1 / 128 < found["alpha"] <= 0.3


def test_when_no_merge_is_within_it_only_the_base_meets_the_budget():
    found = B.search(lambda a: 5.0 + a, 1.0)
    assert found["alpha"] == 0.0 and found["only_base"] and min(t["alpha"] for t in found["tried"]) == 1 / 128


def test_mean_change_and_kept_gain():
    assert B.mean_change({"a.txt": {"change_pct": 2.0}, "b.txt": {"change_pct": -1.0}, "sft": {}}) == 0.5
    assert B.mean_change({"a.txt": {"change_pct": None}}) is None
    assert B.kept_gain(3.0, 2.0, 2.25) == pytest.approx(0.75)
    assert B.kept_gain(2.0, 2.0, 2.0) is None and B.kept_gain(None, 2.0, 2.0) is None


def test_the_interpolation_sets_the_closed_form_and_returns_to_the_trained_weights():
    torch.manual_seed(0)
    base, model = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    merge = B.Interpolation(model, base)
    for alpha in (0.0, 0.25, 1.0):
        merge.set(alpha)
        for n, p in model.named_parameters():
            b = dict(base.named_parameters())[n]
            expected = b + alpha * (trained[n] - b) if alpha not in (0.0, 1.0) else (b if alpha == 0 else trained[n])
            assert torch.equal(p, expected.to(p.dtype)) if alpha in (0.0, 1.0) else torch.allclose(p, expected)
