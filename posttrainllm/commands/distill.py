"""`posttrainllm distill`: on-policy knowledge distillation with TRL's DistillationTrainer: the student (--model)
completes the prompts, and learns to match the teacher's (--teacher) next-token distribution on its own samples.
Layer decay applies to the student only; the teacher is frozen and outside the optimizer.

The setup it shares with the other post-training commands is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands import POST_TRAINING_SETUP
from posttrainllm.commands.grpo import SAMPLING_OWNED
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _fields(cfg: RunConfig) -> dict[str, Any]:
    return dict(
        beta=cfg.beta, max_completion_length=cfg.max_completion_length, temperature=cfg.temperature,
        trust_remote_code=bool(cfg.trust_remote_code),
    )  # fmt: skip


def _checks(command: str, v: Mapping[str, Any]) -> list[str]:
    problems = []
    if v.get("beta") is not None and not 0 <= v["beta"] <= 1:
        problems.append(f"--beta for {command} is the divergence's mix and must be in [0, 1], got {v['beta']:g}")
    if v.get("temperature") is not None and v["temperature"] <= 0:
        problems.append(f"--temperature must be > 0 for {command} (it divides the logits of both models)")
    return problems


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    return {
        "distill": f"teacher {cfg.teacher} (frozen, out of the optimizer); the student samples, then matches the "
        f"teacher's next-token distribution: β={cfg.beta:g} (0 forward KL, 0.5 JSD, 1 reverse KL), temperature "
        f"{cfg.temperature:g}"
    }


def _steps(cfg: RunConfig, n_train: int | None) -> str:
    from posttrainllm.training.builder import steps_row

    return steps_row(cfg, n_train, f"one sampled completion per prompt, at most {cfg.max_completion_length} tokens")


SPEC = CommandSpec(
    name="distill",
    setup=POST_TRAINING_SETUP,
    help="On-policy distillation with TRL's DistillationTrainer: the model completes your prompts and learns the "
    "--teacher's next-token distribution on them.",
    trainer="trl:DistillationTrainer",
    trainer_config="trl:DistillationConfig",
    trainer_fields=_fields,
    owned_fields={**SAMPLING_OWNED, "teacher_model_name_or_path": "--teacher"},
    data="prompts",
    samples=True,
    reference="teacher",
    lr=1e-5,
    defaults={"beta": 1.0, "temperature": 1.0},
    checks=(_checks,),
    rows=_rows,
    steps=_steps,
)
