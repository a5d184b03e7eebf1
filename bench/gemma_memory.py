"""Peak memory of whole runs on a 262k vocabulary: Gemma-3-270M, `posttrainllm sft` flat, with `--kl-to-base` (its
distributions a chunk of loss tokens at a time, and all at once), with `--self-replay`, `posttrainllm eval
--reference`, and a bare TRL SFTTrainer, side by side in one run.

    OMP_NUM_THREADS=2 nice python bench/gemma_memory.py [--model DIR] [--steps 4] [--batch-size 4] [--max-length 256]

Model: bench/gemma3.py's converted Gemma-3-270M unless --model. Data: Alpaca (../shared/data/alpaca_en_demo.json)
as prompt/completion rows (bench/real_throughput.py's `write_data`, the rows both sides read). Every contender is a
fresh process; its peak RSS is `wait4`'s ru_maxrss (the whole process: imports, model load, data, every step,
the final save). Each side's own precision default (`--precision auto`; TRL's SFTConfig defaults). Contenders:

- `trl`: the bare TRL script (bench/real_throughput.py's worker at precision auto);
- `flat`: `posttrainllm sft`;
- `kl`: `posttrainllm sft --kl-to-base 0.1` (both models' distributions a chunk of loss tokens at a time:
  divergence.chunk_positions, 128 positions on this vocabulary);
- `kl_whole`: the same with one chunk holding every loss token of the step (`chunk_positions` patched in the child
  process only): what the anchor held before it was chunked;
- `flat_no_probe`: `flat` with `--forgetting-probe 0` (no starting model loaded again after training for the probe);
- `flat_checkpointing`: that with `--gradient-checkpointing`, TRL's default (what separates `flat` from `trl`);
- `self_replay`: `posttrainllm sft --self-replay 4 --replay-ratio 0.25` (4 samples of the model drawn first: as many
  as 4 steps of batch 4 at 25% take);
- `eval_ref`: `posttrainllm eval --model M --reference M --text` on the first 40,000 characters of Python's
  documentation prose (the KL per window);
- `load`: a process that only loads the model (the size of a frozen copy, plus the libraries).

The issue's target: `kl` ≤ `flat` + one frozen copy of the weights (their fp32 bytes) + 20% of `flat`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, converted_model, emit, machine_info  # noqa: E402
from real_throughput import SHARED, model_and_env, ours_argv, trl_argv, write_data  # noqa: E402

WHOLE = "import posttrainllm.training.kl_to_base as k; k.chunk_positions = lambda vocab: 1 << 30"
LOAD = (
    "import sys; from posttrainllm import models; m = models.load_model(sys.argv[1], precision='fp32'); "
    "print(sum(p.numel() for p in m.parameters()))"
)


def peak_of(argv: list[str], env: dict) -> tuple[int, float, str]:
    """(peak RSS in bytes, wall seconds, the output's last lines) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **env})
    out = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{out[-3000:]}")
    return usage.ru_maxrss * 1024, wall, "\n".join(out.strip().splitlines()[-3:])


def contenders(a, data, model_dir: str, root: Path) -> dict[str, list[str]]:
    def sft(kind, *extra):
        return ours_argv("flat", data, model_dir, root / kind, a.steps, a.batch_size, a.max_length, "auto") + list(
            extra
        )

    kl = ["--kl-to-base", "0.1"]
    held = root / "python_docs_head.txt"  # the first 40,000 characters of the documentation prose: ~40 windows
    held.write_text((SHARED / "python_docs.txt").read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    whole = sft("kl_whole", *kl)
    whole = [sys.executable, "-c", f"{WHOLE}; import sys; from posttrainllm.cli import main; sys.argv = ['x'] + "
             f"sys.argv[1:]; main()", *whole[1:]]  # fmt: skip
    return {
        "trl": trl_argv(data, model_dir, root / "trl", a.steps, a.batch_size, a.max_length, "auto"),
        "flat": sft("flat"),
        "kl": sft("kl", *kl),
        "kl_whole": whole,
        "flat_no_probe": sft("flat_no_probe", "--forgetting-probe", "0"),
        "flat_checkpointing": sft("flat_checkpointing", "--forgetting-probe", "0", "--gradient-checkpointing"),
        "self_replay": sft("self_replay", "--self-replay", "4", "--replay-ratio", "0.25"),
        "eval_ref": [
            sys.executable,
            "-m",
            "posttrainllm",
            "eval",
            "--model",
            model_dir,
            "--reference",
            model_dir,
            "--text",
            str(held),
            "--max-length",
            str(a.max_length),
            "--json",
        ],  # fmt: skip
        "load": [sys.executable, "-c", LOAD, model_dir],
    }


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", help="model directory (default: bench/gemma3.py's converted Gemma-3-270M)")
    p.add_argument("--dataset", default=str(SHARED / "alpaca_en_demo.json"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated contenders (default: all)")
    a = p.parse_args()
    model_dir = converted_model(a.model, "gemma3.py")
    _, env = model_and_env(model_dir, a.threads)
    root = Path(tempfile.mkdtemp(prefix="posttrainllm-mem-"))
    data = write_data(root, Path(a.dataset))
    runs = contenders(a, data, model_dir, root)
    wanted = [k for k in runs if not a.only or k in a.only.split(",")]
    result = {"machine": machine_info(), "argv": sys.argv[1:], "model": model_dir, "steps": a.steps,
              "batch_size": a.batch_size, "max_length": a.max_length, "runs": {}}  # fmt: skip
    for kind in wanted:
        peak, wall, tail = peak_of(runs[kind], env)
        result["runs"][kind] = {"peak_rss_gib": peak / 2**30, "wall_s": round(wall, 1)}
        if kind == "load":
            result["params"] = int(tail.splitlines()[-1])
        print(f"{kind:12s} peak RSS {peak / 2**30:6.2f} GiB  ({wall:.0f} s)", file=sys.stderr, flush=True)
    r = result["runs"]
    if "params" in result and {"flat", "kl"} <= set(r):
        copy = result["params"] * 4 / 2**30
        target = r["flat"]["peak_rss_gib"] + copy + 0.2 * r["flat"]["peak_rss_gib"]
        met = r["kl"]["peak_rss_gib"] <= target
        result["target"] = {"frozen_copy_gib": copy, "kl_target_gib": target, "kl_met": met}
    emit(result, a.json, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
