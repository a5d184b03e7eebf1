"""`posttrainllm distill`: on-policy knowledge distillation with TRL's DistillationTrainer: the student (--model)
completes the prompts, and learns to match the teacher's (--teacher) next-token distribution on its own samples.
Layer decay applies to the student only; the teacher is frozen and outside the optimizer.

The setup it shares with the other post-training commands is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from posttrainllm import lifecycle
from posttrainllm.commands import post_training


def main(cfg) -> None:
    lifecycle.run(cfg, post_training.setup)
