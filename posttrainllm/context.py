"""What the lifecycle (posttrainllm/lifecycle.py) and a command's setup (posttrainllm/commands/) hand each other:
`Context` in, `Setup` back. A leaf both sides import; both are built with keywords."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.spec import CommandSpec


@dataclass(frozen=True, kw_only=True)
class Context:
    """What every setup receives: the config, the command's spec, the precision picked, the checked --trainer-arg
    values, the resume point."""

    cfg: RunConfig
    spec: CommandSpec
    precision: str
    trainer_args: dict[str, Any]
    resume_from: Path | None


@dataclass(kw_only=True)
class Setup:
    """What a command's setup hands the lifecycle: the (possibly adjusted) config, what trains on what, the plan,
    and the banner rows, notes and resolved settings to print and record."""

    cfg: RunConfig
    model: Any
    tokenizer: Any
    prepared: Any
    plan: Any
    info: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    resolved: dict[str, Any] = field(default_factory=dict)
    model_path: str | None = None
    after_plan: Callable[[Any], None] | None = None  # run_dir -> None: what to write once the plan is shown
    trainer_models: dict[str, Any] = field(default_factory=dict)  # the trainer's own models and rewards, by keyword
    # (ref_model, teacher_model, reward_funcs): never in the optimizer
