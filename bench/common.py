"""Shared helpers for the benchmarks in bench/: machine description, alternated timing, medians, output.

Every benchmark measures its contenders side by side in ONE run, alternating their order over repetitions
(A B, B A, A B, ...), and reports the median of the per-repetition ratios: the machine is shared, so absolute
times drift; a ratio taken between neighbouring measurements cancels most of that drift.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

# Stanford Alpaca's prompt templates, written out independently of posttrainllm for the benchmarks' native paths
# (bench/throughput.py checks that posttrainllm.data applies the same text).
ALPACA_PROMPT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(torch_needed: bool = True) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
    }
    try:
        info["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    if torch_needed:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for mod in ("transformers", "trl"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            pass
    return info


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> tuple[float, float]:
    """(min, max): shown next to medians so a noisy run is visible."""
    return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))


def order_for(rep: int, names: Sequence[str]) -> list[str]:
    """Rotation of `names` by the repetition index (2 contenders: A B, B A, A B, ...)."""
    k = rep % len(names)
    out = list(names[k:]) + list(names[:k])
    return out


def alternate(contenders: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Call each contender once per repetition, rotating the order; returns name -> list of measurements."""
    names = list(contenders)
    out: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in order_for(rep, names):
            out[name].append(contenders[name]())
    return out


def ratios(results: dict[str, list[float]], num: str, den: str) -> list[float]:
    """Per-repetition ratios num/den (measurements of the same repetition sit next to each other in time)."""
    return [a / b for a, b in zip(results[num], results[den]) if b]


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_cmd(
    argv: Sequence[str], *, env: dict | None = None, cwd: str | None = None, timeout: float = 1800
) -> tuple[float, subprocess.CompletedProcess]:
    """Run a subprocess; returns (wall seconds, completed process). Raises with the tail of its output on failure."""
    full_env = {**os.environ, **(env or {})}
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stdout[-2000:] + "\n" + proc.stderr[-4000:]).strip()
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{tail}")
    return wall, proc


def converted_model(given: str | None, script: str = "smollm2.py") -> str:
    """The model directory a benchmark runs on: `given`, else the converted directory of the real model that
    bench/`script` fetches and converts (smollm2.py, gemma3.py; its `--dir` prints the path last)."""
    if given:
        return given
    out = subprocess.run([sys.executable, str(Path(__file__).parent / script), "--dir"], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return out.strip().splitlines()[-1]


def llama_config(
    hidden: int,
    layers: int,
    *,
    vocab: int = 32000,
    intermediate: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    tie: bool = False,
    max_pos: int = 2048,
):
    """A llama-shaped config (intermediate ≈ 8/3·hidden rounded to 64 by default, head dim 64, GQA 2:1)."""
    from transformers import LlamaConfig

    heads = heads or max(1, hidden // 64)
    kv_heads = kv_heads or max(1, heads // 2)
    intermediate = intermediate or int(round(hidden * 8 / 3 / 64)) * 64
    return LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        tie_word_embeddings=tie,
    )


def fmt_count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="short run (fewer repetitions / steps)")
    p.add_argument("--json", action="store_true", help="print only a JSON object with the results")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default depends on --quick)")
    return p


def emit(result: dict, as_json: bool, text: str) -> None:
    """--json: the JSON object on stdout (the human-readable text goes to stderr); else the text on stdout."""
    if as_json:
        print(text, file=sys.stderr, flush=True)
        print(json.dumps(result, indent=1, default=str))
    else:
        print(text)


def log(msg: str, quiet: bool = False) -> None:
    """Progress goes to stderr so that --json output stays clean."""
    if not quiet:
        print(msg, file=sys.stderr, flush=True)
