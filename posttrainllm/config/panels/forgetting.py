"""Options of the panel: measuring and limiting forgetting."""

from __future__ import annotations

from posttrainllm.config.checks import (
    LANGUAGE_MODELS,
    fraction_below_one,
)
from posttrainllm.config.opt import Opt

FORGETTING: tuple[Opt, ...] = (
    Opt(
        name="ood_eval",
        type=list,
        default=[],
        help="Text file whose perplexity is measured before and after training (repeatable).",
        commands=LANGUAGE_MODELS,
        metavar="FILE",
        panel="Forgetting",
    ),
    Opt(
        name="train_on_prompt",
        type=bool,
        default=False,
        help="Put the SFT loss on every token: system and user turns and role "
        "headers of conversations, the prompt of prompt/completion rows "
        "(default: the assistant's words only).",
        commands=("sft",),
    ),
    Opt(
        name="replay_dataset",
        type=str,
        default=None,
        help="Pre-training-style text mixed into the training data against forgetting.",
        commands=("sft", "finetune"),
        metavar="FILE",
        panel="Forgetting",
    ),
    Opt(
        name="replay_ratio",
        type=float,
        default=0.0,
        help="Fraction of training rows taken from --replay-dataset.",
        commands=("sft", "finetune"),
        check=fraction_below_one,
        metavar="FRACTION",
        panel="Forgetting",
    ),
)
