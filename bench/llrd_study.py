"""The Shakespeare → Alpaca layer-decay study: does --llrd keep what the base model knew, and does it beat
plain LR tuning (and replay) at equal in-domain quality?

    python bench/llrd_study.py            # full study (about an hour on 2 CPU cores)
    python bench/llrd_study.py --quick    # minutes: smaller model, fewer steps, one seed

1. data (from ../shared/data, splits as its README suggests): pre-training text = first 90% of
   tinyshakespeare.txt + the CPython modules up to and including typing.py; held out = last 10% of Shakespeare
   and the remaining modules (json/*, heapq, bisect, calendar, fractions, statistics, difflib); Alpaca: first 900
   examples train, last 99 validation.
2. `posttrainllm pretrain` a small llama-style base (8 blocks).
3. `posttrainllm sft` on Alpaca for every (method, γ, LR, seed): flat at ≥ 5 LRs, LLRD at γ ∈ {0.95, 0.9, 0.8, 0.65}
   × 3 LRs, 25% replay of the pre-training text, and replay + LLRD.
4. `posttrainllm eval` on the held-out Shakespeare and code, base vs each result → % perplexity change.
5. docs/results.md (table mean ± std, verdicts) and docs/llrd_study.png (val loss vs OOD regression).

Every stage runs the real CLI in-process (same code path as the shell commands, without paying the imports
69 times). Runs are deterministic on CPU for a given seed, so a re-run reproduces the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OOD_CHARS = 40_000
CONCLUSIONS = "<!-- conclusions: written by hand, kept when the tables above are regenerated -->"
FIXED_LR = 2e-3  # the LR of the curated Alpaca recipes (flat and LLRD), compared in acceptance (a)/(b)


def cli(args: list[str], log: Path) -> None:
    """Run `posttrainllm ARGS` in this process, output to a log file; raise on a non-zero exit."""
    from typer.main import get_command

    from posttrainllm.cli import app

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        try:
            get_command(app).main(args, prog_name="posttrainllm", standalone_mode=False)
            code = 0
        except SystemExit as e:
            code = e.code or 0
    if code:
        raise RuntimeError(f"posttrainllm {' '.join(args)} exited {code}; see {log}")


def eval_json(model: Path, texts: list[Path], max_length: int, log: Path) -> dict:
    out = log.with_suffix(".json")
    cli(["eval", "--model", str(model), *sum((["--text", str(t)] for t in texts), []), "--max-length", str(max_length), "--json"], log)
    data = json.loads(next(ln for ln in reversed(log.read_text().splitlines()) if ln.startswith("{")))
    out.write_text(json.dumps(data, indent=2))
    return data


def prepare_data(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    shakespeare = (SHARED / "tinyshakespeare.txt").read_text(encoding="utf-8")
    cut = int(len(shakespeare) * 0.9)
    code = (SHARED / "python_stdlib_code.txt").read_text(encoding="utf-8")
    modules, current = [], None
    for line in code.splitlines(keepends=True):
        if line.startswith("# ==== Lib/"):
            current = [line.strip()[len("# ==== Lib/"):-len(" ====")], []]
            modules.append(current)
        if current is not None:
            current[1].append(line)
    names = [m[0] for m in modules]
    last_train = names.index("typing.py")
    code_train = "".join("".join(m[1]) for m in modules[: last_train + 1])
    code_held = "".join("".join(m[1]) for m in modules[last_train + 1:])
    alpaca = json.loads((SHARED / "alpaca_en_demo.json").read_text())
    files = {
        "pretrain": out / "pretrain.txt",
        "ood_shakespeare": out / "heldout_shakespeare.txt",
        "ood_code": out / "heldout_code.txt",
        "alpaca_train": out / "alpaca_train.json",
        "alpaca_val": out / "alpaca_val.json",
    }
    files["pretrain"].write_text(shakespeare[:cut] + "\n\n" + code_train, encoding="utf-8")
    files["ood_shakespeare"].write_text(shakespeare[cut:][:OOD_CHARS], encoding="utf-8")
    files["ood_code"].write_text(code_held[:OOD_CHARS], encoding="utf-8")
    files["alpaca_train"].write_text(json.dumps(alpaca[:900]))
    files["alpaca_val"].write_text(json.dumps(alpaca[900:]))
    return files


def grid(quick: bool) -> tuple[list[dict], list[int]]:
    """(method, γ, LR) points; every point runs for every seed."""
    if quick:
        flat = [3e-4, 1e-3, 2e-3]
        points = [dict(method="flat", gamma=1.0, lr=lr) for lr in flat]
        points += [dict(method="llrd", gamma=0.8, lr=lr) for lr in flat]
        points += [dict(method="replay", gamma=1.0, lr=1e-3)]
        return points, [0]
    flat = [2e-4, 4e-4, 7e-4, 1.2e-3, 2e-3]
    llrd_lrs = [7e-4, 1.2e-3, 2e-3]  # layer decay lowers the mean LR, so its sweep sits at the upper end of flat's
    points = [dict(method="flat", gamma=1.0, lr=lr) for lr in flat]
    points += [dict(method="llrd", gamma=g, lr=lr) for g in (0.95, 0.9, 0.8, 0.65) for lr in llrd_lrs]
    points += [dict(method="replay", gamma=1.0, lr=lr) for lr in (7e-4, 1.2e-3)]
    points += [dict(method="replay+llrd", gamma=0.8, lr=lr) for lr in (1.2e-3, 2e-3)]
    return points, [0, 1, 2]


def _single_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def sft_run(p: dict, seed: int, out: str, files: dict, sft: dict, base_eval: dict) -> tuple[str, dict]:
    """One `posttrainllm sft` run + `posttrainllm eval` of the result (in a worker process)."""
    t1 = time.time()
    out = Path(out)
    name = run_name(p, seed)
    rdir = out / "runs" / name
    argv = ["sft", "--model", str(out / "base"), "--dataset", files["alpaca_train"], "--eval-dataset", files["alpaca_val"],
            "--output-dir", str(rdir), "--overwrite", "--lr", f"{p['lr']:g}", "--max-steps", str(sft["steps"]),
            "--batch-size", str(sft["batch"]), "--max-length", str(sft["max_length"]), "--seed", str(seed),
            "--save-steps", "100000", "--logging-steps", "50"]
    if p["gamma"] < 1.0:
        argv += ["--llrd", str(p["gamma"])]
    if p["method"].startswith("replay"):
        argv += ["--replay-dataset", files["pretrain"], "--replay-ratio", str(sft["replay_ratio"])]
    if p.get("tied_embeddings"):
        argv += ["--tied-embeddings", p["tied_embeddings"]]
    cli(argv, out / "logs" / f"{name}.log")
    val = json.loads((rdir / "eval_results.json").read_text())["train"]["eval_loss"]
    after = eval_json(rdir, [Path(files["ood_shakespeare"]), Path(files["ood_code"])], 256, out / "logs" / f"{name}-eval.log")
    change = {k: 100 * (after[k]["perplexity"] / base_eval[k]["perplexity"] - 1) for k in base_eval}
    for f in rdir.glob("*.safetensors"):  # keep the record, not the weights (disk)
        f.unlink()
    return name, {**p, "seed": seed, "val_loss": val, "ood_change_pct": change, "seconds": round(time.time() - t1, 1)}


def run_name(p: dict, seed: int) -> str:
    tied = f"-tied_{p['tied_embeddings']}" if p.get("tied_embeddings") else ""
    return f"{p['method']}-g{p['gamma']}-lr{p['lr']:g}{tied}-s{seed}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="minutes instead of an hour: tiny model, few steps, one seed")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "study"), help="work directory (models, logs)")
    ap.add_argument("--docs", default=str(ROOT / "docs"), help="where results.md and the plot go")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/results.md (only results.json)")
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)), help="parallel single-thread SFT runs")
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"skipped: {SHARED} not found (the study needs ../shared/data)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out) / ("quick" if args.quick else "full")
    t0 = time.time()
    files = prepare_data(out / "data")
    quick = args.quick
    # the base: llama-style, 8 blocks (4 in quick mode) so that depth matters; written as a config.json for `pretrain`
    pre = dict(blocks=4 if quick else 8, hidden=64, intermediate=176, vocab=2048, steps=150 if quick else 800, batch=8, lr=1e-3)
    model_config = out / "base_config.json"
    model_config.write_text(json.dumps({"model_type": "llama", "hidden_size": pre["hidden"], "intermediate_size": pre["intermediate"],
                                        "num_hidden_layers": pre["blocks"], "num_attention_heads": 4, "num_key_value_heads": 2,
                                        "max_position_embeddings": 512, "tie_word_embeddings": False}))
    sft = dict(steps=40 if quick else 150, batch=8, max_length=192, replay_ratio=0.25)
    base = out / "base"
    if not (base / "training_complete.json").exists():
        print(f"pre-training the base ({pre['blocks']} blocks, {pre['steps']} steps) ...", flush=True)
        cli(["pretrain", "--dataset", str(files["pretrain"]), "--output-dir", str(base), "--overwrite", "--model-config", str(model_config),
             "--vocab-size", str(pre["vocab"]), "--max-length", "256", "--batch-size", str(pre["batch"]), "--lr", str(pre["lr"]),
             "--lr-scheduler", "cosine", "--warmup-ratio", "0.05", "--max-steps", str(pre["steps"]), "--seed", "0",
             "--save-steps", "100000", "--logging-steps", "50"], out / "logs" / "pretrain.log")
    ood = [files["ood_shakespeare"], files["ood_code"]]
    base_eval = eval_json(base, ood, 256, out / "logs" / "eval-base.log")
    print(f"base: {json.dumps({k: round(v['perplexity'], 3) for k, v in base_eval.items()})} ({time.time() - t0:.0f} s)", flush=True)

    points, seeds = grid(quick)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    todo = [(p, seed) for p in points for seed in seeds if run_name(p, seed) not in results]
    # small models use 1 thread poorly-parallel matmuls: N single-thread workers beat one N-thread process
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_single_thread) as pool:
        futures = {pool.submit(sft_run, p, seed, str(out), {k: str(v) for k, v in files.items()}, sft, base_eval): (p, seed) for p, seed in todo}
        for fut in as_completed(futures):
            name, record = fut.result()
            results[name] = record
            results_path.write_text(json.dumps(results, indent=2, sort_keys=True))
            change = record["ood_change_pct"]
            print(f"[{len(results)}/{len(points) * len(seeds)}] {name}: val {record['val_loss']:.4f}  "
                  + "  ".join(f"{k} {v:+.1f}%" for k, v in change.items()) + f"  ({record['seconds']:.0f} s)", flush=True)
    wall = time.time() - t0
    summary_path = out / "summary.json"
    if not todo and summary_path.exists():  # nothing new ran: keep the wall time of the run that produced the numbers
        wall = json.loads(summary_path.read_text())["meta"].get("wall_time_s", wall)
    summary = summarize(results, points, seeds)
    meta = {"command": "python bench/llrd_study.py" + (" --quick" if quick else ""), "wall_time_s": round(wall), "machine": machine(),
            "pretrain": pre, "sft": sft, "base_eval": base_eval, "ood_chars": OOD_CHARS}
    (out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=2))
    verdict = analyse(summary)
    print(json.dumps(verdict, indent=2))
    if not args.no_docs:
        docs = Path(args.docs)
        plot(summary, docs / ("llrd_study_quick.png" if quick else "llrd_study.png"))
        write_results_md(docs / ("results_quick.md" if quick else "results.md"), meta, summary, verdict, quick)


def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    import torch

    return f"{os.cpu_count()} CPU cores ({cpu or platform.processor()}), Python {platform.python_version()}, torch {torch.__version__}, no GPU"


def _ms(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(results: dict, points: list[dict], seeds: list[int]) -> list[dict]:
    rows = []
    for p in points:
        runs = [results[run_name(p, s)] for s in seeds if run_name(p, s) in results]
        if not runs:
            continue
        row = {**p, "n": len(runs)}
        row["val"], row["val_std"] = _ms([r["val_loss"] for r in runs])
        for k in runs[0]["ood_change_pct"]:
            key = "code" if "code" in k else "shakespeare"
            row[key], row[key + "_std"] = _ms([r["ood_change_pct"][k] for r in runs])
        rows.append(row)
    return rows


def _interp(curve: list[tuple[float, float]], x: float) -> float | None:
    """Linear interpolation of y at x on a curve sorted by x; None outside its range."""
    curve = sorted(curve)
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def analyse(summary: list[dict]) -> dict:
    """Frontier comparison: for each non-flat point, flat's OOD change interpolated at the same val loss."""
    flat = [r for r in summary if r["method"] == "flat"]
    out = {"vs_flat_at_equal_val": []}
    for r in summary:
        if r["method"] == "flat":
            continue
        entry = {"method": r["method"], "gamma": r["gamma"], "lr": r["lr"], "val": round(r["val"], 4)}
        for key in ("code", "shakespeare"):
            ref = _interp([(f["val"], f[key]) for f in flat], r["val"])
            entry[key] = round(r[key], 2)
            entry[f"flat_{key}_at_same_val"] = None if ref is None else round(ref, 2)
        out["vs_flat_at_equal_val"].append(entry)
    # acceptance (a)/(b) at one fixed recipe LR: LLRD γ=0.8 vs flat
    def pick(method, gamma, lr):
        return next((r for r in summary if r["method"] == method and r["gamma"] == gamma and math.isclose(r["lr"], lr)), None)

    lr = FIXED_LR if any(math.isclose(r["lr"], FIXED_LR) for r in summary if r["method"] == "flat") else 1e-3
    f, l = pick("flat", 1.0, lr), pick("llrd", 0.8, lr)
    if f and l:
        out[f"fixed_recipe_lr_{lr:g}"] = {
            "flat": {k: round(f[k], 3) for k in ("val", "code", "shakespeare")},
            "llrd_0.8": {k: round(l[k], 3) for k in ("val", "code", "shakespeare")},
            "a_val_llrd_le_flat": l["val"] <= f["val"],
            "b_llrd_ood_le_1pct": max(l["code"], l["shakespeare"]) <= 1.0,
        }
    return out


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    series: dict[str, list[dict]] = {}
    for r in summary:
        label = "flat" if r["method"] == "flat" else (f"LLRD γ={r['gamma']}" if r["method"] == "llrd" else ("replay 25%" if r["method"] == "replay" else f"replay 25% + LLRD γ={r['gamma']}"))
        series.setdefault(label, []).append(r)
    for ax, key, title in ((axes[0], "code", "held-out code"), (axes[1], "shakespeare", "held-out Shakespeare")):
        for label, rows in series.items():
            rows = sorted(rows, key=lambda r: r["lr"])
            style = dict(lw=2.5, color="black") if label == "flat" else {}
            ax.errorbar([r["val"] for r in rows], [r[key] for r in rows], xerr=[r["val_std"] for r in rows], yerr=[r[key + "_std"] for r in rows],
                        marker="o", capsize=3, label=label, **style)
            for r in rows:
                ax.annotate(f"{r['lr']:g}", (r["val"], r[key]), fontsize=7, alpha=0.6, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("Alpaca validation loss (lower = learned more)")
        ax.set_ylabel(f"{title} PPL change vs base, % (lower = forgot less)")
        ax.set_title(f"{title}: points = LR sweep, bars = ±1 std over seeds", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results_md(path: Path, meta: dict, summary: list[dict], verdict: dict, quick: bool) -> None:
    lines = [
        "# Results: layer-wise LR decay, Shakespeare → Alpaca" + (" (quick mode)" if quick else ""),
        "",
        f"Produced by `{meta['command']}` in {meta['wall_time_s'] / 60:.1f} min on {meta['machine']}.",
        f"Base: llama-style, {meta['pretrain']['blocks']} blocks, hidden {meta['pretrain']['hidden']}, BPE vocab {meta['pretrain']['vocab']}, pre-trained {meta['pretrain']['steps']} steps (batch {meta['pretrain']['batch']} × 256 tokens, lr {meta['pretrain']['lr']:g}, cosine); SFT {meta['sft']['steps']} steps, "
        f"batch {meta['sft']['batch']}, max length {meta['sft']['max_length']}, linear schedule; OOD texts cut to the first "
        f"{meta['ood_chars']:,} characters; perplexity with windows of 256 tokens (`posttrainllm eval`).",
        "",
        "| method | γ | LR | seeds | Alpaca val loss | held-out code PPL Δ% | held-out Shakespeare PPL Δ% |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summary:
        lines.append(f"| {r['method']} | {r['gamma']} | {r['lr']:g} | {r['n']} | {r['val']:.4f} ± {r['val_std']:.4f} | {r['code']:+.1f} ± {r['code_std']:.1f} | {r['shakespeare']:+.1f} ± {r['shakespeare_std']:.1f} |")
    lines += ["", f"![frontier]({'llrd_study_quick.png' if quick else 'llrd_study.png'})", "", "## Frontier: each method vs flat at equal validation loss", "",
              "| method | γ | LR | val | code Δ% | flat code Δ% at same val | Shakespeare Δ% | flat Shakespeare Δ% at same val |", "|---|---|---|---|---|---|---|---|"]
    for e in verdict["vs_flat_at_equal_val"]:
        fmt = lambda v: "outside flat's range" if v is None else f"{v:+.1f}"  # noqa: E731
        lines.append(f"| {e['method']} | {e['gamma']} | {e['lr']:g} | {e['val']:.4f} | {e['code']:+.1f} | {fmt(e['flat_code_at_same_val'])} | {e['shakespeare']:+.1f} | {fmt(e['flat_shakespeare_at_same_val'])} |")
    for key, v in verdict.items():
        if key.startswith("fixed_recipe_lr_"):
            lr = key.rsplit("_", 1)[1]
            lines += ["", f"## The original criteria at the fixed recipe LR ({lr}), flat vs LLRD γ=0.8", "",
                      "| run | val loss | code Δ% | Shakespeare Δ% |", "|---|---|---|---|",
                      f"| flat | {v['flat']['val']:.3f} | {v['flat']['code']:+.1f} | {v['flat']['shakespeare']:+.1f} |",
                      f"| LLRD γ=0.8 | {v['llrd_0.8']['val']:.3f} | {v['llrd_0.8']['code']:+.1f} | {v['llrd_0.8']['shakespeare']:+.1f} |", "",
                      f"(a) LLRD val loss ≤ flat: **{'met' if v['a_val_llrd_le_flat'] else 'not met'}**. "
                      f"(b) LLRD OOD regression ≤ 1%: **{'met' if v['b_llrd_ood_le_1pct'] else 'not met'}**."]
    lines += ["", "Raw per-run numbers: `bench/out/study/*/results.json` after a run (not committed).", ""]
    kept = ""
    if path.exists() and CONCLUSIONS in path.read_text():
        kept = path.read_text().split(CONCLUSIONS, 1)[1]
    path.write_text("\n".join(lines) + "\n" + CONCLUSIONS + kept)


if __name__ == "__main__":
    main()
