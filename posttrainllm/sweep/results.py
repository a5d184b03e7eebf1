"""From cell records to a recommendation: seed means, the flat curve at the same eval loss, results.md and
frontier.png."""

from __future__ import annotations

import shlex
import statistics
from pathlib import Path
from typing import Any

from posttrainllm.sweep.grid import METHOD_OF_COMMAND, NEAR_BEST, method_label

# a frontier point, less the seed
AXES = ("gamma", "lr", "replay_ratio", "kl_to_base", "self_replay", "loss_type", "command", "merge")


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _axes(r: dict) -> dict:
    """A record's frontier point (records of older sweeps lack the newer axes: they were off)."""
    defaults = {"kl_to_base": 0.0, "self_replay": 0, "loss_type": "nll", "command": None, "merge": None}
    return {k: r.get(k, defaults.get(k)) for k in AXES}


def summarize(records: list[dict]) -> list[dict]:
    """Points (cells and their merges) aggregated over seeds: eval loss, each OOD change and KL as mean ± std;
    forgetting = worst OOD mean; `method` names the forgetting control in words."""
    points: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("eval_loss") is None:
            continue
        points.setdefault(tuple(_axes(r).values()), []).append(r)
    rows = []
    for point, runs in points.items():
        row: dict[str, Any] = {**dict(zip(AXES, point)), "seeds": len(runs)}
        row["method"] = method_label(
            row["gamma"], row["replay_ratio"], row["kl_to_base"], row["self_replay"], runs[0].get("merge_label"),
            row["loss_type"], row["command"] or "sft",
        )  # fmt: skip
        row["eval_loss"], row["eval_loss_std"] = _mean_std([r["eval_loss"] for r in runs])
        kls = {name: [r.get("ood_kl", {}).get(name) for r in runs] for name in runs[0].get("ood_kl") or {}}
        row["ood_kl"] = {n: statistics.fmean(v) for n, v in kls.items() if all(x is not None for x in v)}
        row["ood"] = {}
        for name in runs[0]["ood_change_pct"]:
            values = [r["ood_change_pct"].get(name) for r in runs]
            if any(v is None for v in values):
                continue
            mean, std = _mean_std(values)
            row["ood"][name] = {"change_pct": mean, "std": std}
        row["forgetting_pct"] = max((v["change_pct"] for v in row["ood"].values()), default=None)
        if row.get("merge") == "budget":  # each seed's cell has its own α within the budget
            row["budget_alphas"] = [r.get("budget_alpha") for r in runs]
        for key in ("reward_accuracy", "reward_margin"):
            if all(key in r for r in runs):
                row[key], row[key + "_std"] = _mean_std([r[key] for r in runs])
        rows.append(row)
    return rows


def interpolate(curve: list[tuple[float, float]], x: float) -> float | None:
    """y at x by linear interpolation along a curve (sorted by x here); None outside its range."""
    curve = sorted(curve)
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if len(curve) == 1 and curve[0][0] == x:
        return curve[0][1]
    return None


def efficient_branch(rows: list[dict], x: str = "eval_loss", higher_is_better: bool = False) -> list[dict]:
    """One setting's points over its LRs, up to the LR where `x` is best. Past that LR a higher LR gives a worse `x`
    *and* more forgetting (an overshooting LR), so comparing there ("flat at the same eval loss") would compare
    with a run no one should choose."""
    if not rows:
        return []
    best = (max if higher_is_better else min)(rows, key=lambda r: r[x])
    return [r for r in rows if r["lr"] <= best["lr"]]


def is_flat(row: dict) -> bool:
    """Plain flat LR tuning: no layer decay, replay, KL anchor, self-replay or merge."""
    return (
        row["gamma"] == 1.0
        and row["replay_ratio"] == 0
        and not row.get("kl_to_base")
        and not row.get("self_replay")
        and row.get("loss_type", "nll") == "nll"
        and row.get("command") not in METHOD_OF_COMMAND
        and not row.get("merge")
    )


def _flat_at(summary: list[dict], row: dict) -> dict | None:
    flat = [r for r in summary if is_flat(r) and r["forgetting_pct"] is not None]
    if not flat or row is None or is_flat(row):
        return None
    curve = efficient_branch(flat)
    value = interpolate([(r["eval_loss"], r["forgetting_pct"]) for r in curve], row["eval_loss"])
    return {
        "flat_forgetting_pct_at_same_eval_loss": value,
        "flat_lrs": sorted(r["lr"] for r in flat),
        "note": None if value is not None else "outside flat's range of eval losses: widen flat's LR sweep",
    }


def _key(row: dict) -> tuple:
    return tuple(str(row.get(k)) if k == "merge" else row.get(k) or 0 for k in AXES)


def recommend(summary: list[dict], max_forgetting: float) -> dict:
    rows = [r for r in summary if r["forgetting_pct"] is not None]
    if not rows:
        return {
            "best": None,
            "least_forgetting": None,
            "max_forgetting_pct": max_forgetting,
            "note": "no cell finished with an eval loss and OOD figures",
        }
    ok = [r for r in rows if r["forgetting_pct"] <= max_forgetting]
    best = min(ok, key=lambda r: (r["eval_loss"], r["forgetting_pct"], _key(r))) if ok else None
    top = min(r["eval_loss"] for r in rows)
    near = [r for r in rows if r["eval_loss"] <= top + NEAR_BEST * abs(top)]
    least = min(near, key=lambda r: (r["forgetting_pct"], r["eval_loss"], _key(r)))

    def describe(r):
        if r is None:
            return None
        return {
            "method": r.get("method"),
            "llrd": r["gamma"],
            "lr": r["lr"],
            "replay_ratio": r["replay_ratio"],
            "kl_to_base": r.get("kl_to_base", 0.0),
            "self_replay": r.get("self_replay", 0),
            "merge": r.get("merge"),
            **({"budget_alphas": r["budget_alphas"]} if "budget_alphas" in r else {}),
            "eval_loss": r["eval_loss"],
            "forgetting_pct": r["forgetting_pct"],
            "vs_flat": _flat_at(summary, r),
        }

    out = {
        "best": describe(best),
        "least_forgetting": describe(least),
        "max_forgetting_pct": max_forgetting,
        "best_eval_loss": top,
    }
    if best is None:
        out["note"] = (
            f"no cell forgets at most {max_forgetting:g}%: the least forgetting one near the best eval loss is given"
        )
    return out


def _fmt_cell(r: dict | None) -> str:
    if r is None:
        return "none"
    text = f"{r.get('method', '')}: --llrd {r['llrd']:g} --lr {r['lr']:g}" + (
        f" --replay-ratio {r['replay_ratio']:g}" if r["replay_ratio"] else ""
    )
    text += f" --kl-to-base {r['kl_to_base']:g}" if r.get("kl_to_base") else ""
    text += f" --self-replay {r['self_replay']}" if r.get("self_replay") else ""
    if r.get("merge") == "budget":
        alphas = ", ".join(f"{a:g}" for a in r.get("budget_alphas") or [] if a is not None)
        text += f", then posttrainllm merge --max-forgetting (α {alphas})"
    elif r.get("merge"):
        text += f", then posttrainllm merge ({r['merge']})"
    text += f" (eval loss {r['eval_loss']:.4f}, forgetting {r['forgetting_pct']:+.1f}%)"
    flat = r.get("vs_flat") or {}
    if flat.get("flat_forgetting_pct_at_same_eval_loss") is not None:
        text += f"; flat at the same eval loss: {flat['flat_forgetting_pct_at_same_eval_loss']:+.1f}%"
    elif flat.get("note"):
        text += f"; flat: {flat['note']}"
    return text


def recommendation_lines(result: dict) -> list[str]:
    rec = result["recommendation"]
    lines = [
        "recommended (lowest eval loss with forgetting ≤ "
        f"{rec.get('max_forgetting_pct', 0):g}%): {_fmt_cell(rec.get('best'))}",
        f"least forgetting within 1% of the best eval loss: {_fmt_cell(rec.get('least_forgetting'))}",
    ]
    if rec.get("note"):
        lines.append(f"note: {rec['note']}")
    return lines


def failure_line(result: dict, out: Path) -> str:
    """The one line a sweep with failed cells or merges exits with (exit 1, once results.json is written)."""
    failed = result["failed"]
    what = "every cell failed" if not result["summary"] else f"{len(failed)} of the sweep's cells and merges failed"
    return (
        f"{what} (first: {failed[0]['cell']}: {failed[0]['error']}); results.json keeps every point measured; "
        f"see the logs in {out / 'logs'}"
    )


def _earlier_lines(result: dict) -> list[str]:
    earlier = result.get("earlier") or []
    if not earlier:
        return []

    def point(r: dict) -> str:
        loss = r.get("eval_loss")
        return f"{r.get('cell')} ({'no eval loss' if loss is None else f'eval loss {loss:.4f}'})"

    return [
        "",
        f"Earlier points ({len(earlier)}: measured by earlier runs of this sweep with other settings or inputs, or "
        'not in this grid; kept in results.json under "earlier", not on this frontier): '
        + ", ".join(map(point, earlier)),
    ]


def write_markdown(result: dict, path: Path) -> None:
    summary = result["summary"]
    names = list(dict.fromkeys(n for r in summary for n in r["ood"]))
    dpo = any("reward_accuracy" in r for r in summary)
    head = ["method", "γ", "LR", "replay", "KL β", "self-replay", "seeds", "eval loss"]
    head += ["reward acc.", "margin"] if dpo else []
    head += [f"{n} PPL Δ%" for n in names] + [f"{n} KL" for n in names] + ["forgetting %"]
    lines = [
        f"# Sweep: posttrainllm {result['command']}",
        "",
        "Options of every cell: `" + " ".join(shlex.quote(a) for a in result["options"]) + "`",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in sorted(summary, key=lambda r: (r["method"], r["lr"])):
        cells = [
            r["method"],
            f"{r['gamma']:g}",
            f"{r['lr']:g}",
            f"{r['replay_ratio']:g}",
            f"{r.get('kl_to_base', 0):g}",
            str(r.get("self_replay", 0)),
            str(r["seeds"]),
            f"{r['eval_loss']:.4f} ± {r['eval_loss_std']:.4f}",
        ]
        if dpo:
            cells += [f"{r.get('reward_accuracy', float('nan')):.3f}", f"{r.get('reward_margin', float('nan')):.3f}"]
        for n in names:
            o = r["ood"].get(n)
            cells.append(f"{o['change_pct']:+.1f} ± {o['std']:.1f}" if o else "-")
        for n in names:
            kl = (r.get("ood_kl") or {}).get(n)
            cells.append("-" if kl is None else f"{kl:.4f}")
        cells.append("-" if r["forgetting_pct"] is None else f"{r['forgetting_pct']:+.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Forgetting = the largest seed-mean perplexity change over the --ood-eval files; KL = the mean per-token "
        "KL(base ‖ model) on each. A merge's row is the trained cell named after 'of', merged back toward the base.",
        "",
    ]
    lines += [f"- {line}" for line in recommendation_lines(result)]
    if result.get("failed"):
        lines += ["", "Failed cells: " + ", ".join(f"{f['cell']} ({f['error']})" for f in result["failed"])]
    lines += _earlier_lines(result)
    lines += ["", "![frontier](frontier.png)", ""]
    path.write_text("\n".join(lines))


def plot_frontier(summary: list[dict], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "frontier.png not written: matplotlib is not installed (pip install 'posttrainllm[plot]')"
    series: dict[str, list[dict]] = {}
    for r in summary:
        if r["forgetting_pct"] is None:
            continue
        series.setdefault(r["method"], []).append(r)
    if not series:
        return "frontier.png not written: no cell finished"
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for label, rows in sorted(series.items(), key=lambda kv: kv[0] != "flat"):
        rows = sorted(rows, key=lambda r: r["lr"])
        style = dict(lw=2.5, color="black") if label == "flat" else dict(ls=":") if "merge" in label else {}
        ax.errorbar(
            [r["eval_loss"] for r in rows],
            [r["forgetting_pct"] for r in rows],
            xerr=[r["eval_loss_std"] for r in rows],
            marker="o",
            capsize=3,
            label=label,
            **style,
        )
        for r in rows:
            ax.annotate(
                f"{r['lr']:g}",
                (r["eval_loss"], r["forgetting_pct"]),
                fontsize=7,
                alpha=0.6,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xlabel("in-domain eval loss (lower = learned more)")
    ax.set_ylabel("forgetting: worst OOD perplexity change, %")
    ax.set_title("sweep frontier (points = LRs, one curve per method)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
