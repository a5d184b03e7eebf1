"""Peak memory of `posttrainllm merge` on a real model, against the model's size.

    python bench/merge_memory.py --model TUNED_DIR [--base BASE] [--alpha 0.5] [--llrd 0.9] [--output-dir DIR]

BASE defaults to the converted SmolLM2-135M-Instruct directory (bench/smollm2.py --dir). The merge runs in a child
process started from this small one, so the child's peak RSS (ru_maxrss from os.wait4) is its own; a second child
that only imports what the merge imports (torch, transformers, peft, posttrainllm) gives the floor any command
starts from. Prints one JSON line: model bytes, the merge's peak, the import floor and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORTS = "import torch, transformers, peft, posttrainllm.cli, posttrainllm.merging, posttrainllm.evaluate"


def peak_of(cmd: list[str]) -> tuple[int, float]:
    """(peak RSS in bytes, wall seconds) of a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed:\n{err[-2000:]}")
    return usage.ru_maxrss * 1024, wall


def default_base() -> str:
    here = Path(__file__).resolve().parent
    cmd = [sys.executable, str(here / "smollm2.py"), "--dir"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the tuned model directory")
    ap.add_argument("--base", default=None, help="the base (default: the converted SmolLM2 directory)")
    ap.add_argument("--alpha", default="0.5")
    ap.add_argument("--llrd", default="0.9")
    ap.add_argument("--output-dir", default=None, help="where the merge is written (default: a temporary folder)")
    args = ap.parse_args()
    base = args.base or default_base()
    weights = Path(base) / "model.safetensors"
    size = weights.stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        out = args.output_dir or str(Path(tmp) / "merged")
        cmd = [sys.executable, "-m", "posttrainllm", "merge", "--base", base, "--model", args.model]
        cmd += ["--output-dir", out, "--alpha", args.alpha, "--llrd", args.llrd]
        peak, wall = peak_of(cmd)
        floor, _ = peak_of([sys.executable, "-c", IMPORTS])
    print(
        json.dumps(
            {
                "base": base,
                "model": args.model,
                "model_bytes": size,
                "merge_peak_rss": peak,
                "import_floor_rss": floor,
                "peak_over_model": round(peak / size, 3),
                "added_over_model": round((peak - floor) / size, 3),
                "wall_s": round(wall, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
