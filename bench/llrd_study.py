"""The layer-decay studies of docs/results.md, all run through `posttrainllm sweep` (one implementation).

    python bench/llrd_study.py                      # every study (hours on 2 CPU cores; resumable)
    python bench/llrd_study.py --study alpaca       # one of: alpaca, loraplus, depth, dpo
    python bench/llrd_study.py --quick              # minutes: fewer steps, points and seeds (a smoke run)

Data (from ../shared/data, splits as its README suggests):
  pre-training text   first 90% of tinyshakespeare.txt + the CPython modules up to and including typing.py
                      (+ for the depth study: python_docs.txt minus the held-out documents)
  held out (OOD)      last 10% of Shakespeare; the remaining modules (json/*, heapq, bisect, calendar, ...);
                      whole python_docs documents of library/ whose name starts with s-z (depth study)
  Alpaca              first 900 examples train, last 99 validation
  DPO                 dpo_en_demo.json, 10% held out (`--eval-split 0.1`)

Studies:
  alpaca    an 8-block base; SFT flat over 5 LRs, γ ∈ {0.95, 0.9, 0.8, 0.65} × 3 LRs, 25% replay, replay + γ 0.8
  loraplus  the same base; LoRA r=16, λ ∈ {1, 16} × γ ∈ {1, 0.8} × LR ∈ {5e-4, 2e-3}
  depth     8- and 24-block bases of the same width, 700 pre-training steps on the bigger corpus; flat over 4 LRs
            vs γ ∈ {0.9, 0.8} and, on the deeper base, the γ with the same bottom-block scale γ^(N-1), at lr 2e-3
  dpo       DPO of an Alpaca-SFT model on dpo_en_demo.json, flat vs γ ∈ {0.9, 0.8} over 3 LRs

Every stage is the real CLI: `posttrainllm pretrain` for the bases, `posttrainllm sweep` for the grids (its cells are
normal `sft`/`dpo` runs). A re-run reuses finished bases and cells. Results: bench/out/study/<mode>/ (not
committed) and docs/results.md (tables regenerated; the hand-written conclusions after the marker are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
OOD_CHARS = 40_000
CONCLUSIONS = "<!-- conclusions: written by hand, kept when the tables above are regenerated -->"


# ------------------------------------------------------------------------------------------------ plumbing
def cli(args: list[str], log: Path) -> None:
    """`posttrainllm ARGS` in this process (pretrain, eval), output to a log file; raise on a non-zero exit."""
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


def sweep(command: str, args: list[str], out: Path) -> list[dict]:
    """`posttrainllm sweep COMMAND ARGS --output-dir OUT`; returns its finished cells."""
    from posttrainllm import sweep as sw

    spec = sw.parse(command, [*args, "--output-dir", str(out)])
    result = sw.run(spec, echo=lambda line: print("   ", line, flush=True))
    if result["failed"]:
        raise RuntimeError(f"{len(result['failed'])} cells failed, e.g. {result['failed'][0]}")
    return result["cells"]


def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{os.cpu_count()} CPU cores ({cpu or platform.processor()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}, {gpu}"
    )


def _split_modules(text: str, marker: str, end: str = "") -> list[tuple[str, str]]:
    """[(name, text)] of a concatenation whose parts start with lines `marker<name>end`."""
    parts: list[list] = []
    for line in text.splitlines(keepends=True):
        if line.startswith(marker):
            parts.append([line.strip()[len(marker) : len(line.strip()) - len(end)], []])
        if parts:
            parts[-1][1].append(line)
    return [(name, "".join(lines)) for name, lines in parts]


def prepare_data(out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    shakespeare = (SHARED / "tinyshakespeare.txt").read_text(encoding="utf-8")
    cut = int(len(shakespeare) * 0.9)
    modules = _split_modules((SHARED / "python_stdlib_code.txt").read_text(encoding="utf-8"), "# ==== Lib/", " ====")
    last_train = [m[0] for m in modules].index("typing.py")
    code_train = "".join(m[1] for m in modules[: last_train + 1])
    code_held = "".join(m[1] for m in modules[last_train + 1 :])
    docs = _split_modules((SHARED / "python_docs.txt").read_text(encoding="utf-8"), ".. document: ")
    held = [d for d in docs if d[0].startswith("library/") and d[0].split("/", 1)[1][:1].lower() >= "s"]
    docs_train = "".join(d[1] for d in docs if d not in held)
    docs_held = "".join(d[1] for d in held)
    alpaca = json.loads((SHARED / "alpaca_en_demo.json").read_text())
    files = {
        "pretrain": out / "pretrain.txt",
        "pretrain_big": out / "pretrain_big.txt",
        "ood_shakespeare": out / "heldout_shakespeare.txt",
        "ood_code": out / "heldout_code.txt",
        "ood_docs": out / "heldout_docs.txt",
        "alpaca_train": out / "alpaca_train.json",
        "alpaca_val": out / "alpaca_val.json",
        "dpo": SHARED / "dpo_en_demo.json",
    }
    files["pretrain"].write_text(shakespeare[:cut] + "\n\n" + code_train, encoding="utf-8")
    files["pretrain_big"].write_text(shakespeare[:cut] + "\n\n" + code_train + "\n\n" + docs_train, encoding="utf-8")
    files["ood_shakespeare"].write_text(shakespeare[cut:][:OOD_CHARS], encoding="utf-8")
    files["ood_code"].write_text(code_held[:OOD_CHARS], encoding="utf-8")
    files["ood_docs"].write_text(docs_held[:OOD_CHARS], encoding="utf-8")
    files["alpaca_train"].write_text(json.dumps(alpaca[:900]))
    files["alpaca_val"].write_text(json.dumps(alpaca[900:]))
    return files


def pretrain(
    out: Path, name: str, corpus: Path, blocks: int, steps: int, quick: bool, log_dir: Path, hidden: int = 64
) -> Path:
    """A llama-style base, `hidden` wide, `blocks` blocks, BPE vocab 2048, via `posttrainllm pretrain`."""
    base = out / name
    if (base / "training_complete.json").exists():
        return base
    config = out / f"{name}_config.json"
    heads = max(4, hidden // 64)
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": hidden,
                "intermediate_size": int(hidden * 2.75),
                "num_hidden_layers": blocks,
                "num_attention_heads": heads,
                "num_key_value_heads": heads // 2,
                "max_position_embeddings": 512,
                "tie_word_embeddings": False,
            }
        )
    )
    print(f"  pre-training {name}: {blocks} blocks, {steps} steps on {corpus.name} ...", flush=True)
    cli(
        [
            "pretrain",
            "--dataset",
            str(corpus),
            "--output-dir",
            str(base),
            "--model-config",
            str(config),
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
            str(steps),
            "--seed",
            "0",
            "--save-steps",
            "100000",
            "--logging-steps",
            "50",
            "--eval-split",
            "0.01",
            "--eval-steps",
            str(max(50, steps // 6)),
        ],
        log_dir / f"pretrain-{name}.log",
    )
    return base


def pretrain_curve(base: Path) -> list[tuple[int, float]]:
    state = json.loads((base / "trainer_state.json").read_text())
    return sorted({h["step"]: h["eval_loss"] for h in state["log_history"] if "eval_loss" in h}.items())


# ------------------------------------------------------------------------------------------------ the studies
def sft_args(base: Path, files: dict, ood: list[str], steps: int, extra: list[str] = ()) -> list[str]:
    args = [
        "--model",
        str(base),
        "--dataset",
        str(files["alpaca_train"]),
        "--eval-dataset",
        str(files["alpaca_val"]),
        "--max-steps",
        str(steps),
        "--batch-size",
        "8",
        "--max-length",
        "192",
        "--save-steps",
        "100000",
        "--logging-steps",
        "50",
        "--discard-weights",
    ]
    for key in ood:
        args += ["--ood-eval", str(files[key])]
    return args + list(extra)


def study_alpaca(ctx: dict) -> dict:
    files, q = ctx["files"], ctx["quick"]
    base = pretrain(ctx["out"], "base8", files["pretrain"], 4 if q else 8, 150 if q else 800, q, ctx["logs"])
    common = sft_args(base, files, ["ood_shakespeare", "ood_code"], 40 if q else 150)
    seeds = "0" if q else "0,1,2"
    grid = [  # (llrd, lr, replay ratio)
        ("1.0", "3e-4,1e-3,2e-3" if q else "2e-4,4e-4,7e-4,1.2e-3,2e-3", "0"),
        ("0.8" if q else "0.95,0.9,0.8,0.65", "1e-3,2e-3" if q else "7e-4,1.2e-3,2e-3", "0"),
        ("1.0", "1e-3" if q else "7e-4,1.2e-3", "0.25"),
        ("0.8", "2e-3" if q else "1.2e-3,2e-3", "0.25"),
    ]
    cells = []
    for gammas, lrs, replay in grid:
        extra = ["--replay-dataset", str(files["pretrain"])] if replay != "0" else []
        cells += sweep(
            "sft",
            [*common, *extra, "--llrd", gammas, "--lr", lrs, "--replay-ratio", replay, "--seeds", seeds, "--jobs", "2"],
            ctx["out"] / "alpaca",
        )
    return {"base": base, "cells": cells}


def study_loraplus(ctx: dict) -> dict:
    files, q = ctx["files"], ctx["quick"]
    base = pretrain(ctx["out"], "base8", files["pretrain"], 4 if q else 8, 150 if q else 800, q, ctx["logs"])
    out = {}
    for ratio in ("1", "16"):
        extra = ["--lora-r", "16"] + (["--loraplus-ratio", ratio] if ratio != "1" else [])
        args = sft_args(base, files, ["ood_shakespeare", "ood_code"], 40 if q else 150, extra)
        out[ratio] = sweep(
            "sft",
            [
                *args,
                "--llrd",
                "1.0,0.8",
                "--lr",
                "5e-4" if q else "5e-4,2e-3",
                "--seeds",
                "0" if q else "0,1,2",
                "--jobs",
                "2",
            ],
            ctx["out"] / f"loraplus-{ratio}",
        )
    return out


def study_depth(ctx: dict) -> dict:
    files, q = ctx["files"], ctx["quick"]
    steps = ctx.get("pretrain_steps") or (150 if q else 700)
    depths = ctx.get("depths") or ((2, 6) if q else (8, 24))
    res = {}
    for blocks in depths:
        name = f"depth{blocks}" + (f"-h{ctx['hidden']}" if ctx.get("hidden", 64) != 64 else "")
        base = pretrain(
            ctx["out"], name, files["pretrain_big"], blocks, steps, q, ctx["logs"], hidden=ctx.get("hidden", 64)
        )
        common = sft_args(base, files, ["ood_shakespeare", "ood_code", "ood_docs"], 40 if q else 150)
        seeds = ctx.get("seeds") or ("0" if q else "0,1,2")
        small = min(depths)
        # γ, and for the deeper base also the γ that gives the shallow base's bottom-block scale γ^(N-1)
        gammas = ["0.9", "0.8"]
        if blocks != small:
            gammas += [f"{0.9 ** ((small - 1) / (blocks - 1)):.4f}", f"{0.8 ** ((small - 1) / (blocks - 1)):.4f}"]
        jobs = str(ctx.get("jobs", 2))
        cells = sweep(
            "sft",
            [
                *common,
                "--llrd",
                "1.0",
                "--lr",
                ctx.get("flat_lrs") or ("1e-3,2e-3" if q else "7e-4,1.2e-3,2e-3,3.5e-3"),
                "--seeds",
                seeds,
                "--jobs",
                jobs,
            ],
            ctx["out"] / name,
        )
        cells += sweep(
            "sft",
            [
                *common,
                "--llrd",
                ",".join(gammas),
                "--lr",
                ctx.get("llrd_lrs") or "2e-3",
                "--seeds",
                seeds,
                "--jobs",
                jobs,
            ],
            ctx["out"] / name,
        )
        res[blocks] = {"base": base, "cells": cells, "curve": pretrain_curve(base)}
    return res


def study_dpo(ctx: dict) -> dict:
    files, q = ctx["files"], ctx["quick"]
    base = pretrain(ctx["out"], "base8", files["pretrain"], 4 if q else 8, 150 if q else 800, q, ctx["logs"])
    sft_model = ctx["out"] / "sft-for-dpo"
    if not (sft_model / "training_complete.json").exists():
        print("  SFT of the base on Alpaca (the DPO starting point) ...", flush=True)
        cli(
            [
                "sft",
                "--model",
                str(base),
                "--dataset",
                str(files["alpaca_train"]),
                "--output-dir",
                str(sft_model),
                "--lr",
                "1e-3",
                "--max-steps",
                "40" if q else "150",
                "--batch-size",
                "8",
                "--max-length",
                "192",
                "--seed",
                "0",
                "--save-steps",
                "100000",
            ],
            ctx["logs"] / "sft-for-dpo.log",
        )
    args = [
        "--model",
        str(sft_model),
        "--dataset",
        str(files["dpo"]),
        "--eval-split",
        "0.1",
        "--max-steps",
        "20" if q else "100",
        "--batch-size",
        "8",
        "--max-length",
        "256",
        "--save-steps",
        "100000",
        "--logging-steps",
        "25",
        "--discard-weights",
        "--ood-eval",
        str(files["ood_shakespeare"]),
        "--ood-eval",
        str(files["ood_code"]),
    ]
    cells = sweep(
        "dpo",
        [
            *args,
            "--llrd",
            "1.0,0.8" if q else "1.0,0.9,0.8",
            "--lr",
            "1e-4" if q else "3e-5,1e-4,3e-4",
            "--seeds",
            "0" if q else "0,1,2",
            "--jobs",
            "2",
        ],
        ctx["out"] / "dpo",
    )
    return {"base": sft_model, "cells": cells}


STUDIES = {"alpaca": study_alpaca, "loraplus": study_loraplus, "depth": study_depth, "dpo": study_dpo}


# ------------------------------------------------------------------------------------------------ reporting
def _label(r: dict) -> str:
    label = "flat" if r["gamma"] == 1.0 else f"γ={r['gamma']:g}"
    return label + (f" + replay {r['replay_ratio']:g}" if r["replay_ratio"] else "")


def frontier_rows(summary: list[dict], ood: list[str], x: str = "eval_loss") -> list[str]:
    """Markdown rows: each non-flat point vs flat's value interpolated at the same x (eval loss or reward acc.)."""
    from posttrainllm.sweep import efficient_branch, interpolate

    flat = [r for r in summary if r["gamma"] == 1.0 and r["replay_ratio"] == 0]
    curve = efficient_branch(flat, x, higher_is_better=x != "eval_loss")  # flat's LRs up to its best x
    lines = []
    for r in summary:
        if r in flat:
            continue
        cells = [_label(r), f"{r['lr']:g}", f"{r[x]:.4f}"]
        for name in ood:
            ref = interpolate([(f[x], f["ood"][name]["change_pct"]) for f in curve], r[x])
            cells += [f"{r['ood'][name]['change_pct']:+.1f}", "outside flat's range" if ref is None else f"{ref:+.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def table(summary: list[dict], ood: list[str], dpo: bool = False) -> list[str]:
    head = (
        ["run", "LR", "seeds", "eval loss"]
        + (["reward accuracy", "reward margin"] if dpo else [])
        + [f"{n} Δ%" for n in ood]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(summary, key=lambda r: (r["replay_ratio"], -r["gamma"], r["lr"])):
        cells = [_label(r), f"{r['lr']:g}", str(r["seeds"]), f"{r['eval_loss']:.4f} ± {r['eval_loss_std']:.4f}"]
        if dpo:
            cells += [
                f"{r.get('reward_accuracy', float('nan')):.3f} ± {r.get('reward_accuracy_std', 0):.3f}",
                f"{r.get('reward_margin', float('nan')):.3f} ± {r.get('reward_margin_std', 0):.3f}",
            ]
        cells += [f"{r['ood'][n]['change_pct']:+.1f} ± {r['ood'][n]['std']:.1f}" for n in ood]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot(
    summary: list[dict], ood: list[str], path: Path, x: str = "eval_loss", xlabel: str = "in-domain eval loss"
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ood), figsize=(6.5 * len(ood), 5), squeeze=False)
    series: dict[str, list[dict]] = {}
    for r in summary:
        series.setdefault(_label(r), []).append(r)
    for ax, name in zip(axes[0], ood):
        for label, rows in sorted(series.items(), key=lambda kv: kv[0] != "flat"):
            rows = sorted(rows, key=lambda r: r["lr"])
            style = dict(lw=2.5, color="black") if label == "flat" else dict(ls="--") if "replay" in label else {}
            ax.errorbar(
                [r[x] for r in rows],
                [r["ood"][name]["change_pct"] for r in rows],
                yerr=[r["ood"][name]["std"] for r in rows],
                marker="o",
                capsize=3,
                label=label,
                **style,
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{name}: perplexity change vs base, %")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def ood_names(summary: list[dict]) -> list[str]:
    return list(dict.fromkeys(n for r in summary for n in r["ood"]))


def report(results: dict, meta: dict, docs: Path, quick: bool) -> None:
    from posttrainllm.sweep import summarize

    suffix = "_quick" if quick else ""
    lines = [
        "# Results: what layer-wise LR decay does" + (" (quick mode)" if quick else ""),
        "",
        f"Produced by `{meta['command']}` on {meta['machine']}; compute per study below. Every run is a normal "
        "`posttrainllm` command driven by `posttrainllm sweep`. Forgetting = perplexity change of held-out text "
        f"(the first {OOD_CHARS:,} characters of each set) from before to after the run, measured by the run's own "
        "`--ood-eval` with windows of its `--max-length`; mean ± std over seeds.",
        "",
    ]
    if "alpaca" in results:
        s = summarize(results["alpaca"]["cells"])
        ood = ood_names(s)
        plot(s, ood, docs / f"llrd_study{suffix}.png")
        lines += [
            "## 1. Alpaca SFT of an 8-block base: layer decay, replay and flat LR tuning",
            "",
            f"Compute: {meta['minutes'].get('alpaca', 0):.0f} min. Base: {meta['bases'].get('alpaca', '')}.",
            "",
        ]
        lines += (
            table(s, ood)
            + [
                "",
                f"![frontier](llrd_study{suffix}.png)",
                "",
                "Each point vs flat at the same eval loss (flat interpolated along its LR curve):",
                "",
                "| run | LR | eval loss | " + " | ".join(f"{n} Δ% | flat at same eval" for n in ood) + " |",
                "|" + "---|" * (3 + 2 * len(ood)),
            ]
            + frontier_rows(s, ood)
            + [""]
        )
    if "loraplus" in results:
        lines += [
            "## 2. LoRA+ (λ = 16) with and without layer decay",
            "",
            f"Compute: {meta['minutes'].get('loraplus', 0):.0f} min. LoRA r = 16 "
            "(all linear layers), same base and data as §1.",
            "",
        ]
        for ratio, cells in results["loraplus"].items():
            s = summarize(cells)
            lines += [f"**λ = {ratio}**", ""] + table(s, ood_names(s)) + [""]
    if "depth" in results:
        lines += [
            "## 3. Does the advantage grow with depth?",
            "",
            f"Compute: {meta['minutes'].get('depth', 0):.0f} min. Bases: {meta['bases'].get('depth', '')}; "
            "held-out documentation documents are a third OOD set. Same width, the depths below.",
            "",
        ]
        for blocks, d in results["depth"].items():
            s = summarize(d["cells"])
            ood = ood_names(s)
            plot(s, ood, docs / f"depth{blocks}{suffix}.png")
            curve = ", ".join(f"{step}: {loss:.3f}" for step, loss in d["curve"])
            lines += [f"### {blocks} blocks", "", f"Pre-training held-out loss by step: {curve}.", ""]
            lines += (
                table(s, ood)
                + [
                    "",
                    f"![depth {blocks}](depth{blocks}{suffix}.png)",
                    "",
                    "| run | LR | eval loss | " + " | ".join(f"{n} Δ% | flat at same eval" for n in ood) + " |",
                    "|" + "---|" * (3 + 2 * len(ood)),
                ]
                + frontier_rows(s, ood)
                + [""]
            )
    if "dpo" in results:
        s = summarize(results["dpo"]["cells"])
        ood = ood_names(s)
        lines += [
            "## 4. DPO",
            "",
            f"Compute: {meta['minutes'].get('dpo', 0):.0f} min. Start: the §1 base after 150 flat Alpaca SFT "
            "steps at lr 1e-3; DPO on dpo_en_demo.json with 10% of the pairs held out for the reward metrics.",
            "",
        ]
        plot(s, ood, docs / f"dpo{suffix}.png", x="reward_margin", xlabel="held-out reward margin")
        lines += (
            table(s, ood, dpo=True)
            + [
                "",
                f"![dpo](dpo{suffix}.png)",
                "",
                "Each point vs flat at the same held-out reward margin (reward accuracy on the held-out pairs does not "
                "change with the LR here, see the conclusions):",
                "",
                "| run | LR | reward margin | " + " | ".join(f"{n} Δ% | flat at same margin" for n in ood) + " |",
                "|" + "---|" * (3 + 2 * len(ood)),
            ]
            + frontier_rows(s, ood, x="reward_margin")
            + [""]
        )
    lines += [
        "Raw per-run numbers: `bench/out/study/*/*/results.json` and the "
        "cells' `eval_results.json` after a run (not committed).",
        "",
    ]
    path = docs / f"results{suffix}.md"
    kept = ""
    if path.exists() and CONCLUSIONS in path.read_text():
        kept = path.read_text().split(CONCLUSIONS, 1)[1]
    path.write_text("\n".join(lines) + "\n" + CONCLUSIONS + kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--study", action="append", choices=sorted(STUDIES), help="run only these studies (repeatable); default: all"
    )
    ap.add_argument("--quick", action="store_true", help="minutes: tiny bases, few steps, one seed")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "study"), help="work directory (models, cells, logs)")
    ap.add_argument("--docs", default=str(ROOT / "docs"), help="where results.md and the plots go")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/ (only the work directory)")
    ap.add_argument("--hidden", type=int, default=64, help="depth study: width of the bases (64 on CPU; 512 on a GPU)")
    ap.add_argument("--depths", default=None, help="depth study: comma-separated block counts (default 8,24)")
    ap.add_argument("--pretrain-steps", type=int, default=None, help="depth study: pre-training steps of each base")
    ap.add_argument("--seeds", default=None, help="depth study: comma-separated seeds (default 0,1,2)")
    ap.add_argument("--flat-lrs", default=None, help="depth study: comma-separated LRs of the flat runs")
    ap.add_argument("--llrd-lrs", default=None, help="depth study: comma-separated LRs of the layer-decay runs")
    ap.add_argument("--jobs", type=int, default=2, help="cells run in parallel")
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"skipped: {SHARED} not found (the studies need ../shared/data)")
    for key, value in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)
    out = Path(args.out) / ("quick" if args.quick else "full")
    ctx = {
        "out": out,
        "quick": args.quick,
        "files": prepare_data(out / "data"),
        "logs": out / "logs",
        "hidden": args.hidden,
        "depths": tuple(int(d) for d in args.depths.split(",")) if args.depths else None,
        "pretrain_steps": args.pretrain_steps,
        "seeds": args.seeds,
        "jobs": args.jobs,
        "flat_lrs": args.flat_lrs,
        "llrd_lrs": args.llrd_lrs,
    }
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"minutes": {}, "bases": {}}
    results = {}
    for name in args.study or list(STUDIES):
        print(f"study {name} ...", flush=True)
        t0 = time.time()
        results[name] = STUDIES[name](ctx)
        spent = (time.time() - t0) / 60
        if spent > 0.5 or name not in meta["minutes"]:  # a pure re-read keeps the compute of the run that measured it
            meta["minutes"][name] = spent
        meta["bases"][name] = (
            f"llama-style, hidden {args.hidden}, BPE vocab 2048, "
            f"{ctx['pretrain_steps'] or (150 if args.quick else 700)} pre-training steps (batch 8 × 256 tokens, "
            "cosine from lr 1e-3) on Shakespeare + code + Python documentation"
            if name == "depth"
            else "8-block llama-style, hidden 64, BPE vocab 2048, "
            f"{150 if args.quick else 800} pre-training steps (batch 8 × 256 tokens) on Shakespeare + code"
        )
        meta_path.write_text(json.dumps(meta, indent=2))
    meta.update(command=" ".join(["python bench/llrd_study.py", *sys.argv[1:]]), machine=machine())
    if not args.no_docs:
        report(results, meta, Path(args.docs), args.quick)


if __name__ == "__main__":
    main()
