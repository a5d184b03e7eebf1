"""`CommandSpec`: what one command is, as data. Each `posttrainllm/commands/<command>.py` declares its `SPEC`, and the
shared code (config, lifecycle, training, data) reads it instead of testing the command's name.

A leaf: it imports nothing of the project, and the trainer's classes are named by import path ("trl:SFTTrainer"),
so reading the specs (the CLI's --help does) imports no torch/transformers/TRL.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

# the data shapes of posttrainllm/data/pipeline.py: sft rows, preference pairs, unpaired labelled completions,
# prompts (completions are sampled during training), raw text in token blocks; demonstrations: sft rows as a
# prompt and the demonstration a teacher sees beside it (sdft)
DataShape = Literal["sft", "demonstrations", "preference", "unpaired", "prompts", "text"]
# values -> problems; `command` names the command in the messages
CrossCheck = Callable[[str, Mapping[str, Any]], list[str]]


@dataclass(frozen=True, kw_only=True)
class CommandSpec:
    """One command: its help line, its trainer (by import path), its data, its defaults, checks and banner rows.

    A command without a trainer (eval, generate, demo) sets only the fields it uses."""

    name: str
    help: str  # the command's line in `posttrainllm --help`
    trainer: str | None = None  # "module:Class" of the trainer, e.g. "trl:SFTTrainer"; None: the command trains nothing
    trainer_config: str | None = None  # "module:Class" of its config, e.g. "trl:SFTConfig"
    trainer_fields: Callable[[Any], dict[str, Any]] | None = None  # cfg -> the command's own trainer config fields
    owned_fields: Mapping[str, str] = field(default_factory=dict)  # trainer field -> the option that sets it
    collator: str | None = None  # "module:function" passed as data_collator (None: the trainer's own)
    data: DataShape | None = None
    samples: bool = False  # trains on completions the model samples during training (TRL's RepeatSampler)
    rewards: bool = False  # scores those completions with reward functions (--reward-*)
    reference: Literal["ref_model", "teacher"] | None = None  # the second model's option: a reference or a teacher
    reward_head: bool = False  # the model gets a score head (a sequence classifier), not an LM head
    vision: bool = False  # trains a vision-language model on image-text data too (posttrainllm/vision/)
    needs_eos: bool = True  # the tokenizer must have an end-of-sequence token
    from_scratch: bool = False  # no base model: the run starts from random weights
    lr: float | None = None  # the default --lr
    max_length: int | None = None  # the default --max-length (None: the command has no --max-length)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # option -> this command's default (e.g. beta)
    checks: tuple[CrossCheck, ...] = ()  # the command's cross-checks, run with every option's value at once
    rows: Callable[[Any], dict[str, str | None]] | None = None  # cfg -> the command's own banner rows
    steps: Callable[[Any, int | None], str] | None = None  # (cfg, training rows) -> the banner's steps row
    # main(cfg, run_command) runs other commands (the demo): the CLI hands it run_command(command, values), which
    # resolves the values and calls that command's main, so the command needs no import of config/ or the registry
    runs_commands: bool = False

    @property
    def trains(self) -> bool:
        return self.trainer is not None


def load(path: str) -> Any:
    """The object a "module:attribute" path names, imported now (e.g. "trl:SFTTrainer")."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def num_proc(cfg: RunConfig) -> int | None:
    """--dataset-num-proc for TRL's tokenization map (None: in this process)."""
    n = cfg.dataset_num_proc or 1
    return n if n > 1 else None


def default_reference(cfg: RunConfig) -> str:
    """The banner's reference model when --ref-model is not given."""
    return "adapter-disabled base" if cfg.lora_r else "frozen copy of --model"
