"""Peak memory of reading two models tensor by tensor: posttrainllm's reader (merging/tensors.py, plain file reads
into fresh buffers) against `safetensors.safe_open` (memory-mapped), side by side in one run.

    python bench/safetensors_read.py [--model DIR] [--block-rows 4096]

DIR defaults to the converted SmolLM2-135M-Instruct directory (bench/smollm2.py --dir); the two inputs are that
model's weight file read twice (as the base and as the tuned model of a merge), every tensor in blocks of rows, as
`posttrainllm merge` reads them. Each reader runs in its own child process (its peak RSS from os.wait4), and a third
child that only imports torch and safetensors gives the floor. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

OURS = """
import sys
from posttrainllm.merging.tensors import SafetensorsSource
a, b, rows = SafetensorsSource(sys.argv[1]), SafetensorsSource(sys.argv[1]), int(sys.argv[2])
total = 0.0
for name in a.names():
    dtype, shape = a.meta(name)
    n = shape[0] if shape else 1
    for r in range(0, n, rows):
        span = (r, min(n, r + rows)) if shape else None
        total += float((b.read(name, span).float() - a.read(name, span).float()).abs().sum())
print(total)
"""

SAFE_OPEN = """
import sys
from safetensors import safe_open
from posttrainllm.merging.tensors import weight_files
files, rows = weight_files(__import__("pathlib").Path(sys.argv[1])), int(sys.argv[2])
total = 0.0
handles = [(safe_open(str(f), "pt"), safe_open(str(f), "pt")) for f in files]
for fa, fb in handles:
    for name in fa.keys():
        sa, sb = fa.get_slice(name), fb.get_slice(name)
        shape = sa.get_shape()
        n = shape[0] if shape else 1
        for r in range(0, n, rows):
            x = sa[r : r + rows] if shape else sa[:]
            y = sb[r : r + rows] if shape else sb[:]
            total += float((y.float() - x.float()).abs().sum())
print(total)
"""

FLOOR = "import torch, safetensors.torch, posttrainllm.merging.tensors"


def peak_of(code: str, *args: str) -> tuple[int, float, str]:
    """(peak RSS in bytes, wall seconds, stdout) of a child process running `code`."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out = proc.stdout.read() if proc.stdout else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed:\n{proc.stderr.read() if proc.stderr else ''}"[-2000:])
    return usage.ru_maxrss * 1024, wall, out.strip()


def default_model() -> str:
    here = Path(__file__).resolve().parent
    out = subprocess.run([sys.executable, str(here / "smollm2.py"), "--dir"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--block-rows", type=int, default=4096)
    a = p.parse_args()
    model = a.model or default_model()
    from posttrainllm.merging.tensors import weight_files

    size = sum(f.stat().st_size for f in weight_files(Path(model)))
    floor, _, _ = peak_of(FLOOR)
    ours, ours_s, ours_sum = peak_of(OURS, model, str(a.block_rows))
    mapped, mapped_s, mapped_sum = peak_of(SAFE_OPEN, model, str(a.block_rows))
    print(
        json.dumps(
            {
                "model": model,
                "weight_bytes": size,
                "floor_rss": floor,
                "ours_rss": ours,
                "safe_open_rss": mapped,
                "ours_added_x_model": round((ours - floor) / size, 3),
                "safe_open_added_x_model": round((mapped - floor) / size, 3),
                "ours_s": round(ours_s, 1),
                "safe_open_s": round(mapped_s, 1),
                "same_result": ours_sum == mapped_sum,
            }
        )
    )


if __name__ == "__main__":
    main()
