"""Which LR should a tied input/output embedding matrix get under layer decay? Measured, not guessed.

    python bench/tied_policy.py [--quick]

A 4-block llama-style base with tie_word_embeddings=True is pre-trained on the study's Shakespeare + code mix
(bench/llrd_study.py's data), then fine-tuned on Alpaca with --llrd 0.8 under both policies:
  embedding: the shared matrix trains at block 0's LR (base × γ^(N-1));
  head:      the shared matrix trains at the base LR (like the LM head);
plus flat runs for reference, at two LRs and several seeds. Prints val loss and held-out perplexity change.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llrd_study import ROOT, SHARED, _single_thread, cli, eval_json, prepare_data, sft_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "tied"))
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"skipped: {SHARED} not found")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    files = prepare_data(out / "data")
    cfg = out / "base_config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 4, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}))
    base = out / "base"
    steps = 150 if args.quick else 400
    if not (base / "training_complete.json").exists():
        cli(["pretrain", "--dataset", str(files["pretrain"]), "--output-dir", str(base), "--overwrite", "--model-config", str(cfg), "--vocab-size", "2048",
             "--max-length", "256", "--batch-size", "8", "--lr", "1e-3", "--lr-scheduler", "cosine", "--warmup-ratio", "0.05", "--max-steps", str(steps),
             "--seed", "0", "--save-steps", "100000", "--logging-steps", "50"], out / "logs" / "pretrain.log")
    base_eval = eval_json(base, [files["ood_shakespeare"], files["ood_code"]], 256, out / "logs" / "eval-base.log")
    sft = dict(steps=40 if args.quick else 100, batch=8, max_length=192, replay_ratio=0.0)
    seeds = [0] if args.quick else [0, 1, 2]
    points = [dict(method="flat", gamma=1.0, lr=lr) for lr in (1e-3, 2e-3)]
    points += [dict(method="llrd", gamma=0.8, lr=lr, tied_embeddings=pol) for lr in (1e-3, 2e-3) for pol in ("embedding", "head")]
    jobs = [(p, s) for p in points for s in seeds]
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_single_thread) as pool:
        results = list(pool.map(sft_run, *zip(*[(p, s, str(out), {k: str(v) for k, v in files.items()}, sft, base_eval) for p, s in jobs])))
    rows = {}
    for name, r in results:
        key = (r["method"], r.get("tied_embeddings", "-"), r["lr"])
        rows.setdefault(key, []).append(r)
    print(f"{'method':8} {'tied LR':10} {'lr':>7} {'val':>16} {'code Δ%':>14} {'Shakespeare Δ%':>16}")
    summary = []
    for (method, pol, lr), rs in sorted(rows.items()):
        def ms(xs):
            return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)

        val = ms([r["val_loss"] for r in rs])
        code = ms([r["ood_change_pct"]["heldout_code.txt"] for r in rs])
        shk = ms([r["ood_change_pct"]["heldout_shakespeare.txt"] for r in rs])
        summary.append(dict(method=method, tied_policy=pol, lr=lr, n=len(rs), val=val, code=code, shakespeare=shk))
        print(f"{method:8} {pol:10} {lr:7.0e} {val[0]:8.4f} ± {val[1]:.4f} {code[0]:+7.2f} ± {code[1]:.2f} {shk[0]:+8.2f} ± {shk[1]:.2f}")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
