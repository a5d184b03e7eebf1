"""Options of the panel: measuring and limiting forgetting."""

from __future__ import annotations

from posttrainllm.config.checks import (
    LANGUAGE_MODELS,
    fraction_below_one,
    non_negative,
)
from posttrainllm.config.opt import Opt

FORGETTING: tuple[Opt, ...] = (
    Opt(
        "ood_eval",
        list,
        [],
        "Text file whose perplexity is measured before and after training (repeatable).",
        LANGUAGE_MODELS,
        metavar="FILE",
        panel="Forgetting",
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
    Opt(
        "kl_to_base",
        float,
        0.0,
        "KL anchor to the starting model: loss = the LM loss + β × the mean per-token KL(base ‖ model) over the "
        "tokens the loss is on; logged as kl_to_base. The base is a frozen copy of the model (its weights once "
        "more in memory), or with --lora-r the model with its adapters off (no copy); either way one extra "
        "forward per step. 0 (default): off. sft and finetune only (dpo's and kto's --beta already anchor to "
        "their reference).",
        ("sft", "finetune"),
        non_negative,
        "BETA",
        panel="Forgetting",
    ),
)
