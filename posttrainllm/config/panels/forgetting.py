"""Options of the panel: measuring and limiting forgetting."""

from __future__ import annotations

from posttrainllm.config.checks import (
    LANGUAGE_MODELS,
    fraction_below_one,
)
from posttrainllm.config.opt import PATH, Opt

FORGETTING: tuple[Opt, ...] = (
    Opt(
        "ood_eval",
        list,
        [],
        "Text file whose perplexity is measured before and after training (repeatable).",
        LANGUAGE_MODELS,
        metavar="FILE",
        panel="Forgetting",
        input=PATH,
    ),
    Opt(
        "train_on_prompt",
        bool,
        False,
        "Put the SFT loss on every token: system and user turns and role "
        "headers of conversations, the prompt of prompt/completion rows "
        "(default: the assistant's words only).",
        ("sft",),
    ),
    Opt(
        "replay_dataset",
        str,
        None,
        "Pre-training-style text mixed into the training data against forgetting.",
        ("sft", "finetune"),
        metavar="FILE",
        panel="Forgetting",
        input=PATH,
    ),
    Opt(
        "replay_ratio",
        float,
        0.0,
        "Fraction of training rows taken from --replay-dataset.",
        ("sft", "finetune"),
        fraction_below_one,
        "FRACTION",
        panel="Forgetting",
    ),
)
