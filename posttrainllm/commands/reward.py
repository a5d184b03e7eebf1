"""`posttrainllm reward`: a reward model with TRL's RewardTrainer: the model with a sequence-classification head (one
score), trained on preference pairs so that the chosen answer scores above the rejected one. Its depth is the
backbone's; the new score head trains at the base LR like an LM head.

The setup it shares with the other post-training commands is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posttrainllm.commands import POST_TRAINING_SETUP, num_proc
from posttrainllm.commands.sft import max_length_steps
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _fields(cfg: RunConfig) -> dict[str, Any]:
    return dict(max_length=cfg.max_length, dataset_num_proc=num_proc(cfg))


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    return {
        "reward model": "one score per sequence from a new head on the last token (TRL's pairwise loss: chosen above "
        "rejected); the head trains at the base LR, as an LM head would"
    }


SPEC = CommandSpec(
    name="reward",
    setup=POST_TRAINING_SETUP,
    help="Train a reward model with TRL's RewardTrainer: a score head on the model, learnt from preference pairs "
    "(the data of dpo).",
    trainer="trl:RewardTrainer",
    trainer_config="trl:RewardConfig",
    trainer_fields=_fields,
    data="preference",  # a reward model learns from the same preference pairs as dpo
    reward_head=True,
    lr=1e-5,
    max_length=512,
    rows=_rows,
    steps=max_length_steps,
)
