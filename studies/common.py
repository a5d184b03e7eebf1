"""What the studies share: the shared data's splits, the machine's description, the real model's paths, and
`posttrainllm ARGS` as its own process."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def cli(args: list[str], log: Path, stdout: Path | None = None) -> float:
    """`posttrainllm ARGS` as its own process, output to `log` (stdout to `stdout` when given); returns the wall
    time. Raises on failure."""
    for path in (log, stdout):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    cmd = [sys.executable, "-m", "posttrainllm", *args]
    with open(log, "w") as err, open(stdout, "w") if stdout else contextlib.nullcontext(err) as out:
        code = subprocess.run(cmd, stdout=out, stderr=err, env=env).returncode
    if code:
        raise RuntimeError(f"posttrainllm {' '.join(args)} exited {code}; see {log}")
    return time.time() - t0


FAMILIES = ("smollm2", "gemma3")


def model_paths(family: str = "smollm2") -> tuple[Path, Path]:
    """(GGUF file, its converted model directory) of a real model, fetched once by bench/FAMILY.py: smollm2
    (SmolLM2-135M-Instruct) or gemma3 (Gemma 3 270M, base)."""
    fetch = [sys.executable, str(ROOT / "bench" / f"{family}.py")]
    gguf = subprocess.run([*fetch, "--gguf"], capture_output=True, text=True, check=True).stdout.strip()
    gguf_dir = subprocess.run([*fetch, "--dir"], capture_output=True, text=True, check=True).stdout.strip()
    return Path(gguf), Path(gguf_dir)


def smollm2_paths() -> tuple[Path, Path]:
    """(GGUF file, its converted model directory) of SmolLM2-135M-Instruct, fetched once by bench/smollm2.py."""
    return model_paths("smollm2")


def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{os.cpu_count()} CPU cores ({cpu or platform.processor()}), Python "
        f"{platform.python_version()}, torch {torch.__version__}, {gpu}"
    )


def _split_modules(text: str, marker: str, end: str = "") -> list[tuple[str, str]]:
    """[(name, text)] of a concatenation whose parts start with lines `marker<name>end`."""
    parts: list[list] = []
    for line in text.splitlines(keepends=True):
        if line.startswith(marker):
            parts.append([line.strip()[len(marker) : len(line.strip()) - len(end)], []])
        if parts:
            parts[-1][1].append(line)
    return [(name, "".join(lines)) for name, lines in parts]


def splits(shared: Path = SHARED) -> dict:
    """The shared data cut as ../shared/data/README.md suggests: Shakespeare (90% / 10%), the stdlib modules up to
    typing.py / after it, python_docs without / with the held-out documents (library/ s-z), Alpaca 900 / 99."""
    shakespeare = (shared / "tinyshakespeare.txt").read_text(encoding="utf-8")
    cut = int(len(shakespeare) * 0.9)
    modules = _split_modules((shared / "python_stdlib_code.txt").read_text(encoding="utf-8"), "# ==== Lib/", " ====")
    last_train = [m[0] for m in modules].index("typing.py")
    docs = _split_modules((shared / "python_docs.txt").read_text(encoding="utf-8"), ".. document: ")
    held = [d for d in docs if d[0].startswith("library/") and d[0].split("/", 1)[1][:1].lower() >= "s"]
    alpaca = json.loads((shared / "alpaca_en_demo.json").read_text())
    return {
        "shakespeare_train": shakespeare[:cut],
        "shakespeare_held": shakespeare[cut:],
        "code_train": "".join(m[1] for m in modules[: last_train + 1]),
        "code_held": "".join(m[1] for m in modules[last_train + 1 :]),
        "docs_train": "".join(d[1] for d in docs if d not in held),
        "docs_held": "".join(d[1] for d in held),
        "alpaca_train": alpaca[:900],
        "alpaca_val": alpaca[900:],
    }
