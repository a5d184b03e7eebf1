"""The sweep's grid: its options, the cells (γ × LR × replay ratio × KL anchor β × self-replay N × seed), each
cell's command line, checked before anything runs (posttrainllm/config/argv.py reads each cell as the CLI would),
and the merges measured for every trained cell (no training: `posttrainllm merge` toward the base)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from posttrainllm.commands.registry import SPECS, not_an_option, options_for, to_config
from posttrainllm.errors import ConfigErrors, PosttrainError, UsageError

SWEEP_COMMANDS = tuple(name for name, s in SPECS.items() if s.sweep)  # the specs that say so (sft, sdft, dpo...)
# a command whose training is a forgetting method of its own, by its frontier label (its spec's `method`)
METHOD_OF_COMMAND = {name: s.method for name, s in SPECS.items() if s.method}
# --loss-type is an axis (nll, dft) where it names sft's loss (the option sft_loss_type); dpo's passes through
LOSS_TYPE_COMMANDS = tuple(name for name in SWEEP_COMMANDS if any(o.name == "sft_loss_type" for o in options_for(name)))
NEAR_BEST = 0.01  # "within 1% of the best eval loss"
EVAL_CACHE_FLAG = "--eval-cache"  # set by the sweep for its cells and merges; not part of a cell's identity


@dataclass(frozen=True)
class Cell:
    gamma: float
    lr: float
    replay_ratio: float
    seed: int
    kl_to_base: float = 0.0
    self_replay: int = 0
    loss_type: str = "nll"  # sft's --loss-type: nll (cross-entropy) or dft

    @property
    def name(self) -> str:
        """The cell's folder; the newer axes appear only when set, so the cells of older sweeps keep their names."""
        extra = (f"-kl{self.kl_to_base:g}" if self.kl_to_base else "") + (
            f"-selfreplay{self.self_replay}" if self.self_replay else ""
        )
        extra += f"-{self.loss_type}" if self.loss_type != "nll" else ""
        return f"g{self.gamma:g}-lr{self.lr:g}-replay{self.replay_ratio:g}{extra}-s{self.seed}"

    @property
    def point(self) -> tuple:
        return (self.gamma, self.lr, self.replay_ratio, self.kl_to_base, self.self_replay, self.loss_type)


def method_label(
    gamma: float,
    replay_ratio: float,
    kl_to_base: float,
    self_replay: int,
    merge: str | None,
    loss_type: str = "nll",
    command: str = "sft",
) -> str:
    """The forgetting-control method of a frontier point, in words: "flat", "γ=0.9 + replay 0.25", "flat + KL
    β=0.1", "flat + self-replay 256 @0.25", "DFT flat + KL β=0.5" (sft --loss-type dft; with the KL anchor, the
    ASFT form), "SDFT γ=0.9" (an sdft cell), "merge α=0.5 of flat"."""
    parts = ["flat" if gamma == 1.0 else f"γ={gamma:g}"]
    objective = METHOD_OF_COMMAND.get(command) or ("DFT" if loss_type == "dft" else None)
    if objective:
        parts[0] = f"{objective} {parts[0]}"
    if self_replay:
        parts.append(f"self-replay {self_replay} @{replay_ratio:g}")
    elif replay_ratio:
        parts.append(f"replay {replay_ratio:g}")
    if kl_to_base:
        parts.append(f"KL β={kl_to_base:g}")
    trained = " + ".join(parts)
    return f"{merge} of {trained}" if merge else trained


@dataclass(frozen=True)
class Merge:
    """A merge of a trained cell back toward the base: θ = θ_base + s·(θ_cell − θ_base), s = α (uniform) or
    α·γ^(N-1-i) at block i (depth-scaled: layer decay after training)."""

    alpha: float
    gamma: float = 1.0

    @property
    def name(self) -> str:
        return f"merge-a{self.alpha:g}" + (f"-g{self.gamma:g}" if self.gamma != 1.0 else "")

    @property
    def label(self) -> str:
        return f"merge α={self.alpha:g}" + (f" depth γ={self.gamma:g}" if self.gamma != 1.0 else "")

    def args(self) -> list[str]:
        return ["--alpha", f"{self.alpha:g}"] + (["--llrd", f"{self.gamma:g}"] if self.gamma != 1.0 else [])


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
    kl_values: list[float] = field(default_factory=lambda: [0.0])
    self_replays: list[int] = field(default_factory=lambda: [0])
    loss_types: list[str] = field(default_factory=lambda: ["nll"])
    merge_alphas: list[float] = field(default_factory=list)
    merge_gammas: list[float] = field(default_factory=lambda: [1.0])
    dry_run: bool = False  # list the cells and merges (done or to run) and their command lines; run and write nothing
    budget_points: bool = False  # --max-forgetting given, with --eval-dataset and --ood-eval: cells' budgeted merges

    def cells(self) -> list[Cell]:
        """Every combination, less those that mean nothing: self-replay with nothing mixed in (a replay ratio of 0),
        and a replay ratio above 0 without self-replay when no --replay-dataset is given."""
        has_pool = _value(self.passthrough, "--replay-dataset") is not None
        return [
            Cell(g, lr, r, s, kl, n, loss)
            for g in self.gammas
            for lr in self.lrs
            for r in self.replay_ratios
            for kl in self.kl_values
            for n in self.self_replays
            for loss in self.loss_types
            for s in self.seeds
            if not (n and r == 0) and not (r and not n and not has_pool and any(self.self_replays))
        ]

    @property
    def eval_cache(self) -> Path:
        """Where every cell and merge of the sweep finds the base's held-out evaluation (scored once per text)."""
        return self.output_dir / "base_eval"

    def measures_merges(self) -> bool:
        """Whether trained cells are merged back toward the base (--merge-alpha, or the budgeted point per cell)."""
        return bool(self.merges()) or self.budget_points

    def merges(self) -> list[Merge]:
        """The merges measured for every trained cell (α = 1 with γ = 1 is the cell itself and is not repeated)."""
        return [Merge(a, g) for a in self.merge_alphas for g in self.merge_gammas if (a, g) != (1.0, 1.0)]

    def argv(self, cell: Cell) -> list[str]:
        """The cell's command line. A replay ratio of 0 means no replay, so --replay-dataset is left out; a
        self-replay cell replays its own samples, so it is left out there too."""
        passthrough = list(self.passthrough)
        if cell.replay_ratio == 0 or cell.self_replay:
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
        if _value(self.passthrough, "--ood-eval") is not None and _value(self.passthrough, "--eval-cache") is None:
            args += [EVAL_CACHE_FLAG, str(self.eval_cache)]
        if cell.gamma != 1.0:
            args += ["--llrd", f"{cell.gamma:g}"]
        if cell.replay_ratio > 0:
            args += ["--replay-ratio", f"{cell.replay_ratio:g}"]
        if cell.kl_to_base:
            args += ["--kl-to-base", f"{cell.kl_to_base:g}"]
        if cell.self_replay:
            args += ["--self-replay", str(cell.self_replay)]
        if cell.loss_type != "nll":
            args += ["--loss-type", cell.loss_type]
        return args


# ------------------------------------------------------------------------------------------------ parsing
_SWEEP_OPTIONS = {
    "--llrd": "gammas",
    "--lr": "lrs",
    "--replay-ratio": "replay_ratios",
    "--kl-to-base": "kl_values",
    "--self-replay": "self_replays",
    "--merge-alpha": "merge_alphas",
    "--merge-llrd": "merge_gammas",
    "--seeds": "seeds",
    "--seed": "seeds",
    "--jobs": "jobs",
    "--max-forgetting": "max_forgetting",
    "--output-dir": "output_dir",
}


# the sweep's axes that are options of the command as well: a command that does not take one refuses it here
_COMMAND_AXES = ("--llrd", "--lr", "--replay-ratio", "--kl-to-base", "--self-replay", "--seed")
LOSS_TYPES = ("nll", "dft")  # sft's --loss-type values (TRL's SFTConfig.loss_type)


def _loss_types(text: str) -> list[str]:
    values = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [v for v in values if v not in LOSS_TYPES]
    if bad or not values:
        raise UsageError(f"--loss-type: expected a comma-separated list of {', '.join(LOSS_TYPES)}, got {text!r}")
    return values


def _numbers(flag: str, text: str, kind=float) -> list:
    """The distinct values of a comma list. Two values that are written alike in a cell's folder and command line
    (`%g`: 6 significant digits) are refused: they would be one cell, or one merge, twice."""
    tokens = [x.strip() for x in text.split(",") if x.strip()]
    try:
        values = [kind(x) for x in tokens]
    except ValueError:
        raise UsageError(f"{flag}: expected a comma-separated list of numbers, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag}: expected a comma-separated list of numbers, got {text!r}")
    seen: dict[str, tuple[str, float]] = {}
    for tok, v in zip(tokens, values):
        shown = f"{v:g}"
        if shown in seen and seen[shown][1] != v:
            raise UsageError(
                f"{flag}: {seen[shown][0]} and {tok} are both written {shown} in a cell's folder and command line; "
                "give values that differ within 6 significant digits"
            )
        seen.setdefault(shown, (tok, v))
    return list(dict.fromkeys(values))


def _one(flag: str, text: str, kind=float):
    """The value of an option that takes one number (not a list)."""
    if "," in text:
        raise UsageError(f"{flag} takes one number, not a list: got {text!r}")
    return _numbers(flag, text, kind)[0]


def parse(command: str, args: list[str]) -> SweepSpec:
    """Split the sweep's own options (comma lists) from the command's options; validate every cell's config."""
    if command not in SWEEP_COMMANDS:
        raise UsageError(f"sweep COMMAND must be one of {', '.join(SWEEP_COMMANDS)}, got {command!r}")
    found: dict[str, str] = {}
    passthrough: list[str] = []
    discard = dry_run = False
    i = 0
    while i < len(args):
        tok = args[i]
        flag, eq, inline = tok.partition("=")
        if flag == "--loss-type" and command in LOSS_TYPE_COMMANDS:  # an axis: sft's nll and/or dft
            if not eq and i + 1 >= len(args):
                raise UsageError(f"{flag} needs a value")
            found["loss_types"] = inline if eq else args[i + 1]
            i += 1 if eq else 2
            continue
        if flag in _SWEEP_OPTIONS:
            reason = not_an_option(command, flag) if flag in _COMMAND_AXES else None
            if reason:
                raise UsageError(reason)
            if eq:
                value = inline
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 1
            else:
                raise UsageError(f"{flag} needs a value")
            found[_SWEEP_OPTIONS[flag]] = value
        elif tok == "--discard-weights":
            discard = True
        elif tok == "--dry-run":
            dry_run = True
        elif tok in ("--overwrite", "--resume"):
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
        jobs = _one("--jobs", found.get("jobs", "1"), int)
        max_forgetting = _one("--max-forgetting", found.get("max_forgetting", "5"))
        kl_values = _numbers("--kl-to-base", found.get("kl_values", "0"))
        self_replays = _numbers("--self-replay", found.get("self_replays", "0"), int)
        merge_alphas = _numbers("--merge-alpha", found["merge_alphas"]) if "merge_alphas" in found else []
        merge_gammas = _numbers("--merge-llrd", found.get("merge_gammas", "1.0"))
        loss_types = _loss_types(found.get("loss_types", "nll"))
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
    problems += _check_merges(merge_alphas, merge_gammas, "merge_gammas" in found, passthrough)
    if any(n > 0 for n in self_replays) and all(r == 0 for r in replay):
        problems.append("--self-replay above 0 needs a --replay-ratio above 0 (the share of the samples in training)")
    model = _value(passthrough, "--model")
    out = Path(found.get("output_dir") or f"runs/sweep-{command}-{Path((model or 'model').rstrip('/')).name}")
    spec = SweepSpec(
        command, gammas, lrs, replay, seeds, jobs, max_forgetting, out, passthrough, discard,
        kl_values=kl_values, self_replays=self_replays, merge_alphas=merge_alphas, merge_gammas=merge_gammas,
        dry_run=dry_run, loss_types=loss_types,
        budget_points="max_forgetting" in found and _measured_on_files(passthrough),
    )  # fmt: skip
    problems += _check_cells(spec)
    if problems:
        raise ConfigErrors(list(dict.fromkeys(problems)))
    return spec


def _measured_on_files(passthrough: list[str]) -> bool:
    """Whether a merge of a cell can be measured: an --eval-dataset file (its in-domain loss) and an --ood-eval."""
    return _value(passthrough, "--eval-dataset") is not None and _value(passthrough, "--ood-eval") is not None


def _check_merges(alphas: list[float], gammas: list[float], gammas_given: bool, passthrough: list[str]) -> list[str]:
    problems = []
    if alphas and _value(passthrough, "--eval-dataset") is None:
        problems.append(
            "--merge-alpha needs --eval-dataset FILE: every merge's in-domain loss is measured on it "
            "(the rows --eval-split takes are not a file)"
        )
    if any(not (0.0 <= a <= 1.0) for a in alphas):
        problems.append(f"--merge-alpha values must lie in [0, 1] (1 = the trained cell, 0 = the base), got {alphas}")
    if any(not (0.5 <= g <= 1.0) for g in gammas):
        problems.append(f"--merge-llrd values must lie in [0.5, 1.0] (the depth scaling of a merge), got {gammas}")
    if gammas_given and not alphas:
        problems.append("--merge-llrd needs --merge-alpha (the merge's top-block scale), e.g. --merge-alpha 1.0,0.5")
    return problems


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
    problems: list[str] = []
    distinct = {dataclasses.replace(c, seed=spec.seeds[0]) for c in spec.cells()}
    for cell in sorted(distinct, key=lambda c: c.name):
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
        if cell.replay_ratio > 0 and not cfg.replay_dataset and not cell.self_replay:
            problems.append("--replay-ratio above 0 needs --replay-dataset FILE")
    return problems
