"""Every command's spec, in the order `posttrainllm --help` lists them. The one list a new command joins: the CLI
registers its commands from it and hands each command's spec to config/ (its options, defaults, checks and help) and
to the lifecycle, so no shared room imports anything from commands/.

Read by the CLI and the sweep (`posttrainllm sweep`, which runs commands) only. `resolve`, `to_config` and
`options_for` take a command's name, for scripts and tests: the shared functions take its spec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from posttrainllm.commands import (
    demo,
    distill,
    dpo,
    finetune,
    generate,
    grpo,
    kto,
    merge,
    pretrain,
    recipes,
    reward,
    rloo,
    sdft,
    sft,
)  # fmt: skip
from posttrainllm.commands import eval as evaluate
from posttrainllm.config import argv as _argv
from posttrainllm.config import options as _options
from posttrainllm.config.resolve import resolve as resolve_spec
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.opt import Opt
    from posttrainllm.config.runconfig import RunConfig

SPECS: dict[str, CommandSpec] = {
    m.SPEC.name: m.SPEC
    for m in (
        pretrain,
        sft,
        dpo,
        kto,
        reward,
        grpo,
        rloo,
        distill,
        sdft,
        finetune,
        evaluate,
        generate,
        merge,
        recipes,
        demo,
    )
}


def spec_of(command: str) -> CommandSpec:
    return SPECS[command]


def resolve(command: str, values: dict[str, Any], argv: list[str] | None = None) -> RunConfig:
    """`values` (option name -> raw value) resolved as `command`'s options, as its command line would be."""
    return resolve_spec(SPECS[command], values, argv=argv)


def to_config(command: str, args: list[str]) -> RunConfig:
    """`posttrainllm COMMAND ARGS...` resolved as the CLI would (ConfigErrors listing every problem)."""
    return _argv.to_config(SPECS[command], args, SPECS)


def options_for(command: str) -> list[Opt]:
    return _options.options_for(SPECS[command])


def not_an_option(command: str, flag: str) -> str | None:
    return _argv.not_an_option(command, flag, SPECS)
