"""The real-model study's report: tables (markdown) and the frontier plot, from bench/out/real_study/.

    python studies/real_study.py --phase report     # (re)writes OUT/report.md, OUT/summary.json, docs/real_study.png

Forgetting is measured against the healed base (see studies/real_study.py): per held-out text the perplexity change
(%) and the mean per-token KL(healed ‖ tuned). Seeds are averaged (mean ± std over the seeds that finished).
"flat at same eval" interpolates flat's seed means along its LRs up to flat's best eval loss (sweep's rule).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from posttrainllm.sweep import interpolate

TEXTS = ("code", "prose", "shakespeare")
FILES = {"code": "heldout_code.txt", "prose": "heldout_docs.txt", "shakespeare": "heldout_shakespeare.txt"}
DOCS = Path(__file__).resolve().parents[1] / "docs"


def _eval(out: Path, name: str) -> dict | None:
    p = out / "eval" / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):  # not evaluated yet, or being written
        return None


def run_rows(out: Path, grid: list[dict]) -> list[dict]:
    """One row per finished and evaluated run: eval loss, wall time, per text ppl change and KL vs the healed base."""
    healed = _eval(out, "healed")
    rows = []
    for r in grid:
        ev, results = _eval(out, r["name"]), out / "runs" / r["name"] / "eval_results.json"
        if ev is None or healed is None or not results.is_file():
            continue
        train = json.loads(results.read_text())["train"]
        row = {**r, "eval_loss": train["eval_loss"], "train_loss": train.get("train_loss")}
        wall = out / "runs" / r["name"] / "study_wall_s.txt"
        row["wall_s"] = float(wall.read_text()) if wall.is_file() else None
        for t in TEXTS:
            before, after = healed[FILES[t]]["perplexity"], ev[FILES[t]]["perplexity"]
            row[f"{t}_pct"] = 100.0 * (after / before - 1.0)
            row[f"{t}_kl"] = ev[FILES[t]].get("kl")
        rows.append(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Seed means (and std) per configuration (label, lr)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["label"], float(r["lr"])), []).append(r)
    out = []
    keys = ["eval_loss"] + [f"{t}_{m}" for t in TEXTS for m in ("pct", "kl")]
    for (label, lr), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "flat", kv[0][0], kv[0][1])):
        s = {"label": label, "lr": lr, "seeds": sorted(r["seed"] for r in rs)}
        for k in keys:
            vals = [r[k] for r in rs if r.get(k) is not None]
            s[k] = statistics.mean(vals) if vals else None
            s[k + "_std"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out.append(s)
    return out


def flat_curve(summary: list[dict], key: str) -> list[tuple[float, float]]:
    flat = sorted((s for s in summary if s["label"] == "flat"), key=lambda s: s["lr"])
    if not flat:
        return []
    best = min(flat, key=lambda s: s["eval_loss"])
    return [(s["eval_loss"], s[key]) for s in flat if s["lr"] <= best["lr"]]


def tables(summary: list[dict], base_vs_healed: dict) -> list[str]:
    lines = ["| run | LR | seeds | eval loss | " + " | ".join(f"{t} PPL Δ% | {t} KL" for t in TEXTS) + " |"]
    lines.append("|" + "---|" * (4 + 2 * len(TEXTS)))
    for s in summary:
        cells = [s["label"], f"{s['lr']:g}", ",".join(map(str, s["seeds"])), _pm(s, "eval_loss", 4)]
        cells += [x for t in TEXTS for x in (_pm(s, f"{t}_pct", 1, "+"), _pm(s, f"{t}_kl", 4))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "At equal in-domain eval loss (flat interpolated along its LRs up to its best eval loss):", ""]
    lines.append(
        "| run | LR | eval loss | " + " | ".join(f"{t} Δ% (flat at same eval) | {t} KL (flat)" for t in TEXTS) + " |"
    )
    lines.append("|" + "---|" * (3 + 2 * len(TEXTS)))
    for s in summary:
        if s["label"] == "flat":
            continue
        cells = [s["label"], f"{s['lr']:g}", f"{s['eval_loss']:.4f}"]
        for t in TEXTS:
            for key, fmt in ((f"{t}_pct", "{:+.1f}"), (f"{t}_kl", "{:.4f}")):
                ref = interpolate(flat_curve(summary, key), s["eval_loss"])
                mine = "-" if s[key] is None else fmt.format(s[key])
                cells.append(f"{mine} ({'outside flat' if ref is None else fmt.format(ref)})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Healing (base → healed base, the reference above): " + base_vs_healed_line(base_vs_healed)]
    return lines


def base_vs_healed_line(d: dict) -> str:
    return ", ".join(f"{t} PPL {d[t]['base']:.3f} → {d[t]['healed']:.3f} ({d[t]['pct']:+.1f}%)" for t in d) or "-"


def _pm(s: dict, key: str, digits: int, sign: str = "") -> str:
    if s.get(key) is None:
        return "-"
    v = f"{s[key]:{sign}.{digits}f}"
    return v + (f" ± {s[key + '_std']:.{digits}f}" if len(s["seeds"]) > 1 else "")


def plot(summary: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, axes = plt.subplots(2, len(TEXTS), figsize=(5.2 * len(TEXTS), 8.5), squeeze=False)
    labels = list(dict.fromkeys(s["label"] for s in summary))
    for col, t in enumerate(TEXTS):
        for row, (key, ylabel) in enumerate(((f"{t}_pct", "PPL change vs healed base (%)"), (f"{t}_kl", "KL/token"))):
            ax = axes[row][col]
            for label in labels:
                pts = sorted((s for s in summary if s["label"] == label), key=lambda s: s["lr"])
                ax.errorbar(
                    [p["eval_loss"] for p in pts],
                    [p[key] for p in pts],
                    xerr=[p["eval_loss_std"] for p in pts],
                    yerr=[p[key + "_std"] for p in pts],
                    marker="o",
                    capsize=3,
                    label=label,
                    linestyle="-" if len(pts) > 1 else "none",
                )
                for p in pts:
                    ax.annotate(f"{p['lr']:g}", (p["eval_loss"], p[key]), fontsize=7, alpha=0.7)
            ax.set_title(f"held-out {t}")
            ax.set_xlabel("in-domain (Alpaca) eval loss")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, Alpaca SFT: forgetting vs in-domain loss (lower-left is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(out: Path, grid: list[dict]) -> None:
    rows = run_rows(out, grid)
    summary = summarize(rows)
    base, healed = _eval(out, "base"), _eval(out, "healed")
    heal = {}
    if base and healed:
        for t in TEXTS:
            b, h = base[FILES[t]]["perplexity"], healed[FILES[t]]["perplexity"]
            heal[t] = {"base": b, "healed": h, "pct": 100.0 * (h / b - 1), "base_kl": base[FILES[t]].get("kl")}
    lines = tables(summary, heal)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps({"runs": rows, "summary": summary, "heal": heal}, indent=2))
    if summary:
        plot(summary, DOCS / "real_study.png")
    print("\n".join(lines))
