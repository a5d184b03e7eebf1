"""`posttrainllm kto`: Kahneman-Tversky optimisation with TRL's KTOTrainer, on unpaired preference data (one
completion per row, labelled desirable or not).

The setup the post-training commands share is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands import POST_TRAINING_SETUP, default_reference, num_proc
from posttrainllm.commands.dpo import positive_beta
from posttrainllm.commands.sft import max_length_steps
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _fields(cfg: RunConfig) -> dict[str, Any]:
    return dict(beta=cfg.beta, max_length=cfg.max_length, dataset_num_proc=num_proc(cfg))


def _batch_of_two(command: str, v: Mapping[str, Any]) -> list[str]:
    if (v.get("batch_size") or 0) < 2:
        return [
            f"{command} needs --batch-size 2 or more: TRL estimates KTO's KL term from the other completions of the "
            "batch"
        ]
    return []


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    return {"KTO": f"β={cfg.beta}, reference={cfg.ref_model or default_reference(cfg)}"}


SPEC = CommandSpec(
    name="kto",
    setup=POST_TRAINING_SETUP,
    help="Kahneman-Tversky optimisation with TRL's KTOTrainer (unpaired preference data: prompt, completion, label).",
    trainer="trl:KTOTrainer",
    trainer_config="trl:KTOConfig",
    trainer_fields=_fields,
    data="unpaired",
    reference="ref_model",
    lr=5e-7,
    max_length=512,
    defaults={"beta": 0.1},
    checks=(positive_beta, _batch_of_two),
    rows=_rows,
    steps=max_length_steps,
)
