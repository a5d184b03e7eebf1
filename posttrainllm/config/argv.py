"""A command line (the options of one command, as a list of strings) → its RunConfig, without Typer.

The same reading as the Typer app built from the option table (posttrainllm/cli.py): `--flag VALUE` and
`--flag=VALUE`; a boolean flag takes no value; a repeatable option (a list, or KEY=VALUE entries) gathers every
occurrence; an option with a bare value (`--llrd` alone = 0.95) takes it when followed by nothing or another
`--option`; a deprecated name stands for its option. The sweep reads its cells' command lines with it, so it needs
nothing from the CLI. Imports no torch/transformers/Typer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posttrainllm.config.options import EVERY_OPTION, options_for
from posttrainllm.config.resolve import resolve
from posttrainllm.config.runconfig import RunConfig
from posttrainllm.errors import UsageError
from posttrainllm.spec import CommandSpec


def flag_table(spec: CommandSpec) -> dict[str, Any]:
    """Every flag the command accepts (its deprecated names included) → its option."""
    table = {}
    for o in options_for(spec):
        table[o.cli_flag] = o
        table.update(dict.fromkeys(o.deprecated_flags, o))
    return table


def commands_taking(flag: str, specs: Mapping[str, CommandSpec]) -> list[str]:
    """The commands among `specs` that have an option `flag` (its name or an older name), in the order of `specs`."""
    named = [o for o in EVERY_OPTION if flag == o.cli_flag or flag in o.deprecated_flags]
    return [name for name, s in specs.items() if any(o.commands(s) for o in named)]


def not_an_option(command: str, flag: str, specs: Mapping[str, CommandSpec]) -> str | None:
    """Why `command` refuses `flag` when other commands take it ("--kl-to-base is not an option of dpo (sft and
    finetune take it); ..."); None when no command takes it, or `command` does."""
    others = commands_taking(flag, specs)
    if not others or command in others:
        return None
    takers = ", ".join(others[:-1]) + f" and {others[-1]}" if len(others) > 1 else others[0]
    return (
        f"{flag} is not an option of {command} ({takers} take{'s' if len(others) == 1 else ''} it); "
        f"`posttrainllm {command} --help` lists {command}'s options"
    )


def with_bare_values(spec: CommandSpec, args: list[str]) -> list[str]:
    """`args` with each bare flag (followed by nothing or by another `--option`) given its bare value, and each
    deprecated flag written as its option's flag."""
    table = flag_table(spec)
    out = []
    for i, tok in enumerate(args):
        o = table.get(tok)
        name, eq, value = tok.partition("=")
        if o is None and eq and name.startswith("--") and name in table:  # --deprecated-name=VALUE
            out.append(f"{table[name].cli_flag}={value}")
            continue
        out.append(o.cli_flag if o is not None else tok)
        if o is not None and o.bare is not None:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is None or nxt.startswith("--"):
                out.append(str(o.bare))
    return out


def parse(spec: CommandSpec, args: list[str], specs: Mapping[str, CommandSpec]) -> dict[str, Any]:
    """The raw values of `args` by option name (strings, True for a flag, lists for repeatable options); a
    UsageError for an unknown option (naming the commands among `specs` that take it), a missing value or an extra
    argument."""
    table = flag_table(spec)
    args = with_bare_values(spec, args)
    values: dict[str, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        name, eq, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        o = table.get(name)
        if o is None:
            what = f"No such option: {name}" if tok.startswith("-") else f"Got unexpected extra argument ({tok})"
            raise UsageError((not_an_option(spec.name, name, specs) if tok.startswith("--") else None) or what)
        if o.type is bool:
            if eq:
                raise UsageError(f"Option '{name}' does not take a value.")
            values[o.name] = True
            i += 1
            continue
        if eq:
            value = inline
        elif i + 1 < len(args):
            value, i = args[i + 1], i + 1
        else:
            raise UsageError(f"Option '{name}' requires an argument.")
        if o.type in (list, dict):
            values.setdefault(o.name, []).append(value)
        else:
            values[o.name] = value
        i += 1
    return values


def to_config(spec: CommandSpec, args: list[str], specs: Mapping[str, CommandSpec]) -> RunConfig:
    """`posttrainllm COMMAND ARGS...` resolved as the CLI would (ConfigErrors listing every problem)."""
    return resolve(spec, parse(spec, args, specs), argv=[spec.name, *args])
