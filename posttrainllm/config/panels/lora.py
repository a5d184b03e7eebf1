"""Options of the panel: LoRA adapters."""

from __future__ import annotations

from posttrainllm.config.checks import (
    fraction_below_one,
    positive,
    positive_int,
)
from posttrainllm.config.opt import Opt
from posttrainllm.spec import POST_TRAINING

LORA: tuple[Opt, ...] = (
    Opt(
        name="lora_r",
        type=int,
        default=None,
        help="Train LoRA adapters of this rank instead of all weights (needs `pip install peft`).",
        commands=POST_TRAINING,
        check=positive_int,
        metavar="R",
        panel="LoRA",
    ),
    Opt(
        name="lora_alpha",
        type=float,
        default=None,
        help="LoRA alpha (default 2×r).",
        commands=POST_TRAINING,
        check=positive,
        metavar="FLOAT",
        panel="LoRA",
    ),
    Opt(
        name="lora_dropout",
        type=float,
        default=0.0,
        help="LoRA dropout.",
        commands=POST_TRAINING,
        check=fraction_below_one,
        metavar="FLOAT",
        panel="LoRA",
    ),
    Opt(
        name="lora_targets",
        type=str,
        default="all-linear",
        help="Comma-separated module names for LoRA (e.g. q_proj,v_proj) or all-linear.",
        commands=POST_TRAINING,
        metavar="NAMES",
        panel="LoRA",
    ),
)

PANEL, ORDER = LORA, 50  # this panel's options, and its place in the help (config/panels/__init__.py)
