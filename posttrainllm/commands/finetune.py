"""`posttrainllm finetune`: Causal-LM training on raw text with transformers' Trainer.

The setup sft, dpo and finetune share is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from posttrainllm import lifecycle
from posttrainllm.commands import post_training


def main(cfg) -> None:
    lifecycle.run(cfg, post_training.setup)
