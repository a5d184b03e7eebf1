"""The trainers: TRL's SFTTrainer / DPOTrainer and transformers' Trainer with posttrainllm's mixins (the layer-wise LR
groups through `create_optimizer`, the divergence guard, FSDP2 on CPU), built from the run's plan. As axolotl's
builders/mixins split: `args` (trainer configuration), `mixins`, `progress` (log lines), `builder`."""

from posttrainllm.training.args import (
    FIRST_CLASS,
    check_optim_name,
    check_trainer_args,
    common_args,
    make_config,
    trainer_config,
)
from posttrainllm.training.builder import build_trainer, steps_row, total_steps, trainer_class
from posttrainllm.training.mixins import DivergenceGuardMixin, EngineMixin, LLRDMixin, check_distributed_engine
from posttrainllm.training.progress import interactive, log_line, quiet_progress_bars

__all__ = [
    "FIRST_CLASS",
    "DivergenceGuardMixin",
    "EngineMixin",
    "LLRDMixin",
    "build_trainer",
    "check_distributed_engine",
    "check_optim_name",
    "check_trainer_args",
    "common_args",
    "interactive",
    "log_line",
    "make_config",
    "quiet_progress_bars",
    "steps_row",
    "total_steps",
    "trainer_class",
    "trainer_config",
]
