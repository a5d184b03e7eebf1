"""Held-out evaluation as the model's texts start: posttrainllm's `eval` windows against an independent scorer that
starts every window with the tokenizer's BOS, the windows scored without it (what eval did before), and the base
cache's KL against the two-forward KL.

    python bench/bos_eval.py --model DIR [--tuned DIR] [--max-length 128] [--chars 32000]

For each held-out text of ../shared/data (studies/common.py's split: Shakespeare's last 10%, the held-out
documentation prose, the held-out stdlib code; the first --chars characters of each):
  ours       posttrainllm.evaluate.evaluate_files (fp32)
  bare+bos   an independent loop: tokenize without special tokens, windows of the BOS (where the tokenizer puts
             one before a text) + the next max_length - 1 tokens, every text token predicted
  bare       the same windows without BOS (max_length text tokens, the first of each not predicted)
With --tuned (a model trained from --model): the KL(base ‖ tuned) from the base cache (evaluate/base_cache.py)
against the two-forward KL (`eval --reference`), their ratio, the cache's size and times.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _splits():
    import importlib.util

    spec = importlib.util.spec_from_file_location("studies_common", ROOT / "studies" / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.splits(), module.machine()


def bare_nll(model, tokenizer, text: str, max_length: int, bos: bool) -> float:
    """Mean NLL by the plain loop a user would write (one window at a time)."""
    import torch
    import torch.nn.functional as F

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    head = [tokenizer.bos_token_id] if bos else []
    width, total, count = max_length - len(head), 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(ids), width):
            window = torch.tensor([head + ids[start : start + width]])
            if window.shape[1] < 2:
                continue
            logits = model(input_ids=window).logits[0, :-1].float()
            labels = window[0, 1:]
            total += F.cross_entropy(logits, labels, reduction="sum").item()
            count += labels.numel()
    return total / count


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm.evaluate import evaluate_files
    from posttrainllm.evaluate.base_cache import evaluate_against_base
    from posttrainllm.evaluate.stream import window_prefix

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--tuned")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--chars", type=int, default=32000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--kl-only", action="store_true", help="with --tuned: only the KL comparison")
    a = ap.parse_args()
    torch.set_num_threads(1)
    parts, machine = _splits()
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    out: dict = {"machine": machine, "model": a.model, "max_length": a.max_length, "prefix": window_prefix(tok)}
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for name in ("shakespeare_held", "docs_held", "code_held"):
            p = Path(tmp) / f"{name}.txt"
            p.write_text(parts[name][: a.chars], encoding="utf-8")
            paths.append(str(p))
        ours = (
            {}
            if a.kl_only
            else evaluate_files(model, tok, paths, a.max_length, progress=False, batch_size=a.batch_size)
        )
        for path in paths if not a.kl_only else []:
            name = Path(path).name
            text = Path(path).read_text(encoding="utf-8")
            row = {"ours": ours[name]["nll"], "bare": bare_nll(model, tok, text, a.max_length, False)}
            if window_prefix(tok):
                row["bare+bos"] = bare_nll(model, tok, text, a.max_length, True)
                row["ours/bare+bos"] = row["ours"] / row["bare+bos"]
            out[name] = row
            print(json.dumps({name: row}), file=sys.stderr)
        if a.tuned:
            tuned = AutoModelForCausalLM.from_pretrained(a.tuned, dtype=torch.float32).eval()
            t0 = time.perf_counter()
            exact = evaluate_files(
                tuned, tok, paths, a.max_length, progress=False, reference=model, batch_size=a.batch_size
            )
            t_exact = time.perf_counter() - t0
            cache = Path(tmp) / "cache"
            kw = {"cache_dir": cache, "base_identity": "base", "load_base": lambda: model, "batch_size": a.batch_size}
            t0 = time.perf_counter()
            evaluate_against_base(model, tok, paths, a.max_length, **kw)  # the base's one pass: recorded
            t_record = time.perf_counter() - t0
            t0 = time.perf_counter()
            _, cached = evaluate_against_base(tuned, tok, paths, a.max_length, **kw)
            t_cached = time.perf_counter() - t0
            metas = [json.loads(m.read_text()) for m in cache.glob("*/result.json")]
            size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
            out["kl"] = {
                Path(p).name: {
                    "exact": exact[Path(p).name]["kl"],
                    "cached": cached[Path(p).name]["kl"],
                    "cached/exact": cached[Path(p).name]["kl"] / exact[Path(p).name]["kl"],
                }
                for p in paths
            }
            positions = sum(m["positions"] for m in metas)
            out["cache"] = {
                "bytes": size,
                "positions": positions,
                "bytes_per_position": size / positions,
                "top_k": metas[0]["k"],
                "tail_samples": metas[0]["samples"],
                "seconds_two_forward_kl": t_exact,
                "seconds_record_base": t_record,
                "seconds_cached_kl": t_cached,
            }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
