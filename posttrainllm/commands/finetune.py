"""`posttrainllm finetune`: Causal-LM training on raw text with transformers' Trainer.

The setup the post-training commands share is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posttrainllm.commands import POST_TRAINING_SETUP
from posttrainllm.commands.sft import DFT_ROW, max_length_steps
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    return {"loss": DFT_ROW if cfg.sft_loss_type == "dft" else None}


SPEC = CommandSpec(
    name="finetune",
    setup=POST_TRAINING_SETUP,
    sweep=True,
    help="Causal-LM training on raw text with transformers' Trainer (continued pre-training).",
    trainer="transformers:Trainer",
    trainer_config="transformers:TrainingArguments",
    collator="transformers:default_data_collator",
    data="text",
    needs_eos=False,
    lr=2e-5,
    max_length=512,
    steps=max_length_steps,
    rows=_rows,
    # --loss-type dft: transformers' Trainer has no DFT loss of its own (TRL's sft has), so a mixin gives it one
    trainer_mixins=("posttrainllm.training.dft:DFTLossMixin",),
    trainer_kwargs="posttrainllm.training.dft:trainer_kwargs",
)
