"""`posttrainllm reward`: a reward model with TRL's RewardTrainer: the model with a sequence-classification head (one
score), trained on preference pairs so that the chosen answer scores above the rejected one. Its depth is the
backbone's; the new score head trains at the base LR like an LM head.

The setup it shares with the other post-training commands is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from posttrainllm import lifecycle
from posttrainllm.commands import post_training


def main(cfg) -> None:
    lifecycle.run(cfg, post_training.setup)
