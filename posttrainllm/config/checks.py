"""The option checks and the value sets they use. Each check returns None when fine, or the problem text
("must be ..."). Imports no torch/transformers."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from posttrainllm.errors import shorten
from posttrainllm.rewards import pattern_problem, spec_problem

LLRD_MIN, LLRD_MAX = 0.5, 1.0
LLRD_BARE = 0.95  # value of a bare `--llrd` (no number)
LLRD_RANGE = f"[{LLRD_MIN}, {LLRD_MAX}]"

SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "warmup_stable_decay",
)
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# DPOTrainer's loss types in the installed TRL (1.16), in its order; tests/cli/test_dpo_losses.py checks this list
# equals the branches of DPOTrainer's loss, so a TRL that adds or drops one fails there rather than here at run time.
DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
)
SFT_LOSS_TYPES = ("nll", "dft")  # SFTConfig.loss_type: cross-entropy, Dynamic Fine-Tuning
REPORT_TO = ("none", "tensorboard", "wandb", "trackio", "all")


# checks: each returns None when fine, or the problem text ("must be ...")
def _finite(v: float) -> str | None:
    return None if math.isfinite(v) else "must be a finite number"


def positive(v):
    return _finite(v) or (None if v > 0 else "must be > 0")


def non_negative(v):
    return _finite(v) or (None if v >= 0 else "must be >= 0")


def unit_interval(v):
    return _finite(v) or (None if 0 <= v <= 1 else "must be in [0, 1]")


def bottom_scale(v):
    return _finite(v) or (None if 0 < v <= 1 else "must be in (0, 1]: block 0's LR as a fraction of the base LR")


def fraction_below_one(v):
    return _finite(v) or (None if 0 <= v < 1 else "must be in [0, 1)")


def llrd_range(v):
    if not math.isfinite(v) or not (LLRD_MIN <= v <= LLRD_MAX):
        return f"must be a number in {LLRD_RANGE} (1.0 = no decay; bare --llrd = {LLRD_BARE})"
    return None


def seed_range(v):
    return None if 0 <= v < 2**32 else "must be an integer in [0, 2**32 - 1]"


def lr_factor(item):
    pattern, factor = item
    try:
        re.compile(pattern)
    except re.error as e:
        return f"pattern {shorten(pattern, 60)!r} is not a valid regular expression ({e})"
    return (
        None
        if math.isfinite(factor) and factor >= 0
        else f"factor of {shorten(pattern, 60)!r} must be a finite number >= 0 (0 freezes)"
    )


def reward_pattern(v):
    return pattern_problem(v)  # the engine the rewards match with (the `regex` package, time-bounded)


def reward_fn_spec(v):
    return spec_problem(v)  # the form only: nothing of the user's is imported here


def at_least_two(v):
    return None if v >= 2 else "must be 2 or more (the rewards of a group of completions are compared)"


def positive_int(v):
    return None if v > 0 else "must be a positive integer"


def non_negative_int(v):
    return None if v >= 0 else "must be an integer >= 0 (0 = off)"


def steps(v):
    return None if v == -1 or v > 0 else "must be a positive integer (or -1 for 'use --epochs')"


def one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    def check(v):
        return None if v in choices else f"must be one of: {', '.join(choices)}"

    return check
