"""What a command on a GGUF file pays before loading: reading the file's header (`gguf.inspect`) against the
converted directory's record of it (`gguf.cached_inspect`), side by side in one run.

    python bench/gguf_header.py "$(python bench/gemma3.py --gguf)" --reps 3

Every `--model FILE.gguf` command resolves the file to its converted directory; the header read is what it costs
when that directory exists. A 262k vocabulary is 262k header fields.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from posttrainllm.models import gguf, resolve_model


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    resolve_model(str(a.gguf))  # converted once (the cache), so that both sides find it
    header = timed(lambda: gguf.inspect(a.gguf), a.reps)
    record = timed(lambda: gguf.cached_inspect(a.gguf), a.reps)
    assert gguf.cached_inspect(a.gguf) == gguf.inspect(a.gguf), "the record differs from the header"
    print(f"{a.gguf.name}: header read {header:.3f} s, record {record:.4f} s (median of {a.reps}); "
          f"ratio {header / record:.0f}x")  # fmt: skip


if __name__ == "__main__":
    main()
