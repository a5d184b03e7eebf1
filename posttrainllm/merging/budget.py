"""A forgetting budget the run meets by itself (`--max-forgetting PCT`): after training, the largest uniform merge
factor α toward the starting model whose held-out forgetting is at most PCT.

The forgetting of a model is the mean, over the `--ood-eval` texts, of its perplexity change against the starting
model, measured the way `eval` measures it (evaluate/). Without --ood-eval it is the perplexity change of the
forgetting probe's texts, the starting model's own samples: 100 (exp(KL) - 1) from the probe's mean per-token
KL(start ‖ tuned) (`probe_change`), so PCT is a KL budget of ln(1 + PCT/100) nats per token. The merged model at α
is θ(α) = θ_base + α (θ_tuned − θ_base) (merging/interpolate.py), so α = 1 is the trained model and α = 0 the
starting one, whose change is 0 by definition.

The search (`search`) is a bisection over α in [0, 1]: α = 1 first (the trained run's own report, already measured);
when it is within the budget, α is 1. Otherwise `STEPS` halvings keep the largest α measured within the budget,
one held-out pass per α (the perplexity only, no second model). When no α > 0 measured is within it, only the
starting model meets the budget: `only_base` is true, the run's model stays the trained one, and the command exits
with `BUDGET_EXIT` (3) after writing its records, for CI gates. Forgetting need not be monotone in α; the bisection
then finds an α within the budget, not necessarily the largest.

Worked example: budget 1%, trained run +8%, changes +2.9% at α 0.5 and +0.6% at α 0.25: α 0.5 fails, 0.25 meets,
then 0.375 … after 7 halvings α is within 1/128 of where the change crosses 1%.
"""

from __future__ import annotations

import math
from collections.abc import Callable

STEPS = 7  # halvings: α found to 1/128
BUDGET_EXIT = 3  # exit code when only the starting model meets the budget
UNMERGED = "unmerged"  # the trained model, kept beside the budgeted one under OUT/unmerged/
HELD_OUT = "held-out perplexity"  # what the budget measures: --ood-eval's mean perplexity change,
PROBE = "probe"  # or, without --ood-eval, the forgetting probe's (evaluate/probe.py): `probe_change`


def search(measure: Callable[[float], float | None], budget: float, *, at_one: float | None = None,
           steps: int = STEPS) -> dict:  # fmt: skip
    """{"alpha", "tried": [{"alpha", "ppl_change_pct"}, ...] in the order measured, "only_base"} for the largest α
    found whose `measure(α)` (the mean held-out perplexity change, %) is at most `budget`; `at_one`: the change at
    α = 1 when already known. A change that is None or not finite counts as over the budget."""
    tried: list[dict] = []

    def within(alpha: float, change: float | None) -> bool:
        tried.append({"alpha": alpha, "ppl_change_pct": change})
        return change is not None and math.isfinite(change) and change <= budget

    if within(1.0, at_one if at_one is not None else measure(1.0)):
        return {"alpha": 1.0, "tried": tried, "only_base": False}
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if within(mid, measure(mid)):
            lo = mid
        else:
            hi = mid
    return {"alpha": lo, "tried": tried, "only_base": lo == 0.0}


class Interpolation:
    """Set a model's parameters to θ_base + α (θ_tuned − θ_base) in place, for any α, from a copy of its trained
    parameters and the starting model's (`base`: a model of the same class, loaded the way the run loaded it)."""

    def __init__(self, model, base):
        import torch

        with torch.no_grad():
            self.model = model
            self.tuned = {n: p.detach().clone() for n, p in model.named_parameters()}
            base_params = dict(base.named_parameters())
            missing = sorted(set(self.tuned) - set(base_params))
            if missing:
                from posttrainllm.errors import ModelError

                raise ModelError(f"--max-forgetting: the starting model has no parameter {missing[0]} to merge toward")
            self.base = {n: base_params[n].detach().to(self.tuned[n].device) for n in self.tuned}

    def set(self, alpha: float) -> None:
        import torch

        from posttrainllm.merging.interpolate import interpolate

        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(interpolate(self.base[name], self.tuned[name], alpha, name))


def mean_change(report: dict) -> float | None:
    """The mean perplexity change (%) over the held-out texts of a forgetting report (None when one is missing)."""
    changes = [r.get("change_pct") for name, r in report.items() if name != "sft"]
    if not changes or any(c is None or not math.isfinite(c) for c in changes):
        return None
    return sum(changes) / len(changes)


def probe_change(probe: dict | None) -> float | None:
    """The perplexity change (%) of the starting model's own samples under the tuned model, from the probe's mean
    per-token KL(start ‖ tuned): the tuned model's cross-entropy on the starting model's distribution exceeds that
    distribution's entropy by the KL, so the perplexity ratio is exp(KL) and the change 100 (exp(KL) - 1). A budget
    of PCT is thus a KL budget of ln(1 + PCT/100) nats per token (`probe_kl_budget`). None without a probe."""
    if probe is None or probe.get("kl") is None or not math.isfinite(probe["kl"]):
        return None
    return 100 * math.expm1(max(probe["kl"], 0.0))


def probe_kl_budget(budget: float) -> float:
    """The probe's KL (nats per token) that a budget of `budget` percent allows: ln(1 + budget/100)."""
    return math.log1p(budget / 100)


def kept_gain(base_loss: float | None, tuned_loss: float | None, loss: float | None) -> float | None:
    """The share of the trained run's in-domain gain that the budgeted model keeps: (L_base − L_α) / (L_base −
    L_tuned); None without an eval set or without a gain."""
    if base_loss is None or tuned_loss is None or loss is None or not base_loss > tuned_loss:
        return None
    return (base_loss - loss) / (base_loss - tuned_loss)


def search_models(tuned, base, tokenizer, texts: list[str], max_length: int, budget: float, *, batch_size: int = 8,
                  precision: str = "fp32") -> dict:  # fmt: skip
    """`search` over merges of the loaded models `tuned` (changed in place, left at the α found) toward `base` on
    the held-out `texts`: each α one perplexity pass of the merged model, against the base's own pass."""
    from posttrainllm.evaluate import evaluate_files, forgetting_report
    from posttrainllm.evaluate.precision import scoring_autocast

    def score(model) -> dict:
        with scoring_autocast(precision):
            return evaluate_files(model, tokenizer, texts, max_length, progress=False, batch_size=batch_size)

    before = score(base)
    merge = Interpolation(tuned, base)

    def measure(alpha: float):
        merge.set(alpha)
        return mean_change(forgetting_report(before, score(tuned)))

    found = search(measure, budget)
    merge.set(found["alpha"])
    return {"max_forgetting_pct": budget, **found}


def outcome(budget: dict) -> str:
    """The budget record (`search`'s, with "kept_gain" and "unmerged_dir") in one sentence, for the run's output and
    its model card."""
    if budget["only_base"]:
        return "only the starting model meets it: the output is the trained model, unmerged"
    if budget["alpha"] == 1.0:
        return "the trained model meets it as it is (α = 1)"
    kept = budget.get("kept_gain")
    share = "" if kept is None else f", keeping {100 * kept:.1f}% of the in-domain gain"
    return f"merged back to α = {budget['alpha']:g}{share}; the trained model is in {budget['unmerged_dir']}"


def measure_label(budget: dict) -> str:
    """What the budget record's changes measure, in words."""
    if budget.get("measure") == PROBE:
        return "perplexity change of the starting model's own samples (the forgetting probe: exp(KL) - 1)"
    return "mean held-out perplexity change"


def change_text(change: float | None) -> str:
    """A mean perplexity change as printed: +1.23%, or - when it was not measured."""
    return "-" if change is None else f"{change:+.2f}%"
