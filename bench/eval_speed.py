"""Held-out evaluation speed: posttrainllm's evaluation (`evaluate_files`, streamed, batched windows) against a bare
transformers forward loop over the same windows, side by side in one process, and the base cache's cost.

    python bench/eval_speed.py [--model DIR] [--chars 40000] [--max-length 192] [--batch-size 8] [--reps 3]

Contenders, on the same model object, text, windows and batch size, in rotated order per repetition:
  bare       tokenize once, cut into windows of --max-length, model(input_ids).logits, cross-entropy (float32)
  ours       posttrainllm.evaluate.evaluate_files (perplexity only)
  ours+kl    evaluate_files with the base as reference (two forwards per batch: what each sweep cell paid)
  cached     evaluate/base_cache.results_against_base (the base's top-256 read from the cache: one forward)
Reported: tokens/s each and the ratios ours/bare, cached/(ours+kl) (medians of the per-repetition ratios).
The model defaults to SmolLM2-135M-Instruct (bench/smollm2.py); the text is the held-out stdlib code of
../shared/data (studies/common.py's split). --precision bf16 runs every contender under bf16 autocast.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def _splits():
    """studies/common.py's split of the shared data (loaded by path: bench/ has a common.py of its own)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("studies_common", ROOT / "studies" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.splits()


def bare_loop(model, tokenizer, text: str, max_length: int, batch_size: int) -> tuple[float, int]:
    """(mean NLL, predicted tokens) by the plain loop a user would write."""
    import torch
    import torch.nn.functional as F

    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    windows = [ids[i : i + max_length] for i in range(0, len(ids), max_length)]
    full = [w for w in windows if len(w) == max_length]
    rest = [w for w in windows if 2 <= len(w) < max_length]
    total, count = 0.0, 0
    with torch.inference_mode():
        batches = [torch.stack(full[i : i + batch_size]) for i in range(0, len(full), batch_size)]
        for batch in batches + [w[None] for w in rest]:
            logits = model(input_ids=batch).logits[:, :-1].float()
            labels = batch[:, 1:]
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum").item()
            count += labels.numel()
    return total / count, count


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--chars", type=int, default=40_000)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    a = ap.parse_args()
    import torch
    from common import machine_info as machine
    from common import median

    from posttrainllm import evaluate as ev
    from posttrainllm.evaluate.base_cache import base_results, results_against_base

    model_dir = (
        a.model
        or subprocess.run(
            [sys.executable, str(ROOT / "bench" / "smollm2.py"), "--dir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    model, tok = ev.load_for_eval(model_dir)
    text = _splits()["code_held"][: a.chars]
    tmp = Path(tempfile.mkdtemp(prefix="eval-speed-"))
    path = tmp / "held.txt"
    path.write_text(text)
    cache = tmp / "cache"
    kw = dict(cache_dir=cache, base_identity="bench", batch_size=a.batch_size)
    base_results(lambda: model, tok, [str(path)], a.max_length, **kw)  # recorded once, outside the timings

    def autocast():
        if a.precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    runs = {
        "bare": lambda: bare_loop(model, tok, text, a.max_length, a.batch_size)[1],
        "ours": lambda: ev.evaluate_files(
            model, tok, [str(path)], a.max_length, progress=False, batch_size=a.batch_size
        )["held.txt"]["predicted_tokens"],
        "ours+kl": lambda: ev.evaluate_files(
            model, tok, [str(path)], a.max_length, progress=False, batch_size=a.batch_size, reference=model
        )["held.txt"]["predicted_tokens"],
        "cached": lambda: results_against_base(model, tok, [str(path)], a.max_length, **kw)["held.txt"][
            "predicted_tokens"
        ],
    }
    names = list(runs)
    res: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(a.reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for n in order:
            with autocast():
                t0 = time.perf_counter()
                tokens = runs[n]()
                res[n].append(tokens / (time.perf_counter() - t0))
    ratios = {
        "ours/bare": median([x / y for x, y in zip(res["ours"], res["bare"])]),
        "cached/(ours+kl)": median([x / y for x, y in zip(res["cached"], res["ours+kl"])]),
    }
    print(f"eval speed: {a.chars} chars, windows of {a.max_length}, batch {a.batch_size}, {a.precision}, {a.reps} reps")
    for n in names:
        print(f"  {n:9s} {median(res[n]):9.1f} tokens/s")
    for k, v in ratios.items():
        print(f"  {k}: {v:.3f}")
    print(f"machine: {machine()}")


if __name__ == "__main__":
    main()
