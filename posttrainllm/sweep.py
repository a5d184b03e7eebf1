"""`posttrainllm sweep COMMAND ...`: choose γ and LR on the user's own data.

Every cell of the grid (γ × LR × replay ratio × seed) is one normal `posttrainllm COMMAND` run, in its own output
directory under ``OUT/cells/``, started as a subprocess (so a failing cell does not stop the others, and each job
gets its own threads or GPU). The sweep is resumable: a cell whose run finished with the same settings is skipped.

Per cell it records the in-domain eval loss (from --eval-split / --eval-dataset), the out-of-domain perplexity
change of every --ood-eval file, and for dpo the reward accuracy and margin. Cells are aggregated over seeds
(mean ± std). A cell's *forgetting* is its worst OOD change: the largest seed-mean perplexity change over the
--ood-eval files, in percent.

The recommendation, deterministic for a fixed grid and seed list:

* ``best``: the lowest mean eval loss among cells whose forgetting is ≤ --max-forgetting;
* ``least_forgetting``: the least forgetting among cells whose eval loss is within 1% of the best eval loss of
  the whole grid;
* for each, the flat cell it beats: flat's forgetting (γ = 1, no replay) interpolated along flat's LR curve at the
  same eval loss, as docs/results.md does.

Outputs in OUT: ``results.json`` (cells, summary, recommendation), ``results.md`` and ``frontier.png``
(in-domain eval loss against forgetting, one curve per γ, flat and replay shown; needs matplotlib).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrainllm.errors import ConfigErrors, PosttrainError, UsageError

SWEEP_COMMANDS = ("sft", "dpo", "finetune")
NEAR_BEST = 0.01  # "within 1% of the best eval loss"


@dataclass(frozen=True)
class Cell:
    gamma: float
    lr: float
    replay_ratio: float
    seed: int

    @property
    def name(self) -> str:
        return f"g{self.gamma:g}-lr{self.lr:g}-replay{self.replay_ratio:g}-s{self.seed}"

    @property
    def point(self) -> tuple[float, float, float]:
        return (self.gamma, self.lr, self.replay_ratio)


@dataclass
class SweepSpec:
    command: str
    gammas: list[float]
    lrs: list[float]
    replay_ratios: list[float]
    seeds: list[int]
    jobs: int
    max_forgetting: float
    output_dir: Path
    passthrough: list[str]  # the command's own options, the same for every cell
    discard_weights: bool = False

    def cells(self) -> list[Cell]:
        return [
            Cell(g, lr, r, s) for g in self.gammas for lr in self.lrs for r in self.replay_ratios for s in self.seeds
        ]

    def argv(self, cell: Cell) -> list[str]:
        """The cell's command line. A replay ratio of 0 means no replay, so --replay-dataset is left out."""
        passthrough = list(self.passthrough)
        if cell.replay_ratio == 0:
            passthrough = _without(passthrough, "--replay-dataset")
        args = [
            self.command,
            *passthrough,
            "--lr",
            f"{cell.lr:g}",
            "--seed",
            str(cell.seed),
            "--output-dir",
            str(self.output_dir / "cells" / cell.name),
        ]
        if cell.gamma != 1.0:
            args += ["--llrd", f"{cell.gamma:g}"]
        if cell.replay_ratio > 0:
            args += ["--replay-ratio", f"{cell.replay_ratio:g}"]
        return args


# ------------------------------------------------------------------------------------------------ parsing
_SWEEP_OPTIONS = {
    "--llrd": "gammas",
    "--lr": "lrs",
    "--replay-ratio": "replay_ratios",
    "--seeds": "seeds",
    "--seed": "seeds",
    "--jobs": "jobs",
    "--max-forgetting": "max_forgetting",
    "--output-dir": "output_dir",
}


def _numbers(flag: str, text: str, kind=float) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected a comma-separated list of numbers, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag}: expected a comma-separated list of numbers, got {text!r}")
    return list(dict.fromkeys(values))


def parse(command: str, args: list[str]) -> SweepSpec:
    """Split the sweep's own options (comma lists) from the command's options; validate every cell's config."""
    if command not in SWEEP_COMMANDS:
        raise UsageError(f"sweep COMMAND must be one of {', '.join(SWEEP_COMMANDS)}, got {command!r}")
    found: dict[str, str] = {}
    passthrough: list[str] = []
    discard = False
    i = 0
    while i < len(args):
        tok = args[i]
        flag, eq, inline = tok.partition("=")
        if flag in _SWEEP_OPTIONS:
            if eq:
                value = inline
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 1
            else:
                raise UsageError(f"{flag} needs a value")
            found[_SWEEP_OPTIONS[flag]] = value
        elif tok == "--discard-weights":
            discard = True
        elif tok in ("--overwrite", "--resume", "--dry-run"):
            raise UsageError(f"{tok} is not available in a sweep: cells are skipped when done and re-run otherwise")
        else:
            passthrough.append(tok)
        i += 1
    problems = []
    try:
        gammas = _numbers("--llrd", found.get("gammas", "1.0"))
        lrs = _numbers("--lr", found["lrs"]) if "lrs" in found else None
        replay = _numbers("--replay-ratio", found.get("replay_ratios", "0"))
        seeds = _numbers("--seeds", found.get("seeds", "0"), int)
        jobs = _numbers("--jobs", found.get("jobs", "1"), int)[0]
        max_forgetting = _numbers("--max-forgetting", found.get("max_forgetting", "5"))[0]
    except UsageError as e:
        raise ConfigErrors([str(e)]) from None
    if lrs is None:
        problems.append("--lr: give the LRs to sweep, e.g. --lr 1e-5,2e-5,5e-5")
        lrs = [2e-5]
    if jobs < 1:
        problems.append(f"--jobs must be >= 1, got {jobs}")
    if not math.isfinite(max_forgetting):
        problems.append("--max-forgetting must be a finite number (percent)")
    if any(s < 0 for s in seeds):
        problems.append("--seeds must be non-negative integers")
    model = _value(passthrough, "--model")
    out = Path(found.get("output_dir") or f"runs/sweep-{command}-{Path((model or 'model').rstrip('/')).name}")
    spec = SweepSpec(command, gammas, lrs, replay, seeds, jobs, max_forgetting, out, passthrough, discard)
    problems += _check_cells(spec)
    if problems:
        raise ConfigErrors(list(dict.fromkeys(problems)))
    return spec


def _without(args: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for tok in args:
        if skip:
            skip = False
        elif tok == flag:
            skip = True
        elif not tok.startswith(flag + "="):
            out.append(tok)
    return out


def _value(args: list[str], flag: str) -> str | None:
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            return args[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def _check_cells(spec: SweepSpec) -> list[str]:
    """Each distinct cell configuration goes through the command's own validation (all problems, no model load)."""
    from posttrainllm.config.argv import to_config

    problems: list[str] = []
    for cell in {Cell(c.gamma, c.lr, c.replay_ratio, spec.seeds[0]) for c in spec.cells()}:
        argv = spec.argv(cell)
        try:
            cfg = to_config(spec.command, list(argv[1:]))
        except ConfigErrors as e:
            problems += e.problems
            continue
        except PosttrainError as e:  # an unknown option, a missing value
            problems.append(str(e))
            continue
        if not (cfg.eval_split or cfg.eval_dataset):
            problems.append("a sweep needs an in-domain eval set: give --eval-split FRACTION or --eval-dataset FILE")
        if not cfg.ood_eval:
            problems.append("a sweep needs at least one --ood-eval FILE to measure forgetting")
        if cell.replay_ratio > 0 and not cfg.replay_dataset:
            problems.append("--replay-ratio above 0 needs --replay-dataset FILE")
    return problems


# ------------------------------------------------------------------------------------------------ running
def _fingerprint(spec: SweepSpec, cell: Cell) -> str:
    return hashlib.sha256(json.dumps(spec.argv(cell)).encode()).hexdigest()[:16]


def _cell_done(spec: SweepSpec, cell: Cell) -> dict | None:
    d = spec.output_dir / "cells" / cell.name
    record = d / "sweep_cell.json"
    if not record.is_file() or not (d / "training_complete.json").is_file():
        return None
    data = json.loads(record.read_text())
    return data if data.get("fingerprint") == _fingerprint(spec, cell) else None


def _env_for(job: int, jobs: int) -> dict[str, str]:
    env = dict(os.environ)
    gpus = _cuda_devices()
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[job % len(gpus)]
    else:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _cuda_devices() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001
        return []


def _run_cell(spec: SweepSpec, cell: Cell, job: int) -> dict:
    d = spec.output_dir / "cells" / cell.name
    log = spec.output_dir / "logs" / f"{cell.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = spec.argv(cell)
    if d.exists() and any(d.iterdir()):
        argv.append("--overwrite")  # an unfinished (or differently configured) earlier attempt of this cell
    t0 = time.time()
    with open(log, "w") as f:
        f.write("$ posttrainllm " + " ".join(shlex.quote(a) for a in argv) + "\n")
        f.flush()
        rc = subprocess.run(
            [sys.executable, "-m", "posttrainllm", *argv],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=_env_for(job, spec.jobs),
        ).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return {"cell": cell.name, "failed": True, "exit_code": rc, "error": tail[0][:300], "log": str(log)}
    record = _record(spec, cell, d, time.time() - t0)
    (d / "sweep_cell.json").write_text(json.dumps(record, indent=2))
    if spec.discard_weights:
        for f in d.glob("*.safetensors"):
            f.unlink()
    return record


def _record(spec: SweepSpec, cell: Cell, d: Path, seconds: float) -> dict:
    results = json.loads((d / "eval_results.json").read_text())
    metrics = results.get("train", {})
    ood = {name: r.get("change_pct") for name, r in (results.get("ood") or {}).items()}
    record = {
        "cell": cell.name,
        "gamma": cell.gamma,
        "lr": cell.lr,
        "replay_ratio": cell.replay_ratio,
        "seed": cell.seed,
        "eval_loss": metrics.get("eval_loss"),
        "train_loss": metrics.get("train_loss"),
        "ood_change_pct": ood,
        "seconds": round(seconds, 1),
        "fingerprint": _fingerprint(spec, cell),
    }
    for key, name in (("eval_rewards/accuracies", "reward_accuracy"), ("eval_rewards/margins", "reward_margin")):
        if key in metrics:
            record[name] = metrics[key]
    return record


def run(spec: SweepSpec, echo=print) -> dict:
    """Run (or skip) every cell, then aggregate, recommend and write results.json / results.md / frontier.png."""
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    cells = spec.cells()
    records: dict[str, dict] = {}
    todo = []
    for cell in cells:
        done = _cell_done(spec, cell)
        if done is not None:
            records[cell.name] = done
        else:
            todo.append(cell)
    echo(
        f"sweep: {len(cells)} cells ({len(cells) - len(todo)} already done, {len(todo)} to run, {spec.jobs} at a time)"
        f" → {spec.output_dir}"
    )
    failed = []
    with ThreadPoolExecutor(max_workers=spec.jobs) as pool:
        futures = [pool.submit(_run_cell, spec, cell, i % spec.jobs) for i, cell in enumerate(todo)]
        for n, fut in enumerate(futures, start=1):
            rec = fut.result()
            if rec.get("failed"):
                failed.append(rec)
                echo(
                    f"[{n}/{len(todo)}] {rec['cell']}: FAILED (exit {rec['exit_code']}): "
                    f"{rec['error']}  (log: {rec['log']})"
                )
                continue
            records[rec["cell"]] = rec
            ood = ", ".join(f"{k} {v:+.1f}%" for k, v in rec["ood_change_pct"].items() if v is not None)
            echo(f"[{n}/{len(todo)}] {rec['cell']}: eval loss {rec['eval_loss']:.4f}; {ood} ({rec['seconds']:.0f} s)")
    ordered = [records[c.name] for c in cells if c.name in records]
    summary = summarize(ordered)
    result = {
        "command": spec.command,
        "grid": {"llrd": spec.gammas, "lr": spec.lrs, "replay_ratio": spec.replay_ratios, "seeds": spec.seeds},
        "options": spec.passthrough,
        "max_forgetting_pct": spec.max_forgetting,
        "cells": ordered,
        "failed": failed,
        "summary": summary,
        "recommendation": recommend(summary, spec.max_forgetting),
    }
    (spec.output_dir / "results.json").write_text(json.dumps(result, indent=2))
    write_markdown(result, spec.output_dir / "results.md")
    note = plot_frontier(summary, spec.output_dir / "frontier.png")
    result["plot_note"] = note
    return result


# ------------------------------------------------------------------------------------------------ analysis
def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(records: list[dict]) -> list[dict]:
    """Cells aggregated over seeds: eval loss and each OOD change as mean ± std; forgetting = worst OOD mean."""
    points: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("eval_loss") is None:
            continue
        points.setdefault((r["gamma"], r["lr"], r["replay_ratio"]), []).append(r)
    rows = []
    for (gamma, lr, replay), runs in points.items():
        row: dict[str, Any] = {"gamma": gamma, "lr": lr, "replay_ratio": replay, "seeds": len(runs)}
        row["eval_loss"], row["eval_loss_std"] = _mean_std([r["eval_loss"] for r in runs])
        row["ood"] = {}
        for name in runs[0]["ood_change_pct"]:
            values = [r["ood_change_pct"].get(name) for r in runs]
            if any(v is None for v in values):
                continue
            mean, std = _mean_std(values)
            row["ood"][name] = {"change_pct": mean, "std": std}
        row["forgetting_pct"] = max((v["change_pct"] for v in row["ood"].values()), default=None)
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


def _flat_at(summary: list[dict], row: dict) -> dict | None:
    flat = [r for r in summary if r["gamma"] == 1.0 and r["replay_ratio"] == 0 and r["forgetting_pct"] is not None]
    if not flat or row is None or (row["gamma"] == 1.0 and row["replay_ratio"] == 0):
        return None
    curve = efficient_branch(flat)
    value = interpolate([(r["eval_loss"], r["forgetting_pct"]) for r in curve], row["eval_loss"])
    return {
        "flat_forgetting_pct_at_same_eval_loss": value,
        "flat_lrs": sorted(r["lr"] for r in flat),
        "note": None if value is not None else "outside flat's range of eval losses: widen flat's LR sweep",
    }


def _key(row: dict) -> tuple:
    return (row["gamma"], row["lr"], row["replay_ratio"])


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
            "llrd": r["gamma"],
            "lr": r["lr"],
            "replay_ratio": r["replay_ratio"],
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
    text = f"--llrd {r['llrd']:g} --lr {r['lr']:g}" + (
        f" --replay-ratio {r['replay_ratio']:g}" if r["replay_ratio"] else ""
    )
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


def write_markdown(result: dict, path: Path) -> None:
    summary = result["summary"]
    names = list(dict.fromkeys(n for r in summary for n in r["ood"]))
    dpo = any("reward_accuracy" in r for r in summary)
    head = ["γ", "LR", "replay", "seeds", "eval loss"] + (["reward acc.", "margin"] if dpo else [])
    head += [f"{n} PPL Δ%" for n in names] + ["forgetting %"]
    lines = [
        f"# Sweep: posttrainllm {result['command']}",
        "",
        "Options of every cell: `" + " ".join(shlex.quote(a) for a in result["options"]) + "`",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in sorted(summary, key=lambda r: (r["replay_ratio"], -r["gamma"], r["lr"])):
        cells = [
            f"{r['gamma']:g}",
            f"{r['lr']:g}",
            f"{r['replay_ratio']:g}",
            str(r["seeds"]),
            f"{r['eval_loss']:.4f} ± {r['eval_loss_std']:.4f}",
        ]
        if dpo:
            cells += [f"{r.get('reward_accuracy', float('nan')):.3f}", f"{r.get('reward_margin', float('nan')):.3f}"]
        for n in names:
            o = r["ood"].get(n)
            cells.append(f"{o['change_pct']:+.1f} ± {o['std']:.1f}" if o else "-")
        cells.append("-" if r["forgetting_pct"] is None else f"{r['forgetting_pct']:+.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Forgetting = the largest seed-mean perplexity change over the --ood-eval files.", ""]
    lines += [f"- {line}" for line in recommendation_lines(result)]
    if result.get("failed"):
        lines += ["", "Failed cells: " + ", ".join(f"{f['cell']} ({f['error']})" for f in result["failed"])]
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
        label = ("flat" if r["gamma"] == 1.0 else f"γ={r['gamma']:g}") + (
            f" + replay {r['replay_ratio']:g}" if r["replay_ratio"] else ""
        )
        series.setdefault(label, []).append(r)
    if not series:
        return "frontier.png not written: no cell finished"
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for label, rows in sorted(series.items(), key=lambda kv: kv[0] != "flat"):
        rows = sorted(rows, key=lambda r: r["lr"])
        style = dict(lw=2.5, color="black") if label == "flat" else dict(ls="--") if "replay" in label else {}
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
    ax.set_title("sweep frontier (points = LRs, one curve per γ)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
