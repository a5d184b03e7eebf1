"""`posttrainllm grpo`: Group relative policy optimisation with TRL's GRPOTrainer: online RL from prompts, the
model's own sampled completions and reward functions (built-in regex / exact match, or the user's --reward-fn).

The setup it shares with sft, dpo, kto and finetune is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from posttrainllm import lifecycle
from posttrainllm.commands import post_training


def main(cfg) -> None:
    lifecycle.run(cfg, post_training.setup)
