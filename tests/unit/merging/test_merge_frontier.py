"""The merge frontier (posttrainllm/merging/frontier.py): a point is on it only with every measured number present
and finite, and only when no other such point is at least as good on both the eval loss and the forgetting (the
KL to the base when measured, else the held-out perplexity change) and better on one."""

import math

import pytest

from posttrainllm.merging.frontier import _mark_frontier


def _p(label, eval_loss, kl, ppl):
    return {"label": label, "eval_loss": eval_loss, "kl": kl, "ppl_change_pct": ppl, "held_out": {}}


def _starred(points):
    _mark_frontier(points)
    return [p["label"] for p in points if p["frontier"]]


def _points():
    """base (no forgetting, high loss), a good merge, a dominated merge and the tuned model (low loss, most KL)."""
    return [
        _p("base", 2.0, 0.0, 0.0),
        _p("alpha=0.5", 1.5, 0.01, 2.0),
        _p("alpha=0.6", 1.6, 0.02, 3.0),
        _p("alpha=1", 1.2, 0.05, 6.0),
    ]


def test_complete_points_give_the_pareto_front():
    assert _starred(_points()) == ["base", "alpha=0.5", "alpha=1"]


@pytest.mark.parametrize("bad", [None, math.nan, math.inf])
def test_a_point_without_an_eval_loss_is_never_on_the_frontier(bad):
    points = [*_points(), _p("broken", bad, 0.001, 0.5)]  # best forgetting of the merges, but no loss
    assert "broken" not in _starred(points)
    assert _starred(points) == ["base", "alpha=0.5", "alpha=1"]  # and it dominates no one


@pytest.mark.parametrize("bad", [None, math.nan, math.inf])
def test_a_point_without_a_kl_is_never_on_the_frontier_nor_ranked_by_its_perplexity(bad):
    # a perplexity change of 0.001 % read as a KL would dominate alpha=0.5 and alpha=1
    points = [*_points(), _p("broken", 1.1, bad, 0.001)]
    assert _starred(points) == ["base", "alpha=0.5", "alpha=1"]


@pytest.mark.parametrize("bad", [None, math.nan, -math.inf])
def test_a_point_without_a_perplexity_change_is_never_on_the_frontier(bad):
    points = [*_points(), _p("broken", 1.1, 0.001, bad)]
    assert _starred(points) == ["base", "alpha=0.5", "alpha=1"]


def test_a_point_with_nothing_but_nans_is_never_on_the_frontier():
    points = [*_points(), _p("nan", math.nan, math.nan, math.nan), _p("null", None, None, None)]
    assert _starred(points) == ["base", "alpha=0.5", "alpha=1"]


def test_without_a_kl_anywhere_the_perplexity_change_is_the_forgetting():
    points = [_p("base", 2.0, None, 0.0), _p("a", 1.5, None, 2.0), _p("b", 1.6, None, 3.0), _p("c", 1.2, None, 6.0)]
    assert _starred(points) == ["base", "a", "c"]


def test_without_an_eval_set_the_eval_loss_is_no_axis():
    points = [_p("base", None, 0.0, 0.0), _p("a", None, 0.01, 2.0)]
    assert _starred(points) == ["base"]


def test_when_nothing_has_a_number_nothing_is_on_the_frontier():
    points = [_p("base", None, None, None), _p("a", math.nan, None, math.nan)]
    assert _starred(points) == []
