"""Options of the panel: LoRA adapters."""

from __future__ import annotations

from posttrainllm.config.checks import (
    POST_TRAINING,
    fraction_below_one,
    positive,
    positive_int,
)
from posttrainllm.config.opt import Opt

LORA: tuple[Opt, ...] = (
    Opt(
        "lora_r",
        int,
        None,
        "Train LoRA adapters of this rank instead of all weights (needs `pip install peft`).",
        POST_TRAINING,
        positive_int,
        "R",
        panel="LoRA",
    ),
    Opt("lora_alpha", float, None, "LoRA alpha (default 2×r).", POST_TRAINING, positive, "FLOAT", panel="LoRA"),
    Opt("lora_dropout", float, 0.0, "LoRA dropout.", POST_TRAINING, fraction_below_one, "FLOAT", panel="LoRA"),
    Opt(
        "lora_targets",
        str,
        "all-linear",
        "Comma-separated module names for LoRA (e.g. q_proj,v_proj) or all-linear.",
        POST_TRAINING,
        metavar="NAMES",
        panel="LoRA",
    ),
)
