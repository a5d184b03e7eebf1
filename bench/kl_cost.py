"""What --kl-to-base costs: `posttrainllm sft` with and without `--kl-to-base BETA`, side by side on one model.

    OMP_NUM_THREADS=1 nice python bench/kl_cost.py --model DIR [--dataset ALPACA.json] [--steps 6] [--reps 2]
    ... --extra "--lora-r 8"          # the same under LoRA (the base is the adapter-disabled model: no copy)

Each run is a fresh process (rotated order, plain first in even repetitions): the same data, seed, batch 4, max
length 192 and steps, no checkpoint during training. Step time: the median gap between consecutive per-step log
lines (step 1, which holds the warm-up, is left out), in wall-clock seconds and in the process's CPU seconds
(which other users' load on a shared machine stretches least; with one thread, the work done). Peak memory: the
process's peak RSS (`wait4`'s ru_maxrss), which includes the model load, so the difference is what the anchor
adds: the frozen copy of the weights and the per-step working memory of the base's forward and the KL. Prints one
row per run and the medians per setting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
STEP = re.compile(r"^step (\d+)/\d+ · loss ([0-9.]+)(?:.*kl_to_base ([0-9.e-]+))?")


def one_run(args, beta: float, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "posttrainllm", "sft", "--model", args.model, "--dataset", args.dataset,
        "--output-dir", str(out), "--max-steps", str(args.steps), "--batch-size", "4", "--max-length", "192",
        "--logging-steps", "1", "--save-steps", "100000", "--precision", args.precision, "--overwrite",
    ] + args.extra.split() + (["--kl-to-base", f"{beta:g}"] if beta else [])  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    stamps, cpu, losses, kls, tail = [], [], [], [], []
    for line in proc.stdout:
        tail = (tail + [line])[-30:]
        m = STEP.match(line.strip())
        if m:
            stamps.append(time.monotonic())
            cpu.append(_cpu_seconds(proc.pid))
            losses.append(float(m.group(2)))
            kls.append(float(m.group(3)) if m.group(3) else None)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0 or len(stamps) != args.steps:
        raise SystemExit(f"run failed (status {status}):\n{''.join(tail)}")
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "beta": beta,
        "step_s": statistics.median(gaps),
        "step_cpu_s": statistics.median(b - a for a, b in zip(cpu, cpu[1:])),
        "peak_rss_mib": usage.ru_maxrss / 1024,  # Linux: KiB
        "loss": losses,
        "kl_to_base": kls,
    }


def _cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far (/proc/PID/stat): a step's CPU time is what other users' load
    on a shared machine stretches least."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dataset", default=str(SHARED / "alpaca_en_demo.json"))
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--precision", default="auto")
    p.add_argument("--extra", default="", help="more posttrainllm sft flags for both sides, e.g. '--lora-r 8'")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kl-cost-") as tmp:
        for rep in range(args.reps):
            order = (0.0, args.beta) if rep % 2 == 0 else (args.beta, 0.0)
            for beta in order:
                row = one_run(args, beta, Path(tmp) / f"r{rep}-{beta:g}")
                row["rep"] = rep
                rows.append(row)
                print(
                    f"rep {rep} β={beta:g}: {row['step_s']:.2f} s/step ({row['step_cpu_s']:.2f} s CPU), "
                    f"peak RSS {row['peak_rss_mib']:.0f} MiB, loss {row['loss'][0]:.4f} → {row['loss'][-1]:.4f}, "
                    f"kl_to_base {row['kl_to_base'][-1]}",
                    file=sys.stderr,
                    flush=True,
                )
    summary = {}
    for beta in (0.0, args.beta):
        mine = [r for r in rows if r["beta"] == beta]
        summary[f"{beta:g}"] = {
            "step_s": statistics.median(r["step_s"] for r in mine),
            "step_cpu_s": statistics.median(r["step_cpu_s"] for r in mine),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in mine),
        }
    plain, anchored = summary["0"], summary[f"{args.beta:g}"]
    summary["ratio"] = {k: anchored[k] / plain[k] for k in plain}
    print(json.dumps({"runs": rows, "summary": summary}, indent=1) if args.json else json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
