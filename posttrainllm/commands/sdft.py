"""`posttrainllm sdft`: self-distillation fine-tuning with TRL's SDFTTrainer (arXiv 2601.19897): the model completes
each prompt on its own, and learns what it would have said with the demonstration in view. The teacher is the same
model shown the prompt and the demonstration (TRL's teacher prompt: "{prompt}\\n\\n{privileged_context}"). Layer
decay applies to the model; the teacher is outside the optimizer.

Data: sft's rows, each a prompt and its demonstration (posttrainllm/data/demonstrations.py). Defaults from the
paper where TRL's differ (decision log): one completion per prompt, a teacher that is the model's moving average
(rate 0.01 per step), the reverse KL (β = 1). TRL's top-100 logit distillation is kept: the full-vocabulary KL holds
two distributions of the vocabulary's size per token (1 MiB each on Gemma 3's 262k vocabulary).

The setup it shares with the other post-training commands is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands import POST_TRAINING_SETUP
from posttrainllm.commands.grpo import SAMPLING_OWNED
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

OWNED = {
    **{k: v for k, v in SAMPLING_OWNED.items() if k != "reward_weights"},
    "num_generations": "sdft (one completion per prompt, the paper's)",
    "distillation_alpha": "--beta",
    "teacher_model_kind": "--teacher-kind",
    "teacher_update_rate": "--teacher-update-rate",
}


def _fields(cfg: RunConfig) -> dict[str, Any]:
    return dict(
        num_generations=1,  # SDFT needs no group: each completion is distilled on its own (Algorithm 1: one rollout)
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        distillation_alpha=cfg.beta,
        teacher_model_kind=cfg.teacher_kind,
        teacher_update_rate=cfg.teacher_update_rate,
        teacher_sync_steps=1,
        trust_remote_code=bool(cfg.trust_remote_code),
    )


def _checks(command: str, v: Mapping[str, Any]) -> list[str]:
    problems = []
    if v.get("beta") is not None and not 0 <= v["beta"] <= 1:
        problems.append(f"--beta for {command} is the divergence's mix and must be in [0, 1], got {v['beta']:g}")
    if v.get("temperature") is not None and v["temperature"] <= 0:
        problems.append(f"--temperature must be > 0 for {command} (its completions are sampled)")
    if v.get("streaming"):
        problems.append(
            f"--streaming: TRL's SDFTTrainer reads a dataset it can index; {command} needs a file or hub id"
        )
    return problems


def _teacher(cfg: RunConfig) -> str:
    if cfg.teacher_kind == "ema":
        return f"moving average of the model (rate {cfg.teacher_update_rate:g} per step)"
    return "the starting model, frozen" if cfg.teacher_kind == "base" else "the model itself, live"


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    return {
        "SDFT": f"one completion per prompt, temperature {cfg.temperature:g}, at most {cfg.max_completion_length} "
        f"tokens; teacher: {_teacher(cfg)}, shown the demonstration; β={cfg.beta:g} (0 forward KL, 0.5 JSD, 1 "
        "reverse KL) over the teacher's top 100 tokens"
    }


def _steps(cfg: RunConfig, n_train: int | None) -> str:
    from posttrainllm.training.builder import steps_row

    return steps_row(cfg, n_train, f"one sampled completion per prompt, at most {cfg.max_completion_length} tokens")


SPEC = CommandSpec(
    name="sdft",
    setup=POST_TRAINING_SETUP,
    sweep=True,
    method="SDFT",
    help="Self-distillation fine-tuning with TRL's SDFTTrainer: the model completes your prompts and learns what it "
    "says with each demonstration in view (prompt/completion, Alpaca or chat rows).",
    trainer="trl.experimental.sdft:SDFTTrainer",
    trainer_config="trl.experimental.sdft:SDFTConfig",
    trainer_fields=_fields,
    owned_fields=OWNED,
    data="demonstrations",
    prepare="posttrainllm.data.demonstrations:prepare",
    trainer_mixins=("posttrainllm.training.teacher_state:MovingTeacherMixin",),
    samples=True,
    lr=1e-5,
    defaults={"beta": 1.0, "temperature": 1.0},
    checks=(_checks,),
    rows=_rows,
    steps=_steps,
)
