"""Which LR should a tied input/output embedding matrix get under layer decay? Measured, not guessed.

    python studies/tied_policy.py [--quick]

A 4-block llama-style base with tie_word_embeddings=True is pre-trained on the study's Shakespeare + code mix
(studies/llrd_study.py's data), then fine-tuned on Alpaca with --llrd 0.8 under both policies:
  embedding: the shared matrix trains at block 0's LR (base × γ^(N-1));
  head:      the shared matrix trains at the base LR (like the LM head);
plus flat runs for reference, at two LRs and several seeds. Every fine-tune is a cell of `posttrainllm sweep`.
Prints eval loss and held-out perplexity change, mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llrd_study import ROOT, SHARED, cli, prepare_data, sft_args, sweep  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "studies" / "out" / "tied"))
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"skipped: {SHARED} not found")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    files = prepare_data(out / "data")
    cfg = out / "base_config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 176,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 512,
                "tie_word_embeddings": True,
            }
        )
    )
    base = out / "base"
    if not (base / "training_complete.json").exists():
        cli(
            [
                "pretrain",
                "--dataset",
                str(files["pretrain"]),
                "--output-dir",
                str(base),
                "--model-config",
                str(cfg),
                "--vocab-size",
                "2048",
                "--max-length",
                "256",
                "--batch-size",
                "8",
                "--lr",
                "1e-3",
                "--lr-scheduler",
                "cosine",
                "--warmup-ratio",
                "0.05",
                "--max-steps",
                "150" if args.quick else "400",
                "--seed",
                "0",
                "--save-steps",
                "100000",
                "--logging-steps",
                "50",
            ],
            out / "logs" / "pretrain.log",
        )
    common = sft_args(base, files, ["ood_shakespeare", "ood_code"], 40 if args.quick else 100)
    seeds = "0" if args.quick else "0,1,2"
    from posttrainllm.sweep import summarize

    rows = [
        ("flat", "-", r)
        for r in summarize(
            sweep("sft", [*common, "--llrd", "1.0", "--lr", "1e-3,2e-3", "--seeds", seeds, "--jobs", "2"], out / "flat")
        )
    ]
    for policy in ("embedding", "head"):
        cells = sweep(
            "sft",
            [
                *common,
                "--tied-embeddings",
                policy,
                "--llrd",
                "0.8",
                "--lr",
                "1e-3,2e-3",
                "--seeds",
                seeds,
                "--jobs",
                "2",
            ],
            out / f"tied-{policy}",
        )
        rows += [("llrd", policy, r) for r in summarize(cells)]
    print(
        f"{'method':8} {'tied LR':10} {'lr':>7} {'eval loss':>18} "
        + " ".join(f"{n + ' Δ%':>26}" for n in rows[0][2]["ood"])
    )
    for method, policy, r in rows:
        ood = " ".join(f"{v['change_pct']:+17.2f} ± {v['std']:.2f}" for v in r["ood"].values())
        print(f"{method:8} {policy:10} {r['lr']:7.0e} {r['eval_loss']:9.4f} ± {r['eval_loss_std']:.4f} {ood}")
    (out / "summary.json").write_text(json.dumps([{"method": m, "tied_policy": p, **r} for m, p, r in rows], indent=2))


if __name__ == "__main__":
    main()
