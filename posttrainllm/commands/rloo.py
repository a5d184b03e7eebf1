"""`posttrainllm rloo`: REINFORCE leave-one-out with TRL's RLOOTrainer: online RL from prompts, the model's own sampled
completions and reward functions (built-in regex / exact match, or the user's --reward-fn).

The setup it shares with the other post-training commands is posttrainllm/commands/post_training.py."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from posttrainllm.commands.grpo import SPEC as GRPO
from posttrainllm.commands.grpo import online_row

if TYPE_CHECKING:
    pass

SPEC = dataclasses.replace(
    GRPO,
    name="rloo",
    help="Online RL with TRL's RLOOTrainer (REINFORCE leave-one-out): prompts and rewards as grpo.",
    trainer="trl:RLOOTrainer",
    trainer_config="trl:RLOOConfig",
    defaults={"beta": 0.05, "temperature": 1.0},  # TRL's defaults
    rows=lambda cfg: {"RLOO": online_row(cfg)},
)
