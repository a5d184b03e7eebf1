"""torch.compile on CPU: `posttrainllm sft` of SmolLM2-135M-Instruct with and without `--trainer-arg
torch_compile=true`, the same rows, seed, batch, length and precision, compile time included.

    OMP_NUM_THREADS=1 python bench/compile_cpu.py [--json] [--steps 50] [--reps 1] [--precision auto] [--extra FLAGS]

Each run is a fresh `posttrainllm sft` subprocess with `--logging-steps 1`; the script stamps each step's log line
as it arrives, so it reports, per contender: the wall time of the whole run (start-up and compilation included),
its CPU time (user + system, from `os.wait4`: on a shared machine the wall clock also counts waiting for a core), the
trainer's `train_runtime` (the training loop, compilation included: the first compiled step compiles), the time
to the first step, and the steady-state seconds per step (median of the step-to-step intervals after step 10), plus
the training loss of every step side by side. Data: the first 900 Alpaca rows as prompt/completion
(bench/real_throughput.py's `write_data`). With --reps > 1 the order rotates; the ratios are medians of
per-repetition ratios. The decision rule (issue #36): offer compilation if compiled/plain >= 1.15 in samples per
second over the whole training loop (compile time included) at equal loss (|difference| <= 1e-2 at the same steps).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_throughput import SHARED, model_and_env, ours_argv, write_data  # noqa: E402

STEP_LINE = re.compile(r"^step (\d+)/(\d+) · (.*)$")
KINDS = {"plain": [], "compiled": ["--trainer-arg", "torch_compile=true"]}


def run_one(kind: str, data: dict, model_dir: str, root: Path, a, env: dict, tag: str) -> dict:
    out = root / f"{tag}_{kind}"
    argv = ours_argv("flat", data, model_dir, out, a.steps, a.batch_size, a.max_length, a.precision)
    argv[argv.index("--logging-steps") + 1] = "1"
    argv += KINDS[kind] + shlex.split(a.extra)
    t0 = time.perf_counter()
    full_env = {**os.environ, **env}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env)
    stamps, losses, tail = {}, {}, []
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.perf_counter() - t0
        tail = (tail + [line.rstrip()])[-30:]
        m = STEP_LINE.match(line.strip())
        if m:
            step = int(m.group(1))
            stamps[step] = now
            loss = re.search(r"(?:^| )loss ([0-9.]+)", m.group(3))
            if loss:
                losses[step] = float(loss.group(1))
    _, status, usage = os.wait4(proc.pid, 0)  # the child's CPU time: on a shared machine wall time also waits
    rc = proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if rc != 0:
        return {"error": f"exit {rc}", "tail": tail, "wall_s": wall}
    metrics = json.loads((out / "eval_results.json").read_text())["train"]
    steps = sorted(stamps)
    gaps = [stamps[s] - stamps[p] for p, s in zip(steps, steps[1:]) if p >= 10]
    gaps.sort()
    steady = gaps[len(gaps) // 2] if gaps else float("nan")
    return {
        "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "train_runtime_s": metrics["train_runtime"],
        "samples_per_s": metrics["train_samples_per_second"], "first_step_at_s": stamps.get(1),
        "steady_s_per_step": steady, "train_loss": metrics.get("train_loss"),
        "losses": {str(k): v for k, v in sorted(losses.items())},
        "step_at_s": {str(k): round(v, 2) for k, v in sorted(stamps.items())},  # recompilations show as long gaps
    }  # fmt: skip


def main() -> None:
    from common import base_parser, emit, log, machine_info, median, order_for

    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory (default: bench/smollm2.py's converted SmolLM2)")
    p.add_argument("--dataset", default=str(SHARED / "alpaca_en_demo.json"), help="Alpaca-format JSON")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="auto")
    p.add_argument("--kinds", default="plain,compiled")
    p.add_argument("--extra", default="", help='more `posttrainllm sft` flags for both sides, e.g. "--packing"')
    a = p.parse_args()
    a.reps = a.reps or 1
    model_dir, env = model_and_env(a.model, a.threads)
    machine = machine_info()
    names = a.kinds.split(",")
    res: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="posttrainllm-compile-") as tmp:
        root = Path(tmp)
        data = write_data(root, Path(a.dataset))
        for rep in range(a.reps):
            for n in order_for(rep, names):
                log(f"rep {rep + 1}/{a.reps}: {n} ({a.steps} steps) ...")
                r = run_one(n, data, model_dir, root, a, env, f"r{rep}")
                log(f"  {n}: {json.dumps({k: v for k, v in r.items() if k != 'losses'})}")
                res[n].append(r)
    result = {"machine": machine, "argv": sys.argv[1:], "model": model_dir, "threads": a.threads, "raw": res}
    if {"plain", "compiled"} <= set(names) and all("error" not in r for n in names for r in res[n]):
        pairs = list(zip(res["compiled"], res["plain"]))
        result["ratios"] = {
            "samples_per_s (train loop, compile included)": median(
                [c["samples_per_s"] / q["samples_per_s"] for c, q in pairs]
            ),
            "wall, whole run (plain / compiled)": median([q["wall_s"] / c["wall_s"] for c, q in pairs]),
            "CPU time, whole run (plain / compiled)": median([q["cpu_s"] / c["cpu_s"] for c, q in pairs]),
            "steady state after step 10 (plain / compiled s per step)": median(
                [q["steady_s_per_step"] / c["steady_s_per_step"] for c, q in pairs]
            ),
        }  # fmt: skip
        diffs = [abs(c["losses"][k] - q["losses"][k]) for c, q in pairs for k in c["losses"] if k in q["losses"]]
        result["loss_abs_diff"] = {"max": max(diffs, default=float("nan")), "mean": sum(diffs) / max(1, len(diffs))}
    emit(result, a.json, report(result, a))


def report(r: dict, a) -> str:
    m = r["machine"]
    lines = [
        f"model {r['model']}, --precision {a.precision}, OMP_NUM_THREADS={a.threads}, {a.steps} steps × batch "
        f"{a.batch_size} × {a.max_length}, {a.reps} rep(s); load at start {m.get('loadavg_at_start')}"
    ]
    for n, runs in r["raw"].items():
        for x in runs:
            if "error" in x:
                lines.append(f"  {n:9s} FAILED ({x['error']}):\n    " + "\n    ".join(x["tail"]))
                continue
            lines.append(
                f"  {n:9s} wall {x['wall_s']:7.1f} s  CPU {x['cpu_s']:7.1f} s  train_runtime "
                f"{x['train_runtime_s']:7.1f} s  first step at "
                f"{x['first_step_at_s'] or float('nan'):6.1f} s  steady {x['steady_s_per_step']:.3f} s/step  "
                f"train loss {x['train_loss']:.4f}"
            )
    for k, v in r.get("ratios", {}).items():
        rule = " (offer at >= 1.15×)" if k.startswith("samples_per_s") else ""
        lines.append(f"  compiled vs plain, {k}: {v:.3f}×{rule}")
    if "loss_abs_diff" in r:
        d = r["loss_abs_diff"]
        lines.append(f"  per-step loss |compiled − plain|: max {d['max']:.4f}, mean {d['mean']:.4f} (equal: <= 1e-2)")
        c, q = r["raw"]["compiled"][0]["losses"], r["raw"]["plain"][0]["losses"]
        shown = [k for k in q if int(k) in (1, 2, 5, 10, 20, 30, 40, 50) or k == max(q, key=int)]
        pairs = "  ".join(f"{k}: {q[k]:.4f}/{c.get(k, float('nan')):.4f}" for k in shown)
        lines.append("  step: plain / compiled loss  " + pairs)
    lines.append(f"machine: {m['nproc']} CPUs ({m['cpu']}), torch {m['torch']}, {m['date']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
