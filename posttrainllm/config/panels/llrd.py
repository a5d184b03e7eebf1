"""Options of the panel: layer-wise LR decay and LR factors."""

from __future__ import annotations

import math

from posttrainllm.config.checks import (
    LLRD_BARE,
    LLRD_MAX,
    LLRD_MIN,
    LLRD_RANGE,
    bottom_scale,
    llrd_range,
    lr_factor,
    non_negative,
    one_of,
    positive,
    unit_interval,
)
from posttrainllm.config.opt import Opt
from posttrainllm.constants import DEFAULT_TIED_POLICY, TIED_POLICIES
from posttrainllm.spec import POST_TRAINING, TRAINING


def vision_llrd_range(v):
    """γ_v in the same range as --llrd's γ."""
    if not math.isfinite(v) or not (LLRD_MIN <= v <= LLRD_MAX):
        return f"must be a number in {LLRD_RANGE} (1.0 = no decay of the vision tower)"
    return None


LLRD: tuple[Opt, ...] = (
    Opt(
        name="llrd",
        type=float,
        default=1.0,
        help=f"Layer-wise LR decay γ in {LLRD_RANGE}: block i of N trains at "
        f"lr×γ^(N-1-i). Absent: 1.0 (flat). Bare --llrd: {LLRD_BARE}.",
        commands=TRAINING,
        check=llrd_range,
        metavar="[GAMMA]",
        bare=LLRD_BARE,
        panel="Layer-wise LR decay",
        deprecated=("lr_layer_decay",),  # pretrain's name for it until 0.1: still read, not shown (decision 39)
    ),
    Opt(
        name="llrd_bottom_scale",
        type=float,
        default=0.0,
        help="Layer decay given by block 0's LR scale S instead of γ: γ = S^(1/(N-1)) "
        f"for the model's N blocks (γ must land in {LLRD_RANGE}). Carries one "
        "setting across depths; not with --llrd.",
        commands=TRAINING,
        check=bottom_scale,
        metavar="S",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="llrd_min_scale",
        type=float,
        default=0.0,
        help="Clamp: no block trains below lr×SCALE.",
        commands=TRAINING,
        check=unit_interval,
        metavar="SCALE",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="llrd_freeze_below",
        type=float,
        default=0.0,
        help="Freeze parameters whose LR scale is below SCALE (no optimizer state).",
        commands=TRAINING,
        check=unit_interval,
        metavar="SCALE",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="llrd_blocks",
        type=str,
        default=None,
        help="Dotted path of the decoder block list when it cannot be found (e.g. model.layers).",
        commands=TRAINING,
        metavar="PATH",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="vision_llrd",
        type=float,
        default=None,
        help=f"Vision-language models: layer decay γ_v in {LLRD_RANGE} of the vision tower, over its own M blocks: "
        "vision block j trains at lr×γ_v^(M-1-j) (its embeddings at block 0's LR). Absent: --llrd's γ.",
        commands=POST_TRAINING,
        check=vision_llrd_range,
        metavar="GAMMA",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="projector_lr_scale",
        type=float,
        default=None,
        help="Vision-language models: the projector (aligner between the vision tower and the decoder) trains at "
        "lr×SCALE. Absent: 1; 0 freezes it.",
        commands=POST_TRAINING,
        check=non_negative,
        metavar="SCALE",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="freeze_vision",
        type=bool,
        default=False,
        help="Vision-language models: freeze the vision tower (no optimizer state; the projector and the decoder "
        "train).",
        commands=POST_TRAINING,
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="vision_blocks",
        type=str,
        default=None,
        help="Dotted path of the vision tower's block list when it cannot be found (e.g. "
        "model.vision_tower.encoder.layers).",
        commands=POST_TRAINING,
        metavar="PATH",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="lr_groups",
        type=dict,
        default={},
        help="Multiply the LR of parameters whose name matches the regex PATTERN by "
        "FACTOR, on top of their depth's scale: lr = base × γ^(N-1-i) × FACTOR "
        "(repeatable; FACTOR 0 freezes; recipe key lr_groups: a mapping).",
        commands=TRAINING,
        check=lr_factor,
        metavar="PATTERN=FACTOR",
        flag="--lr-group",
        panel="Layer-wise LR decay",
    ),
    Opt(
        name="loraplus_ratio",
        type=float,
        default=1.0,
        help="LoRA+: train LoRA B matrices at RATIO × their block's LR (A matrices "
        "at 1×); needs --lora-r. LoRA+ suggests 16.",
        commands=POST_TRAINING,
        check=positive,
        metavar="RATIO",
        panel="LoRA",
    ),
    Opt(
        name="tied_embeddings",
        type=str,
        default=DEFAULT_TIED_POLICY,
        help="LR of a tied input/output embedding matrix: 'embedding' (decayed like block 0; the default, measured on "
        "a real model) or 'head' (the base LR).",
        commands=TRAINING,
        check=one_of(TIED_POLICIES),
        metavar="POLICY",
        panel="Layer-wise LR decay",
    ),
)

PANEL, ORDER = LLRD, 20  # this panel's options, and its place in the help (config/panels/__init__.py)
