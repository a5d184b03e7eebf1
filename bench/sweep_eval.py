"""A sweep's held-out evaluation, timed: without the base cache (before) and with it (after), against the ideal of
one base pass plus one pass per evaluated model, side by side in one process.

    python bench/sweep_eval.py --base HEALED_DIR --models RUN1,RUN2,... [--chars 10000] [--texts code,prose]

A frontier evaluates many models (a sweep's cells and their merges) against one base on the same held-out texts;
each model needs the base's perplexity (its forgetting report's "before") and KL(base || model). Timed here, every
model and the base already loaded (loading is the same in both), on --texts slices of --chars characters of the
shared data's held-out splits (studies/common.py):

  ideal    one pass of the base and one pass of each model, perplexity only (evaluate_files): the floor
  before   what each model paid without the cache: the base's perplexity pass, then the model's pass with the KL
           to the loaded base (two forwards per batch: evaluate_files(reference=base))
  before-  the same without the base's perplexity pass per model (a lower bound of "before")
  after    base_cache.base_results once (the base's pass, recording its top-256), then results_against_base per
           model (one forward each, the KL from the cache): what `sweep` and `merge` do now

The base's forward passes are counted in each mode. Reported: seconds each, after/ideal (the goal: <= 1.2), and
before/ideal, after/before. --precision bf16 runs everything under bf16 autocast (what `--precision auto` picks on a
CPU with bf16 instructions). Use one thread (OMP_NUM_THREADS=1) on a shared machine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

SPLITS = {"code": "code_held", "prose": "docs_held", "shakespeare": "shakespeare_held"}


def _splits():
    """studies/common.py's split of the shared data (loaded by path: bench/ has a common.py of its own)."""
    spec = importlib.util.spec_from_file_location("studies_common", ROOT / "studies" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.splits()


class _Counted:
    """A model whose forward calls are counted (the base's passes, per mode)."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *a, **kw):
        self.calls += 1
        return self.model(*a, **kw)


def modes(base, models, tok, paths, a, cache: Path):
    """The four evaluation modes as functions returning the base's forward calls they made."""
    from posttrainllm import evaluate as ev
    from posttrainllm.evaluate.base_cache import base_results, results_against_base

    kw = dict(progress=False, batch_size=a.batch_size)

    def ideal():
        for m in [base, *models]:
            ev.evaluate_files(m, tok, paths, a.max_length, **kw)

    def before(with_base_pass: bool):
        for m in models:
            if with_base_pass:
                ev.evaluate_files(base, tok, paths, a.max_length, **kw)
            ev.evaluate_files(m, tok, paths, a.max_length, reference=base, **kw)

    def after():
        entry = cache / f"run-{time.monotonic_ns()}"  # a fresh cache each repetition: the base pass is timed
        ckw = dict(cache_dir=entry, base_identity="bench", batch_size=a.batch_size)
        base_results(lambda: base, tok, paths, a.max_length, **ckw)
        for m in models:
            results_against_base(m, tok, paths, a.max_length, **ckw)

    return {"ideal": ideal, "before": lambda: before(True), "before-": lambda: before(False), "after": after}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the base model directory (the sweep's starting model)")
    ap.add_argument("--models", required=True, help="comma-separated model directories (cells and merges)")
    ap.add_argument("--texts", default="code,prose", help=f"held-out texts, of {sorted(SPLITS)}")
    ap.add_argument("--chars", type=int, default=10_000)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    import torch
    from common import machine_info, median

    from posttrainllm import evaluate as ev

    base_model, tok = ev.load_for_eval(a.base)
    base = _Counted(base_model)
    models = [ev.load_for_eval(m)[0] for m in a.models.split(",")]
    sp = _splits()
    tmp = Path(tempfile.mkdtemp(prefix="sweep-eval-"))
    paths = []
    for name in a.texts.split(","):
        (tmp / f"{name}.txt").write_text(sp[SPLITS[name]][: a.chars], encoding="utf-8")
        paths.append(str(tmp / f"{name}.txt"))
    runs = modes(base, models, tok, paths, a, tmp / "cache")
    (tmp / "warm.txt").write_text(sp[SPLITS["code"]][-2_000:], encoding="utf-8")
    for m in [base, *models]:  # first calls allocate; not part of any mode's time
        ev.evaluate_files(m, tok, [str(tmp / "warm.txt")], a.max_length, progress=False, batch_size=a.batch_size)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if a.precision == "bf16" else contextlib.nullcontext()
    secs: dict[str, list[float]] = {n: [] for n in runs}
    calls: dict[str, int] = {}
    names = list(runs)
    for rep in range(a.reps):
        for n in names[rep % len(names) :] + names[: rep % len(names)]:
            base.calls = 0
            with autocast:
                t0 = time.perf_counter()
                runs[n]()
                secs[n].append(time.perf_counter() - t0)
            calls[n] = base.calls
    med = {n: median(v) for n, v in secs.items()}
    result = {
        "models": len(models),
        "texts": a.texts.split(","),
        "chars": a.chars,
        "precision": a.precision,
        "reps": a.reps,
        "seconds": med,
        "base_forward_calls": calls,
        "after/ideal": med["after"] / med["ideal"],
        "before/ideal": med["before"] / med["ideal"],
        "before-/ideal": med["before-"] / med["ideal"],
        "after/before": med["after"] / med["before"],
        "machine": machine_info(),
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"sweep evaluation: base + {len(models)} models, texts {a.texts} ({a.chars} chars each), {a.precision}")
    for n in names:
        print(f"  {n:8s} {med[n]:8.1f} s   base forward calls {calls[n]}")
    for k in ("after/ideal", "before/ideal", "before-/ideal", "after/before"):
        print(f"  {k}: {result[k]:.3f}")


if __name__ == "__main__":
    main()
