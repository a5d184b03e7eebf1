"""Options of the panel: layer-wise LR decay and LR factors."""

from __future__ import annotations

from posttrainllm.config.checks import (
    LLRD_BARE,
    LLRD_RANGE,
    POST_TRAINING,
    TRAINING,
    bottom_scale,
    llrd_range,
    lr_factor,
    one_of,
    positive,
    unit_interval,
)
from posttrainllm.config.opt import Opt
from posttrainllm.constants import DEFAULT_TIED_POLICY, TIED_POLICIES

LLRD: tuple[Opt, ...] = (
    Opt(
        "llrd",
        float,
        1.0,
        f"Layer-wise LR decay γ in {LLRD_RANGE}: block i of N trains at "
        f"lr×γ^(N-1-i). Absent: 1.0 (flat). Bare --llrd: {LLRD_BARE}.",
        TRAINING,
        llrd_range,
        "[GAMMA]",
        bare=LLRD_BARE,
        panel="Layer-wise LR decay",
        deprecated=("lr_layer_decay",),  # pretrain's name for it until 0.1: still read, not shown (decision 39)
    ),
    Opt(
        "llrd_bottom_scale",
        float,
        0.0,
        "Layer decay given by block 0's LR scale S instead of γ: γ = S^(1/(N-1)) "
        f"for the model's N blocks (γ must land in {LLRD_RANGE}). Carries one "
        "setting across depths; not with --llrd.",
        TRAINING,
        bottom_scale,
        "S",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "llrd_min_scale",
        float,
        0.0,
        "Clamp: no block trains below lr×SCALE.",
        TRAINING,
        unit_interval,
        "SCALE",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "llrd_freeze_below",
        float,
        0.0,
        "Freeze parameters whose LR scale is below SCALE (no optimizer state).",
        TRAINING,
        unit_interval,
        "SCALE",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "llrd_blocks",
        str,
        None,
        "Dotted path of the decoder block list when it cannot be found (e.g. model.layers).",
        TRAINING,
        metavar="PATH",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "lr_groups",
        dict,
        {},
        "Multiply the LR of parameters whose name matches the regex PATTERN by "
        "FACTOR, on top of their depth's scale: lr = base × γ^(N-1-i) × FACTOR "
        "(repeatable; FACTOR 0 freezes; recipe key lr_groups: a mapping).",
        TRAINING,
        lr_factor,
        "PATTERN=FACTOR",
        flag="--lr-group",
        panel="Layer-wise LR decay",
    ),
    Opt(
        "loraplus_ratio",
        float,
        1.0,
        "LoRA+: train LoRA B matrices at RATIO × their block's LR (A matrices "
        "at 1×); needs --lora-r. LoRA+ suggests 16.",
        POST_TRAINING,
        positive,
        "RATIO",
        panel="LoRA",
    ),
    Opt(
        "tied_embeddings",
        str,
        DEFAULT_TIED_POLICY,
        "LR of a tied input/output embedding matrix: 'embedding' (decayed like block 0; the default, measured on a "
        "real model) or 'head' (the base LR).",
        TRAINING,
        one_of(TIED_POLICIES),
        "POLICY",
        panel="Layer-wise LR decay",
    ),
)
