"""The option definitions are the one source of the CLI flags, the recipe keys, RunConfig and docs/options.md;
one conversion reads every KEY=VALUE source."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from posttrainllm.commands import options_page as config_doc
from posttrainllm.commands.registry import options_for
from posttrainllm.config import EXTRA_OPTIONS, OPTIONS, RunConfig, convert

OPTIONS_PAGE = Path(__file__).resolve().parents[3] / config_doc.PAGE


def test_the_options_page_holds_the_generated_table():
    block = config_doc.generated_block(OPTIONS_PAGE.read_text(encoding="utf-8"))
    assert block is not None, f"{config_doc.PAGE} lost its options:start/options:end markers"
    assert block == config_doc.block(), (
        f"{config_doc.PAGE}'s option table is stale: python -m posttrainllm.commands.options_page"
    )


def test_every_flag_of_every_command_is_in_the_options_table():
    table = config_doc.options_table()
    from typer.main import get_command

    from posttrainllm.cli import app

    group = get_command(app)
    for name in ("pretrain", "sft", "dpo", "finetune", "eval", "generate", "demo"):
        flags = {opt for p in group.commands[name].params for opt in p.opts if opt.startswith("--")}
        for flag in flags - {"--help"}:
            assert f"`{flag}`" in table, (name, flag)
        assert {o.cli_flag for o in options_for(name)} == flags - {"--help"}


def test_run_config_is_typed_and_generated_from_the_table():
    hints = typing.get_type_hints(RunConfig)
    names = {o.name for o in OPTIONS} | {o.name for o in EXTRA_OPTIONS}
    assert names <= set(hints)
    # `X | None` where the option has no default of its own (the spec or the run supplies it), `X` where it has one
    assert hints["lr"] == float | None and hints["lr_groups"] == dict[str, float]
    assert hints["ood_eval"] == list[str] and hints["trainer_args"] == dict[str, Any]
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunConfig(command="sft").llrd = 0.9


@pytest.mark.parametrize(
    "text,expected",
    [("true", True), ("8", 8), ("0.5", 0.5), ("{a: 1}", {"a": 1}), ("bfloat16", "bfloat16"), ("", "")],
)
def test_a_value_of_unknown_type_reads_as_yaml_for_trainer_and_model_args_alike(text, expected):
    """--model-arg (a config field: no type known) and a --trainer-arg field whose annotation cannot be resolved go
    through the same conversion."""
    assert convert(text) == expected and convert(text, Any) == expected


@pytest.mark.parametrize(
    "value,hint,expected",
    [
        ("yes", bool, True),
        ("8.0", float, 8.0),
        (8.0, int, 8),
        ("none", int | None, None),
        ("3", int | str, 3),
        ("a,b", list[str], ["a", "b"]),
        ('{"x": 1}', dict, {"x": 1}),
    ],
)
def test_typed_conversion(value, hint, expected):
    assert convert(value, hint) == expected


@pytest.mark.parametrize("value,hint", [(True, int), ("many", int), ({"a": 1}, str), ("maybe", bool)])
def test_typed_conversion_refuses(value, hint):
    with pytest.raises(ValueError):
        convert(value, hint)


def test_the_enum_case_of_the_old_converter_had_one_branch():
    """trainers.coerce's Enum case was `x if isinstance(value, str) else x`: both branches the same."""
    import enum

    class Kind(enum.Enum):
        A = "a"

    assert convert("a", Kind) == "a" and convert(Kind.A, Kind) == "a"


def test_every_help_that_lists_model_sources_names_gguf_files():
    """--model (of every command), --ref-model, --teacher and --reference accept a .gguf file: their help says so."""
    every = (*EXTRA_OPTIONS, *OPTIONS)
    listing = [o for o in every if "hub id" in o.help.lower() and "model" in o.help.lower()]
    assert {o.name for o in listing} >= {"model", "ref_model", "teacher", "reference"}
    for o in listing:
        assert "gguf" in o.help.lower(), (o.name, o.commands, o.help)
    from typer.testing import CliRunner

    from posttrainllm.cli import app

    for command in ("sft", "eval", "generate", "distill"):
        r = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
        assert r.exit_code == 0 and "GGUF file" in " ".join(r.output.split()), (command, r.output)
