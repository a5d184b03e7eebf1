"""What a command on a GGUF file pays before loading: reading the file's header (`gguf.inspect`) against the
converted directory's record of it (`gguf.cached_inspect`), side by side in one run, rotated.

    python bench/gguf_header.py "$(python bench/gemma3.py --gguf)" --reps 3

Every `--model FILE.gguf` command resolves the file to its converted directory; the header read is what it costs
when that directory exists. A 262k vocabulary is 262k header fields.
"""

from __future__ import annotations

from pathlib import Path

from common import alternate, base_parser, emit, machine_info, median, spread, timed

from posttrainllm.models import gguf, resolve_model


def main() -> None:
    ap = base_parser(__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    a = ap.parse_args()
    reps = a.reps or (1 if a.quick else 3)
    resolve_model(str(a.gguf))  # converted once (the cache), so that both sides find it
    assert gguf.cached_inspect(a.gguf) == gguf.inspect(a.gguf), "the record differs from the header"
    times = alternate({
        "header": lambda: timed(lambda: gguf.inspect(a.gguf)),
        "record": lambda: timed(lambda: gguf.cached_inspect(a.gguf)),
    }, reps)  # fmt: skip
    header, record = median(times["header"]), median(times["record"])
    result = {"machine": machine_info(torch_needed=False), "file": a.gguf.name, "reps": reps, "seconds": times,
              "header_s": header, "record_s": record, "ratio": header / record}  # fmt: skip
    lo, hi = spread(times["header"])
    text = f"{a.gguf.name} on {result['machine']['cpu']}: header read {header:.3f} s ({lo:.3f}-{hi:.3f}), "
    emit(result, a.json, text + f"record {record:.4f} s (median of {reps}); ratio {header / record:.0f}x")


if __name__ == "__main__":
    main()
