"""`posttrainllm kto`: Kahneman-Tversky optimisation with TRL's KTOTrainer, on unpaired preference data (one
completion per row, labelled desirable or not).

The setup sft, dpo, kto and finetune share is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from posttrainllm import lifecycle
from posttrainllm.commands import post_training


def main(cfg) -> None:
    lifecycle.run(cfg, post_training.setup)
