"""`CommandSpec`: what one command is, as data. Each `posttrainllm/commands/<command>.py` declares its `SPEC`; the
CLI hands it to the shared code (config, lifecycle, training, data), which reads it instead of testing the command's
name and imports nothing from `commands/`.

`Family`: a set of commands as a test over their specs (`TRAINING`, `POST_TRAINING`, `own("sdft")`, ...): what an
option's `commands=` says, so an option table entry names no list of commands.

A leaf: it imports nothing of the project, and the trainer's classes are named by import path ("trl:SFTTrainer"),
so reading the specs (the CLI's --help does) imports no torch/transformers/TRL.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# the data shapes posttrainllm/data/pipeline.py reads: sft rows, preference pairs, unpaired labelled completions,
# prompts (completions are sampled during training), raw text in token blocks; or a shape of a command's own, which
# its spec's `prepare` reads (sdft's "demonstrations": sft rows as a prompt and the demonstration a teacher sees)
DataShape = str
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
    # "module:Class" mixins of the command's own, put in front of its trainer class (sdft: the moving teacher saved
    # with each checkpoint), after posttrainllm's own (training/builder.py)
    trainer_mixins: tuple[str, ...] = ()
    # "module:function" cfg -> the constructor keywords of those mixins (finetune: whether its loss is DFT)
    trainer_kwargs: str | None = None
    data: DataShape | None = None
    # "module:function" (cfg, tokenizer, options) -> the prepared data, for a command whose data shape is its own
    # (sdft: sft rows as prompts and demonstrations); None: the shape's reader in posttrainllm/data/pipeline.py
    prepare: str | None = None
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
    # "module:function" of the setup a training command runs (ctx -> Setup: model, data, banner rows) inside the
    # shared lifecycle: one main (posttrainllm/lifecycle.py's `main`) serves every training command
    setup: str | None = None
    # main(cfg, run_command) runs other commands (the demo): the CLI hands it run_command(command, values), which
    # resolves the values and runs that command, so the command needs no import of config/ or the registry
    runs_commands: bool = False
    sweep: bool = False  # `posttrainllm sweep COMMAND` runs it for every cell of a grid
    method: str | None = None  # its training is a forgetting method of its own: the frontier's label (sdft: "SDFT")

    @property
    def trains(self) -> bool:
        return self.trainer is not None

    def __post_init__(self) -> None:
        if self.trains and not self.setup:
            raise ValueError(f"{self.name}: a command that trains names its setup (CommandSpec.setup)")


class Family:
    """A set of commands, as a test over their specs: `TRAINING(spec)` is True for a command that trains. `a | b` is
    the union; `name` is how docs/options.md lists it ("training", "post-training", or the commands' names)."""

    def __init__(self, name: str, test: Callable[[CommandSpec], bool]):
        self.name, self._test = name, test

    def __call__(self, spec: CommandSpec) -> bool:
        return self._test(spec)

    def __or__(self, other: Family) -> Family:
        return Family(f"{self.name}, {other.name}", lambda s: self(s) or other(s))

    def __repr__(self) -> str:
        return f"Family({self.name!r})"


def own(command: str) -> Family:
    """One command's own options (its panel): the command named `command`."""
    return Family(command, lambda s: s.name == command)


EVERY = Family("all", lambda s: True)
TRAINING = Family("training", lambda s: s.trains)
POST_TRAINING = Family("post-training", lambda s: s.trains and not s.from_scratch)  # start from a model
FROM_SCRATCH = Family("from scratch", lambda s: s.trains and s.from_scratch)  # random weights (pretrain)
# train a causal LM (the reward command trains a scorer)
LANGUAGE_MODELS = Family("language models", lambda s: POST_TRAINING(s) and not s.reward_head)
SAMPLING = Family("sampling", lambda s: s.trains and s.samples)  # train on completions sampled during training
ONLINE_RL = Family("online RL", lambda s: SAMPLING(s) and s.rewards)  # ... that reward functions score
OFFLINE_DATA = Family("offline data", lambda s: s.trains and not s.samples)  # train on the dataset's own text
OFFLINE_LM = Family("offline LM", lambda s: LANGUAGE_MODELS(s) and not s.samples)  # sft, dpo, kto, finetune
# the likelihood of the dataset's own text (sft rows or raw text blocks), from a model: sft, finetune
LIKELIHOOD = Family("likelihood", lambda s: OFFLINE_LM(s) and s.data in ("sft", "text"))
# a loss weighted by β against a second model: a reference (dpo, kto), a teacher, or the sampling start (grpo...)
BETA = Family("β-weighted", lambda s: s.trains and (s.reference is not None or s.samples))
REFERENCE_MODEL = Family("reference model", lambda s: s.reference == "ref_model")
TEACHER = Family("teacher", lambda s: s.reference == "teacher")


def load(path: str) -> Any:
    """The object a "module:attribute" path names, imported now (e.g. "trl:SFTTrainer")."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
