"""The sweep's grid: its options, the cells (γ × LR × replay ratio × seed), each cell's command line, checked
before anything runs (posttrainllm/config/argv.py reads each cell as the CLI would)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from posttrainllm.errors import ConfigErrors, PosttrainError, UsageError

SWEEP_COMMANDS = ("sft", "dpo", "finetune")
NEAR_BEST = 0.01  # "within 1% of the best eval loss"


@dataclass(frozen=True)
class Cell:
    gamma: float
    lr: float
    replay_ratio: float
    seed: int

    @property
    def name(self) -> str:
        return f"g{self.gamma:g}-lr{self.lr:g}-replay{self.replay_ratio:g}-s{self.seed}"

    @property
    def point(self) -> tuple[float, float, float]:
        return (self.gamma, self.lr, self.replay_ratio)


@dataclass
class SweepSpec:
    command: str
    gammas: list[float]
    lrs: list[float]
    replay_ratios: list[float]
    seeds: list[int]
    jobs: int
    max_forgetting: float
    output_dir: Path
    passthrough: list[str]  # the command's own options, the same for every cell
    discard_weights: bool = False

    def cells(self) -> list[Cell]:
        return [
            Cell(g, lr, r, s) for g in self.gammas for lr in self.lrs for r in self.replay_ratios for s in self.seeds
        ]

    def argv(self, cell: Cell) -> list[str]:
        """The cell's command line. A replay ratio of 0 means no replay, so --replay-dataset is left out."""
        passthrough = list(self.passthrough)
        if cell.replay_ratio == 0:
            passthrough = _without(passthrough, "--replay-dataset")
        args = [
            self.command,
            *passthrough,
            "--lr",
            f"{cell.lr:g}",
            "--seed",
            str(cell.seed),
            "--output-dir",
            str(self.output_dir / "cells" / cell.name),
        ]
        if cell.gamma != 1.0:
            args += ["--llrd", f"{cell.gamma:g}"]
        if cell.replay_ratio > 0:
            args += ["--replay-ratio", f"{cell.replay_ratio:g}"]
        return args


# ------------------------------------------------------------------------------------------------ parsing
_SWEEP_OPTIONS = {
    "--llrd": "gammas",
    "--lr": "lrs",
    "--replay-ratio": "replay_ratios",
    "--seeds": "seeds",
    "--seed": "seeds",
    "--jobs": "jobs",
    "--max-forgetting": "max_forgetting",
    "--output-dir": "output_dir",
}


def _numbers(flag: str, text: str, kind=float) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected a comma-separated list of numbers, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag}: expected a comma-separated list of numbers, got {text!r}")
    return list(dict.fromkeys(values))


def parse(command: str, args: list[str]) -> SweepSpec:
    """Split the sweep's own options (comma lists) from the command's options; validate every cell's config."""
    if command not in SWEEP_COMMANDS:
        raise UsageError(f"sweep COMMAND must be one of {', '.join(SWEEP_COMMANDS)}, got {command!r}")
    found: dict[str, str] = {}
    passthrough: list[str] = []
    discard = False
    i = 0
    while i < len(args):
        tok = args[i]
        flag, eq, inline = tok.partition("=")
        if flag in _SWEEP_OPTIONS:
            if eq:
                value = inline
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 1
            else:
                raise UsageError(f"{flag} needs a value")
            found[_SWEEP_OPTIONS[flag]] = value
        elif tok == "--discard-weights":
            discard = True
        elif tok in ("--overwrite", "--resume", "--dry-run"):
            raise UsageError(f"{tok} is not available in a sweep: cells are skipped when done and re-run otherwise")
        else:
            passthrough.append(tok)
        i += 1
    problems = []
    try:
        gammas = _numbers("--llrd", found.get("gammas", "1.0"))
        lrs = _numbers("--lr", found["lrs"]) if "lrs" in found else None
        replay = _numbers("--replay-ratio", found.get("replay_ratios", "0"))
        seeds = _numbers("--seeds", found.get("seeds", "0"), int)
        jobs = _numbers("--jobs", found.get("jobs", "1"), int)[0]
        max_forgetting = _numbers("--max-forgetting", found.get("max_forgetting", "5"))[0]
    except UsageError as e:
        raise ConfigErrors([str(e)]) from None
    if lrs is None:
        problems.append("--lr: give the LRs to sweep, e.g. --lr 1e-5,2e-5,5e-5")
        lrs = [2e-5]
    if jobs < 1:
        problems.append(f"--jobs must be >= 1, got {jobs}")
    if not math.isfinite(max_forgetting):
        problems.append("--max-forgetting must be a finite number (percent)")
    if any(s < 0 for s in seeds):
        problems.append("--seeds must be non-negative integers")
    model = _value(passthrough, "--model")
    out = Path(found.get("output_dir") or f"runs/sweep-{command}-{Path((model or 'model').rstrip('/')).name}")
    spec = SweepSpec(command, gammas, lrs, replay, seeds, jobs, max_forgetting, out, passthrough, discard)
    problems += _check_cells(spec)
    if problems:
        raise ConfigErrors(list(dict.fromkeys(problems)))
    return spec


def _without(args: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for tok in args:
        if skip:
            skip = False
        elif tok == flag:
            skip = True
        elif not tok.startswith(flag + "="):
            out.append(tok)
    return out


def _value(args: list[str], flag: str) -> str | None:
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            return args[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def _check_cells(spec: SweepSpec) -> list[str]:
    """Each distinct cell configuration goes through the command's own validation (all problems, no model load)."""
    from posttrainllm.config.argv import to_config

    problems: list[str] = []
    for cell in {Cell(c.gamma, c.lr, c.replay_ratio, spec.seeds[0]) for c in spec.cells()}:
        argv = spec.argv(cell)
        try:
            cfg = to_config(spec.command, list(argv[1:]))
        except ConfigErrors as e:
            problems += e.problems
            continue
        except PosttrainError as e:  # an unknown option, a missing value
            problems.append(str(e))
            continue
        if not (cfg.eval_split or cfg.eval_dataset):
            problems.append("a sweep needs an in-domain eval set: give --eval-split FRACTION or --eval-dataset FILE")
        if not cfg.ood_eval:
            problems.append("a sweep needs at least one --ood-eval FILE to measure forgetting")
        if cell.replay_ratio > 0 and not cfg.replay_dataset:
            problems.append("--replay-ratio above 0 needs --replay-dataset FILE")
    return problems
