"""Running the cells: one subprocess each (its own threads or GPU), skipped when already done with the same
settings and input contents (posttrainllm/sweep/records.py); the cell records."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from posttrainllm.sweep.grid import EVAL_CACHE_FLAG, Cell, SweepSpec, _without
from posttrainllm.sweep.records import (
    CELL_RECORD,
    cell_identity,
    claim,
    discard_weights,
    earlier_points,
    read_record,
    why_again,
    write_record,
)
from posttrainllm.sweep.results import plot_frontier, recommend, summarize, write_markdown


# ------------------------------------------------------------------------------------------------ running
def _identity(spec: SweepSpec, cell: Cell, memo: dict) -> dict:
    """The cell's settings and inputs (posttrainllm/sweep/records.py): its command line less where the base's
    evaluation is cached (which changes no result), and what each input it reads holds."""
    return cell_identity(spec.command, _without(spec.argv(cell), EVAL_CACHE_FLAG), memo)


def _saved(spec: SweepSpec, cell: Cell) -> dict | None:
    """The record of the cell's last finished run (whatever its settings)."""
    d = spec.output_dir / "cells" / cell.name
    if not (d / "training_complete.json").is_file():
        return None
    return read_record(d / CELL_RECORD)


def _done(saved: dict | None, ident: dict) -> dict | None:
    """The cell's record when its finished run had these settings and inputs."""
    if saved is None or saved.get("fingerprint") != ident["fingerprint"]:
        return None
    return {k: v for k, v in saved.items() if k != "settings"}


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


def _run_cell(spec: SweepSpec, cell: Cell, job: int, ident: dict) -> dict:
    d = spec.output_dir / "cells" / cell.name
    log = spec.output_dir / "logs" / f"{cell.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = spec.argv(cell)
    if d.exists() and any(d.iterdir()):
        claim(d, CELL_RECORD)
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
    record = _record(cell, d, time.time() - t0, ident["fingerprint"], spec.command)
    write_record(d, CELL_RECORD, {**record, "settings": {"argv": ident["argv"], "inputs": ident["inputs"]}})
    if spec.discard_weights and not spec.measures_merges():  # with merges: once they are measured (_merges)
        discard_weights(d)
    return record


def _record(cell: Cell, d: Path, seconds: float, fingerprint: str, command: str) -> dict:
    results = json.loads((d / "eval_results.json").read_text())
    metrics = results.get("train", {})
    ood = {name: r.get("change_pct") for name, r in (results.get("ood") or {}).items()}
    kl = {name: r.get("kl") for name, r in (results.get("ood") or {}).items() if r.get("kl") is not None}
    record = {
        "cell": cell.name,
        "gamma": cell.gamma,
        "lr": cell.lr,
        "replay_ratio": cell.replay_ratio,
        "kl_to_base": cell.kl_to_base,
        "self_replay": cell.self_replay,
        "loss_type": cell.loss_type,
        "command": command,
        "merge": None,
        "seed": cell.seed,
        "ood_kl": kl,
        "eval_loss": metrics.get("eval_loss"),
        "train_loss": metrics.get("train_loss"),
        "ood_change_pct": ood,
        "seconds": round(seconds, 1),
        "fingerprint": fingerprint,
    }
    for key, name in (("eval_rewards/accuracies", "reward_accuracy"), ("eval_rewards/margins", "reward_margin")):
        if key in metrics:
            record[name] = metrics[key]
    return record


def run(spec: SweepSpec, echo=print) -> dict:
    """Run (or skip) every cell, then aggregate, recommend and write results.json / results.md / frontier.png.
    With --dry-run: only say what would run (`_dry_run`)."""
    if not spec.dry_run:
        spec.output_dir.mkdir(parents=True, exist_ok=True)
    cells = spec.cells()
    previous = read_record(spec.output_dir / "results.json")
    records: dict[str, dict] = {}
    todo, memo = [], {}
    idents = {cell.name: _identity(spec, cell, memo) for cell in cells}
    for cell in cells:
        saved = _saved(spec, cell)
        done = _done(saved, idents[cell.name])
        if done is not None:
            records[cell.name] = done
            continue
        todo.append(cell)
        why = why_again(saved, idents[cell.name])
        if why:
            echo(f"{cell.name}: runs again: {why}")
    echo(
        f"sweep: {len(cells)} cells ({len(cells) - len(todo)} already done, {len(todo)} to run, {spec.jobs} at a time)"
        f" → {spec.output_dir}"
    )
    if spec.dry_run:
        return _dry_run(spec, cells, todo, echo)
    failed = []
    with ThreadPoolExecutor(max_workers=spec.jobs) as pool:
        futures = [pool.submit(_run_cell, spec, cell, i % spec.jobs, idents[cell.name]) for i, cell in enumerate(todo)]
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
    if spec.measures_merges():
        merged = _merges(spec, [c for c in cells if c.name in records], records, failed, echo)
    ordered = [records[c.name] for c in cells if c.name in records]
    if spec.measures_merges():
        ordered += merged
    summary = summarize(ordered)
    result = {
        "command": spec.command,
        "grid": {
            "llrd": spec.gammas,
            "lr": spec.lrs,
            "replay_ratio": spec.replay_ratios,
            "kl_to_base": spec.kl_values,
            "self_replay": spec.self_replays,
            "loss_type": spec.loss_types,
            "merge_alpha": spec.merge_alphas,
            "merge_llrd": spec.merge_gammas,
            "seeds": spec.seeds,
        },
        "options": spec.passthrough,
        "max_forgetting_pct": spec.max_forgetting,
        "cells": ordered,
        "earlier": earlier_points(previous, ordered),
        "failed": failed,
        "summary": summary,
        "recommendation": recommend(summary, spec.max_forgetting),
    }
    (spec.output_dir / "results.json").write_text(json.dumps(result, indent=2))
    write_markdown(result, spec.output_dir / "results.md")
    note = plot_frontier(summary, spec.output_dir / "frontier.png")
    result["plot_note"] = note
    return result


def _dry_run(spec: SweepSpec, cells: list[Cell], todo: list[Cell], echo) -> dict:
    """--dry-run: each cell (done, or to run with its command line) and the merges of each, nothing run or written."""
    import shlex

    for cell in cells:
        if cell in todo:
            echo(f"{cell.name}: to run: posttrainllm {' '.join(shlex.quote(a) for a in spec.argv(cell))}")
        else:
            echo(f"{cell.name}: done")
    for merge in spec.merges():
        echo(f"every trained cell merged back toward the base at α {merge.alpha:g} (γ {merge.gamma:g})")
    if spec.budget_points:
        echo(f"every trained cell merged back to its largest α within --max-forgetting {spec.max_forgetting:g}%")
    return {"dry_run": True, "cells": [c.name for c in cells], "to_run": [c.name for c in todo], "failed": []}


def _merges(spec: SweepSpec, cells: list[Cell], records: dict, failed: list, echo) -> list[dict]:
    """Every finished cell's merges (posttrainllm/sweep/merges.py), spec.jobs at a time; their records."""
    from posttrainllm.sweep.merges import run_merges

    labels = [m.label for m in spec.merges()] + ([f"budget ≤{spec.max_forgetting:g}%"] if spec.budget_points else [])
    echo(f"sweep: merges {', '.join(labels)} of {len(cells)} cells")
    out: list[dict] = []
    with ThreadPoolExecutor(max_workers=spec.jobs) as pool:
        futures = [
            pool.submit(run_merges, spec, cell, records[cell.name], _env_for(i % spec.jobs, spec.jobs))
            for i, cell in enumerate(cells)
        ]
        for cell, fut in zip(cells, futures):
            merged, bad = fut.result()
            out += merged
            if spec.discard_weights and not bad:  # measured: the cell's weights can go now
                discard_weights(spec.output_dir / "cells" / cell.name)
            failed += bad
            for f in bad:
                echo(f"{f['cell']}: FAILED (exit {f['exit_code']}): {f['error']}")
            for r in merged:
                echo(f"{r['cell']}: eval loss {r['eval_loss']:.4f}")
    return out


# ------------------------------------------------------------------------------------------------ analysis
