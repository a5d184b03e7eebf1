"""The defaults that depend on the command, read off the command specs the CLI hands over, and their help text:
what `--lr`, `--max-length`, `--beta` and `--temperature` say about their defaults is written from the specs, never
by hand. Imports no torch/transformers, and nothing from posttrainllm/commands/.

`specs`: every command's spec by name, in the order `posttrainllm --help` lists them (posttrainllm/commands/
registry.py's SPECS)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posttrainllm.spec import CommandSpec

Specs = Mapping[str, CommandSpec]


def _number(v: Any) -> str:
    """2e-5, 5e-4, 0.1, 1: as written in a recipe."""
    if isinstance(v, float) and 0 < abs(v) < 0.01:
        mantissa, exponent = f"{v:.6e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return format(v, "g")


def listing(values: dict[str, Any]) -> str:
    """Commands grouped by equal value, in the order of the specs: `2e-5 sft/finetune, 5e-7 dpo/kto`."""
    groups: dict[str, list[str]] = {}
    for command, value in values.items():
        groups.setdefault(_number(value), []).append(command)
    return ", ".join(f"{value} {'/'.join(commands)}" for value, commands in groups.items())


def default_of(spec: CommandSpec, option: str) -> Any:
    """The command's default of an option whose default depends on the command (None: none)."""
    if option == "lr":
        return spec.lr
    if option == "max_length":
        return spec.max_length
    return spec.defaults.get(option)


def defaults_help(option: str, specs: Specs) -> str:
    """`Default: 2e-5 sft/finetune, 5e-7 dpo/kto, ...` for an option whose default depends on the command."""
    values = {name: v for name, s in specs.items() if (v := default_of(s, option)) is not None}
    return f"Default: {listing(values)}."


def full_help(opt, specs: Specs) -> str:
    """An option's help as shown (`--help`, docs/options.md): its text, then, for an option whose default depends
    on the command (`Opt.defaults_from`), those defaults from the specs."""
    return f"{opt.help} {defaults_help(opt.defaults_from, specs)}" if opt.defaults_from else opt.help
