"""CLI start-up: wall time of `posttrainllm sft --help` vs `trl sft --help` (and `posttrainllm --help`).

    python bench/startup.py [--quick] [--json] [--reps N]

Each command runs as a fresh subprocess (so each pays its own imports), the commands rotated between
repetitions; one untimed run of each first warms the OS file cache. Reported: median wall time per command and
the median of the per-repetition ratios posttrainllm/TRL. Targets: `posttrainllm sft --help` ≤ 1 s and ≤ 0.1×
`trl sft --help`. Also reports `python -X importtime` top entries of `posttrainllm sft --help` (what it imports).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import VENV_BIN, alternate, base_parser, emit, log, machine_info, median, ratios, run_cmd, spread  # noqa: E402


def exe(name: str) -> str:
    cand = VENV_BIN / name
    return str(cand) if cand.exists() else (shutil.which(name) or name)


def importtime_top(argv: list[str], k: int = 12) -> list[tuple[str, float]]:
    """Top-level packages by cumulative import time (`python -X importtime`), in seconds."""
    _, proc = run_cmd([sys.executable, "-X", "importtime", *argv])
    cum: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+\d+\s+\|\s+(\d+)\s+\|( *)(\S+)", line)
        if m and len(m.group(2)) <= 1:  # top-level imports only
            cum[m.group(3)] = cum.get(m.group(3), 0.0) + int(m.group(1)) / 1e6
    return sorted(cum.items(), key=lambda kv: -kv[1])[:k]


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    a = p.parse_args()
    reps = a.reps or (5 if a.quick else 11)
    cmds = {
        "posttrainllm sft --help": [exe("posttrainllm"), "sft", "--help"],
        "posttrainllm --help": [exe("posttrainllm"), "--help"],
        "trl sft --help": [exe("trl"), "sft", "--help"],
    }
    for argv in cmds.values():  # warm the file cache; also fails early if a command is broken
        run_cmd(argv)

    def runner(argv):
        return lambda: run_cmd(argv)[0]

    log(f"{reps} rotated repetitions of {len(cmds)} commands ...")
    res = alternate({k: runner(v) for k, v in cmds.items()}, reps)
    r = ratios(res, "posttrainllm sft --help", "trl sft --help")
    med = {k: median(v) for k, v in res.items()}
    result = {
        "machine": machine_info(torch_needed=False),
        "argv": sys.argv[1:],
        "reps": reps,
        "wall_s": med,
        "wall_min_max_s": {k: spread(v) for k, v in res.items()},
        "raw": res,
        "ratio_posttrainllm_sft_over_trl_sft": median(r),
        "ratio_min_max": spread(r),
        "target_le_1s": med["posttrainllm sft --help"] <= 1.0,
        "target_le_0.1x": median(r) <= 0.1,
    }
    top = importtime_top(["-m", "posttrainllm", "sft", "--help"])
    result["importtime_top_posttrainllm_sft_help"] = top
    lines = [f"CLI start-up, median of {reps} rotated repetitions (fresh subprocess each)"]
    for k, v in med.items():
        lo, hi = spread(res[k])
        lines.append(f"  {k:26s} {v:6.3f} s  (min {lo:.3f}, max {hi:.3f})")
    lines.append(
        f"  ratio posttrainllm sft --help / trl sft --help: {median(r):.3f} (min {min(r):.3f}, max {max(r):.3f})"
    )
    lines.append(
        f"  targets: ≤ 1 s {'met' if result['target_le_1s'] else 'NOT met'}; ≤ "
        f"0.1× {'met' if result['target_le_0.1x'] else 'NOT met'}"
    )
    lines.append(
        "  python -X importtime -m posttrainllm sft --help, top-level imports (cumulative s): "
        + ", ".join(f"{n} {t:.3f}" for n, t in top[:8])
    )
    m = result["machine"]
    lines.append(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), python {m['python']}, load "
        f"at start {m.get('loadavg_at_start')}, {m['date']}"
    )
    emit(result, a.json, "\n".join(lines))


if __name__ == "__main__":
    main()
