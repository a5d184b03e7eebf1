"""The defaults that depend on the command, read off the command specs (posttrainllm/commands/), and their help
text: what `--lr`, `--max-length`, `--beta` and `--temperature` say about their defaults is written from the specs,
never by hand. Imports no torch/transformers."""

from __future__ import annotations

from typing import Any

from posttrainllm.commands.registry import SPECS


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


def default_lrs() -> dict[str, float]:
    return {name: s.lr for name, s in SPECS.items() if s.lr is not None}


def default_max_lengths() -> dict[str, int]:
    return {name: s.max_length for name, s in SPECS.items() if s.max_length is not None}


def option_defaults(option: str) -> dict[str, Any]:
    """command -> its default of `option`, for the commands whose spec sets one (e.g. beta)."""
    return {name: s.defaults[option] for name, s in SPECS.items() if option in s.defaults}


def default_of(command: str, option: str) -> Any:
    """The command's default of an option whose default depends on the command (None: none)."""
    spec = SPECS[command]
    if option == "lr":
        return spec.lr
    if option == "max_length":
        return spec.max_length
    return spec.defaults.get(option)


def defaults_help(option: str) -> str:
    """`Default: 2e-5 sft/finetune, 5e-7 dpo/kto, ...` for an option whose default depends on the command."""
    if option == "lr":
        values: dict[str, Any] = default_lrs()
    elif option == "max_length":
        values = default_max_lengths()
    else:
        values = option_defaults(option)
    return f"Default: {listing(values)}."


def full_help(opt) -> str:
    """An option's help as shown (`--help`, docs/options.md): its text, then, for an option whose default depends
    on the command (`Opt.defaults_from`), those defaults from the specs."""
    return f"{opt.help} {defaults_help(opt.defaults_from)}" if opt.defaults_from else opt.help
