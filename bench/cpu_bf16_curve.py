"""bf16 autocast vs fp32 on a CPU with bf16 instructions: the loss curve over a 100-step run of the real model, the
speed, and the fixed costs of a run (start to the first optimizer step, after the last one).

    python bench/cpu_bf16_curve.py [--json] [--steps 100] [--threads 2]
    python bench/cpu_bf16_curve.py --model DIR --dataset ALPACA.json       # other model / data (independent re-run)

Runs `posttrainllm sft` (flat, the command's default LR) on SmolLM2-135M-Instruct (bench/smollm2.py) with the first
900 Alpaca rows as prompt/completion (bench/real_throughput.py's data), once with `--precision fp32` and once with
`--precision bf16` at the same seed (so the same batches in the same order), and once more in fp32 at another seed:
the fp32-vs-fp32 difference across seeds is the yardstick the bf16-vs-fp32 difference is read against. Each final
model is then scored in fp32 on the 99 held-out rows (`posttrainllm eval --sft-dataset`, mean completion-token loss).

Reported: the per-step training loss of both precisions (mean and largest |difference|, the mean of the last 20
steps), the held-out loss of each model, the trainer's samples/s and their ratio, the dtype of the saved weights,
and for every run the seconds from the process start to the first optimizer step (the first step's log line less
one mean step) and from the last step's log line to the process end (final save, drift report, records), as shares
of the whole run. bf16 "holds the loss" when its held-out loss is within the seed-to-seed difference of fp32 (or
within 0.01, whichever is larger) and its last-20-step mean training loss within 0.02 of fp32's: the rule decision
log 37 asks this measurement to settle, written here before the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_throughput import SHARED, eval_loss, write_data  # noqa: E402

EVAL_TOLERANCE, TRAIN_TOLERANCE = 0.01, 0.02


def timed_run(argv: list[str], env: dict, steps: int) -> dict:
    """Run a command, timestamping its output lines: the first and last step's log lines and the process end."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
    seen, tail = {}, []
    for line in proc.stdout:
        tail = (tail + [line])[-40:]
        for step in (1, steps):
            if f"step {step}/{steps} " in line and step not in seen:
                seen[step] = time.perf_counter() - t0
    if proc.wait() != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{''.join(tail)}")
    end = time.perf_counter() - t0
    if len(seen) < 2:
        raise RuntimeError(f"no log line for step 1 or {steps}:\n{''.join(tail)}")
    return {"wall_s": end, "first_step_line_s": seen[1], "last_step_line_s": seen[steps]}


def saved_dtypes(out: Path) -> list[str]:
    from safetensors import safe_open

    dtypes = set()
    for f in out.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            dtypes |= {str(st.get_slice(k).get_dtype()) for k in st.keys()}  # noqa: SIM118 - safe_open is no dict
    return sorted(dtypes)


def one_run(a, data, model_dir, root, env, precision: str, seed: int) -> dict:
    from common import VENV_BIN

    out = root / f"{precision}_{seed}"
    exe = VENV_BIN / "posttrainllm"
    argv = [str(exe) if exe.exists() else "posttrainllm", "sft", "--model", model_dir, "--dataset",
            str(data["train"]), "--output-dir", str(out), "--max-steps", str(a.steps), "--batch-size",
            str(a.batch_size), "--max-length", str(a.max_length), "--precision", precision, "--seed", str(seed),
            "--logging-steps", "1", "--save-steps", str(a.steps + 1000)]  # fmt: skip
    if a.lr:
        argv += ["--lr", str(a.lr)]
    r = timed_run(argv, env, a.steps)
    train = json.loads((out / "eval_results.json").read_text())["train"]
    state = json.loads((out / "trainer_state.json").read_text())
    losses = {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}
    step_s = train["train_runtime"] / a.steps
    r.update(
        precision=precision, seed=seed, train_runtime_s=train["train_runtime"],
        samples_per_s=train["train_samples_per_second"], train_loss=train.get("train_loss"),
        losses=[losses[s] for s in sorted(losses)], saved_dtypes=saved_dtypes(out),
        start_to_first_step_s=r["first_step_line_s"] - step_s, after_last_step_s=r["wall_s"] - r["last_step_line_s"],
    )  # fmt: skip
    r["eval_loss"] = eval_loss(str(out), data["val"], a.max_length, env)
    shutil.rmtree(out, ignore_errors=True)
    return r


def compare(runs: dict) -> dict:
    fp, bf, other = runs["fp32"], runs["bf16"], runs["fp32_seed2"]
    diffs = [abs(x - y) for x, y in zip(bf["losses"], fp["losses"])]
    last = {k: sum(v["losses"][-20:]) / len(v["losses"][-20:]) for k, v in runs.items()}
    seed_gap = abs(other["eval_loss"] - fp["eval_loss"])
    eval_gap = bf["eval_loss"] - fp["eval_loss"]
    train_gap = last["bf16"] - last["fp32"]
    return {
        "mean_abs_step_loss_diff": sum(diffs) / len(diffs), "max_abs_step_loss_diff": max(diffs),
        "last20_mean_loss": last, "last20_bf16_minus_fp32": train_gap,
        "eval_bf16_minus_fp32": eval_gap, "eval_fp32_seed_gap": seed_gap,
        "speed_bf16_over_fp32": bf["samples_per_s"] / fp["samples_per_s"],
        "holds_loss": abs(eval_gap) <= max(seed_gap, EVAL_TOLERANCE) and abs(train_gap) <= TRAIN_TOLERANCE,
    }  # fmt: skip


def main() -> None:
    from common import base_parser, emit, log, machine_info

    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory (default: bench/smollm2.py's converted SmolLM2)")
    p.add_argument("--dataset", default=str(SHARED / "alpaca_en_demo.json"), help="Alpaca-format JSON")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=192)
    p.add_argument("--lr", type=float, default=None, help="default: sft's own default LR")
    p.add_argument("--seeds", default="42,43", help="the shared seed, then fp32's second seed")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if a.quick:
        a.steps = min(a.steps, 6)
    model_dir = a.model or subprocess.run(
        [sys.executable, str(Path(__file__).parent / "smollm2.py"), "--dir"], check=True, capture_output=True,
        text=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(a.threads))
    seed, seed2 = (int(s) for s in a.seeds.split(","))
    result = {"machine": machine_info(), "argv": sys.argv[1:], "model": model_dir, "threads": a.threads}
    root = Path(tempfile.mkdtemp(prefix="posttrainllm-bf16-"))
    try:
        data = write_data(root, Path(a.dataset))
        runs = {}
        for name, precision, s in (("bf16", "bf16", seed), ("fp32", "fp32", seed), ("fp32_seed2", "fp32", seed2)):
            log(f"{name}: {a.steps} steps ...")
            runs[name] = one_run(a, data, model_dir, root, env, precision, s)
            log(f"  {runs[name]['samples_per_s']:.3f} samples/s, eval loss {runs[name]['eval_loss']:.4f}")
        result.update(runs=runs, comparison=compare(runs))
        emit(result, a.json, report(result, a))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(r: dict, a) -> str:
    c, runs = r["comparison"], r["runs"]
    lines = [f"model {r['model']}, {a.steps} steps × batch {a.batch_size}, max length {a.max_length}, {a.threads} thr"]
    for name, x in runs.items():
        lines.append(
            f"  {name:10s} {x['samples_per_s']:.3f} samples/s  train loss {x['train_loss']:.4f}  last-20 "
            f"{c['last20_mean_loss'][name]:.4f}  eval {x['eval_loss']:.4f}  saved {','.join(x['saved_dtypes'])}  "
            f"start→step 1 {x['start_to_first_step_s']:.1f} s ({x['start_to_first_step_s'] / x['wall_s']:.1%}), "
            f"after last step {x['after_last_step_s']:.1f} s ({x['after_last_step_s'] / x['wall_s']:.1%}), "
            f"wall {x['wall_s']:.0f} s"
        )
    lines += [
        f"bf16/fp32 samples/s {c['speed_bf16_over_fp32']:.3f}; per-step |Δloss| mean {c['mean_abs_step_loss_diff']:.4f}"
        f" max {c['max_abs_step_loss_diff']:.4f}; last-20 bf16 − fp32 {c['last20_bf16_minus_fp32']:+.4f}",
        f"eval bf16 − fp32 {c['eval_bf16_minus_fp32']:+.4f} (fp32 seed-to-seed {c['eval_fp32_seed_gap']:.4f}); "
        f"holds the loss: {c['holds_loss']}",
    ]
    m = r["machine"]
    load = m.get("loadavg_at_start")
    lines.append(f"machine: {m['nproc']} CPUs ({m['cpu']}), torch {m['torch']}, {m['date']}, load at start {load}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
