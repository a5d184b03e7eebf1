"""Measuring a sweep of merges with no training: for each merge, the in-domain eval loss (completion loss on
--eval-dataset), the held-out perplexity of each --ood-eval text and the mean per-token KL(base ‖ merge) on it, all
as `posttrainllm eval` computes them (posttrainllm/evaluate/). The base is evaluated once: its logits on the held-out
texts are kept (up to a memory budget) and stand in for the base as every merge's KL reference."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING

from posttrainllm.reporting import banner
from posttrainllm.rundir.layout import write_json

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

# logits of the base kept for the KL of every merge; beyond this the base is run again for the rest
CACHE_BYTES = 2 << 30


class _Recorder:
    """The base model, keeping the logits of each batch it scores (while they fit the budget)."""

    def __init__(self, model, budget: int = CACHE_BYTES):
        self.model, self.budget, self.used = model, budget, 0
        self.batches: list[tuple] = []

    def __getattr__(self, name):  # device, training, eval(), train(), parameters() ... of the model
        return getattr(self.model, name)

    def __call__(self, input_ids, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        size = out.logits.numel() * out.logits.element_size()
        kept = out.logits.detach().clone() if self.used + size <= self.budget else None
        self.used += size if kept is not None else 0
        self.batches.append((input_ids.detach().clone(), kept))
        return out

    def replay(self) -> _Replay:
        return _Replay(self.model, self.batches)


class _Replay:
    """The base as a KL reference: the recorded logits of the same batch, in order; the base's own forward for a
    batch that was not kept (or is not the recorded one)."""

    def __init__(self, model, batches):
        self.model, self.batches, self.i = model, batches, 0
        self.replayed = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, input_ids, **kwargs):
        import torch

        i, self.i = self.i, self.i + 1
        if i < len(self.batches):
            ids, logits = self.batches[i]
            if logits is not None and ids.shape == input_ids.shape and torch.equal(ids, input_ids.to(ids.device)):
                self.replayed += 1
                return SimpleNamespace(logits=logits)
        return self.model(input_ids=input_ids, **kwargs)


def _evaluate(model, tokenizer, cfg: RunConfig, texts: list[str], examples, reference=None) -> dict:
    from posttrainllm.evaluate import evaluate_files

    return evaluate_files(
        model,
        tokenizer,
        texts,
        cfg.max_length,
        sft_examples=examples,
        progress=True,
        batch_size=cfg.eval_batch_size,
        reference=reference,
    )


def _point(label, alpha, results: dict, base: dict, model_dir) -> dict:
    from posttrainllm.evaluate import forgetting_report

    ood = {k: v for k, v in forgetting_report(base, results).items() if k != "sft"}
    kls = [v["kl"] for v in ood.values() if v.get("kl") is not None]
    return {
        "label": label,
        "alpha": alpha,
        "eval_loss": results.get("sft", {}).get("loss"),
        "held_out": ood,
        "kl": sum(kls) / len(kls) if kls else None,
        "ppl_change_pct": _mean([v["change_pct"] for v in ood.values()]),
        "model_dir": model_dir,
    }


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# the numbers a point may report; a point missing one that the frontier measured is never on it
MEASURES = ("eval_loss", "kl", "ppl_change_pct")


def _mark_frontier(points: list[dict]) -> None:
    """A point is on the frontier when it has every number the frontier measured (a measure is measured when some
    point has it; None, NaN and ±inf are missing) and no other such point is at least as good on both the eval loss
    and the forgetting (the KL to the base when measured, else the held-out perplexity change) and better on one.
    A point missing a number is never on the frontier and pushes no other point off it; when nothing was measured,
    no point is on it."""
    measured = [m for m in MEASURES if any(_number(p.get(m)) for p in points)]
    axes = [m for m in measured if m == "eval_loss"]
    axes += [m for m in ("kl", "ppl_change_pct") if m in measured][:1]
    complete = [p for p in points if measured and all(_number(p.get(m)) for m in measured)]
    keys = [tuple(p[m] for m in axes) for p in complete]
    for p in points:
        p["frontier"] = False
    for p, a in zip(complete, keys):
        p["frontier"] = not any(b != a and all(x <= y for x, y in zip(b, a)) for b in keys)


def _cache_args(cfg: RunConfig, base_dir, base_model, texts: list[str], precision: str) -> dict | None:
    from posttrainllm.evaluate.base_cache import base_identity

    if not cfg.eval_cache or not texts:
        return None
    return {
        "cache_dir": cfg.eval_cache,
        "base_identity": base_identity(str(base_dir), base_model, precision, cfg.eval_cache),
        "batch_size": cfg.eval_batch_size,
    }


def measure_and_report(
    cfg: RunConfig, base_dir, merged: Sequence[tuple[float, object]], results_path, schedule: dict, examples,
    extra: dict | None = None,
):  # fmt: skip
    """Evaluate the base once and every merged directory (alpha, directory) on cfg.ood_eval and the eval set
    `examples` (or None), at --precision (evaluate/precision.py), write `results_path` (with the `schedule` record
    and `extra`'s keys, e.g. the budget's record) and print the frontier table. Returns the results."""
    from posttrainllm.evaluate.precision import scoring_autocast
    from posttrainllm.models import pick_precision

    precision = pick_precision(cfg.precision)
    with scoring_autocast(precision):
        return _measure(cfg, base_dir, merged, results_path, {**schedule, "precision": precision}, examples, extra)


def _measure(cfg: RunConfig, base_dir, merged, results_path, schedule: dict, examples, extra: dict | None):
    import gc

    from posttrainllm.evaluate import load_for_eval
    from posttrainllm.evaluate.base_cache import base_results, results_against_base

    base_model, tokenizer = load_for_eval(str(base_dir), trust_remote_code=cfg.trust_remote_code)
    recorder = _Recorder(base_model)
    texts = list(cfg.ood_eval or [])
    cached = _cache_args(cfg, base_dir, base_model, texts, schedule["precision"])
    if cached is not None:  # --eval-cache: the base from the cache (scored there once per frontier)
        base = base_results(lambda: base_model, tokenizer, texts, cfg.max_length, **cached)
    else:
        base = _evaluate(recorder, tokenizer, cfg, texts, None)  # the held-out texts, their logits kept
    if examples is not None:
        base.update(_evaluate(base_model, tokenizer, cfg, [], examples))
    points = [{**_point("base", 0.0, base, base, None), "kl": 0.0 if texts else None}]
    for alpha, model_dir in merged:
        model, _ = load_for_eval(str(model_dir), trust_remote_code=cfg.trust_remote_code)
        if cached is not None:
            results = _evaluate(model, tokenizer, cfg, [], examples)
            results.update(results_against_base(model, tokenizer, texts, cfg.max_length, **cached))
        else:
            results = _evaluate(model, tokenizer, cfg, texts, examples, reference=recorder.replay())
        kept = None if cfg.discard_weights else str(model_dir)
        points.append(_point(f"alpha={alpha:g}", alpha, results, base, kept))
        del model
        gc.collect()
    _mark_frontier(points)
    out = {"schedule": schedule, "max_length": cfg.max_length, "points": points, **(extra or {})}
    write_json(results_path, out)
    print_table(points)
    return out


def _fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def print_table(points: list[dict]) -> None:
    from rich.table import Table

    names = list(points[0]["held_out"]) if points else []
    t = Table(title="merge frontier (lower is better; * = on the frontier)", title_justify="left")
    for col in ["merge", "eval loss", *[f"{n} PPL (Δ%)" for n in names], "KL(base ‖ merge)", ""]:
        t.add_column(col, justify="left" if col == "merge" else "right")
    for p in points:
        ppl = [
            f"{_fmt(p['held_out'][n]['after'], '.4f')} ({_fmt(p['held_out'][n]['change_pct'], '+.2f')})" for n in names
        ]
        t.add_row(p["label"], _fmt(p["eval_loss"], ".4f"), *ppl, _fmt(p["kl"], ".5f"), "*" if p["frontier"] else "")
    banner.console.print(t)
