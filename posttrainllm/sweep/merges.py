"""The sweep's merges: every trained cell merged back toward the base at each --merge-alpha (uniform, and depth-scaled
at each --merge-llrd γ), measured with no training by `posttrainllm merge ... --eval-dataset --ood-eval
--discard-weights`, one subprocess per (cell, γ). Each merge folder's record keeps the points measured: a re-run
measures only the α not measured yet for the same cell, settings and inputs (an added --merge-alpha adds points).

All points of a frontier with merges are measured by that one evaluator: the merge of α = 1 is the trained cell
itself, so the cell's in-domain loss (the completion loss on --eval-dataset) and its held-out perplexity change
and KL come from the same code as its merges'. The trainer's own eval loss stays in the record as
`trainer_eval_loss`. Merged weights are not kept (one `posttrainllm merge` command re-creates any of them)."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

from posttrainllm.merging.budget import BUDGET_EXIT
from posttrainllm.sweep.grid import Cell, Merge, SweepSpec, _value, _without
from posttrainllm.sweep.records import (
    MERGE_RECORD,
    claim,
    discarded_message,
    has_weights,
    read_record,
    run_identity,
    write_record,
)

# the cell's options a merge's measurement takes too (the window, the batch, remote code)
_PASSED = ("--max-length", "--eval-batch-size")


def merge_dir(spec: SweepSpec, cell: Cell, gamma: float) -> Path:
    return spec.output_dir / "merges" / (cell.name + (f"-g{gamma:g}" if gamma != 1.0 else ""))


def merge_argv(spec: SweepSpec, cell: Cell, gamma: float, alphas: list[float] | None = None) -> list[str]:
    """`posttrainllm merge` of one cell at `alphas` (default: every --merge-alpha and 1.0, the cell itself, measured
    alike)."""
    alphas = sorted({*spec.merge_alphas, 1.0}) if alphas is None else alphas
    args = [
        "merge",
        "--base", str(_value(spec.passthrough, "--model")),
        "--model", str(spec.output_dir / "cells" / cell.name),
        "--output-dir", str(merge_dir(spec, cell, gamma)),
        "--alpha", ",".join(f"{a:g}" for a in alphas),
        "--eval-dataset", str(_value(spec.passthrough, "--eval-dataset")),
        "--discard-weights",
    ]  # fmt: skip
    if gamma != 1.0:
        args += ["--llrd", f"{gamma:g}"]
    for i, tok in enumerate(spec.passthrough):
        if tok == "--ood-eval" and i + 1 < len(spec.passthrough):
            args += ["--ood-eval", spec.passthrough[i + 1]]
    for flag in _PASSED:
        if (v := _value(spec.passthrough, flag)) is not None:
            args += [flag, v]
    if "--trust-remote-code" in spec.passthrough:
        args.append("--trust-remote-code")
    args += ["--eval-cache", _value(spec.passthrough, "--eval-cache") or str(spec.eval_cache)]
    return args


def _fingerprint(spec: SweepSpec, cell: Cell, gamma: float, cell_record: dict) -> str:
    """What a merge point of the cell depends on, its α aside: the merge's options, the cell's settings and inputs
    (which hold the base, the eval set and the held-out texts), and which training of the cell it merges."""
    argv = _without(_without(merge_argv(spec, cell, gamma, []), "--eval-cache"), "--alpha")
    cell_dir = spec.output_dir / "cells" / cell.name
    blob = json.dumps({"argv": argv, "cell": cell_record.get("fingerprint"), "run": run_identity(cell_dir)})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _key(alpha: float) -> str:
    return f"{alpha:g}"


def run_merges(spec: SweepSpec, cell: Cell, cell_record: dict, env: dict) -> tuple[list[dict], list[dict]]:
    """(records, failures) of the cell's merges; the cell's own record takes the α = 1 measurement. The points a
    run measured are kept in the merge folder's record: a re-run measures only the α it has not measured yet."""
    records, failed = [], []
    wanted = sorted({*spec.merge_alphas, 1.0})
    cell_dir = spec.output_dir / "cells" / cell.name
    for gamma in spec.merge_gammas:
        d = merge_dir(spec, cell, gamma)
        fp = _fingerprint(spec, cell, gamma, cell_record)
        saved = read_record(d / MERGE_RECORD) or {}
        points = saved.get("points") if saved.get("fingerprint") == fp else None
        points = dict(points) if isinstance(points, dict) else {}
        missing = [a for a in wanted if _key(a) not in points]
        if missing and not has_weights(cell_dir):
            error = discarded_message(cell.name, cell_dir, missing)
            failed.append({"cell": f"{cell.name} merge γ={gamma:g}", "failed": True, "exit_code": 1, "error": error})
        elif missing:
            argv = merge_argv(spec, cell, gamma, missing)
            failure = _run(argv, d, spec, cell, gamma, env)
            if failure:
                failed.append(failure)
            else:
                results = json.loads((d / "merge_results.json").read_text())
                points.update({_key(p["alpha"]): p for p in results["points"] if p["label"] != "base"})
                write_record(d, MERGE_RECORD, {"fingerprint": fp, "argv": argv, "points": points})
        measured = [points[_key(a)] for a in wanted if _key(a) in points]
        records += _records({"points": measured}, cell, cell_record, gamma, fp)
    if spec.budget_points:
        budgeted, bad = _budget_point(spec, cell, cell_record, env)
        records += budgeted
        failed += bad
    return records, failed


def budget_dir(spec: SweepSpec, cell: Cell) -> Path:
    return spec.output_dir / "merges" / f"{cell.name}-budget"


def budget_argv(spec: SweepSpec, cell: Cell) -> list[str]:
    """`posttrainllm merge --max-forgetting P` of one cell: its largest uniform α within the sweep's budget, the
    point measured (in-domain loss, held-out change) and its weights discarded."""
    args = _without(_without(merge_argv(spec, cell, 1.0, []), "--alpha"), "--output-dir")
    return [*args, "--output-dir", str(budget_dir(spec, cell)), "--max-forgetting", f"{spec.max_forgetting:g}"]


def _budget_point(spec: SweepSpec, cell: Cell, cell_record: dict, env: dict) -> tuple[list[dict], list[dict]]:
    """The cell's budgeted point (`budget_argv`), kept in its folder's record like a merge's points. A cell that
    meets the budget as trained is its own budgeted point (α 1: no second point); one that only the base meets
    gives the point at α 0."""
    d = budget_dir(spec, cell)
    cell_dir = spec.output_dir / "cells" / cell.name
    argv = budget_argv(spec, cell)
    blob = json.dumps({"argv": _without(argv, "--eval-cache"), "cell": cell_record.get("fingerprint"),
        "run": run_identity(cell_dir)})  # fmt: skip
    fp = hashlib.sha256(blob.encode()).hexdigest()[:16]
    saved = read_record(d / MERGE_RECORD) or {}
    points = saved.get("points") if saved.get("fingerprint") == fp else None
    if not isinstance(points, list):
        if not has_weights(cell_dir):
            error = discarded_message(cell.name, cell_dir, [])
            return [], [{"cell": f"{cell.name} budget", "failed": True, "exit_code": 1, "error": error}]
        failure = _run(argv, d, spec, cell, 1.0, env, ok=(0, BUDGET_EXIT), label="budget")
        if failure:
            return [], [failure]
        results = json.loads((d / "merge_results.json").read_text())
        points = [p for p in results["points"] if p["label"] != "base"]
        write_record(d, MERGE_RECORD, {"fingerprint": fp, "argv": argv, "points": points})
    chosen = [p for p in points if p["alpha"] != 1.0]
    cell_record["budget_alpha"] = points[0]["alpha"] if points else None
    out = _records({"points": chosen}, cell, dict(cell_record), 1.0, fp)
    for r in out:
        r.update(cell=f"{cell.name}/budget", merge="budget", budget_alpha=cell_record["budget_alpha"],
            merge_label=f"budget ≤{spec.max_forgetting:g}%")  # fmt: skip
    return out, []


def _run(argv: list[str], d: Path, spec: SweepSpec, cell: Cell, gamma: float, env: dict, ok=(0,),
         label: str | None = None) -> dict | None:  # fmt: skip
    """None when the merge exits with a code in `ok`, else the failure's record."""
    log = spec.output_dir / "logs" / f"{d.name}.merge.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if d.exists() and any(d.iterdir()):
        claim(d, MERGE_RECORD)
        argv = [*argv, "--overwrite"]  # an unfinished or differently configured earlier attempt
    with open(log, "w") as f:
        f.write("$ posttrainllm " + " ".join(shlex.quote(a) for a in argv) + "\n")
        f.flush()
        cmd = [sys.executable, "-m", "posttrainllm", *argv]
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc in ok:
        return None
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
    what = label or f"merge γ={gamma:g}"
    return {"cell": f"{cell.name} {what}", "failed": True, "exit_code": rc, "error": tail[0][:300]}


def _records(results: dict, cell: Cell, cell_record: dict, gamma: float, fingerprint: str | None = None) -> list[dict]:
    """One record per merge point; the α = 1, γ = 1 point updates the cell's own record instead."""
    out = []
    for p in results["points"]:
        if p["label"] == "base":
            continue
        measured = {
            "eval_loss": p["eval_loss"],
            "ood_change_pct": {n: v.get("change_pct") for n, v in p["held_out"].items()},
            "ood_kl": {n: v["kl"] for n, v in p["held_out"].items() if v.get("kl") is not None},
        }
        merge = Merge(p["alpha"], gamma)
        if (merge.alpha, merge.gamma) == (1.0, 1.0):
            cell_record.setdefault("trainer_eval_loss", cell_record.get("eval_loss"))
            cell_record.update(measured)
            continue
        # a cell recorded by an older sweep has no kl_to_base / self_replay: they were off
        record = {
            k: cell_record.get(k, 0) for k in ("gamma", "lr", "replay_ratio", "kl_to_base", "self_replay", "seed")
        }
        record.update(loss_type=cell_record.get("loss_type", "nll"), command=cell_record.get("command"))
        name = f"{cell.name}/{merge.name}"
        out.append({**record, **measured, "cell": name, "merge": merge.name, "merge_label": merge.label})
        out[-1]["fingerprint"] = fingerprint
    return out
