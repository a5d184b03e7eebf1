"""The option table: every option of every command, in the order the help lists them, one module per help panel
(posttrainllm/config/panels/, found there: a new panel needs no entry here). The single source of the command-line
flags (posttrainllm/cli.py builds the Typer app from it), the recipe keys, the RunConfig fields
(posttrainllm/config/runconfig.py, written by config/typed.py) and the option table of docs/options.md
(tests/unit/config/test_config.py checks it). Imports no torch/transformers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from posttrainllm.config import panels
from posttrainllm.config.opt import PATH, Opt
from posttrainllm.spec import own

if TYPE_CHECKING:
    from posttrainllm.spec import CommandSpec

OPTIONS: tuple[Opt, ...] = panels.collect()  # every panel of posttrainllm/config/panels/, in the help's order
RECIPE_KEYS = {o.recipe_key for o in OPTIONS} | {k for o in OPTIONS for k in o.deprecated}

# options whose meaning differs for one command
EVAL_MODEL = Opt(
    name="model",
    type=str,
    default=None,
    help="Model to evaluate: a local directory, GGUF file or hub id.",
    commands=own("eval"),
    metavar="PATH_OR_HUB_ID",
    required=True,
    panel="Inputs",
    input=PATH,
)

DEMO_OUTPUT = Opt(
    name="output_dir",
    type=str,
    default="demo-output",
    help="Directory for the demo's data, models and results.",
    commands=own("demo"),
    metavar="DIR",
    panel="Inputs",
)
GENERATE_MODEL = Opt(
    name="model",
    type=str,
    default=None,
    help="Model to generate with: a local directory, GGUF file or hub id.",
    commands=own("generate"),
    metavar="PATH_OR_HUB_ID",
    required=True,
    panel="Inputs",
    input=PATH,
)
EXTRA_OPTIONS: tuple[Opt, ...] = (EVAL_MODEL, DEMO_OUTPUT, GENERATE_MODEL)
EVERY_OPTION: tuple[Opt, ...] = (*EXTRA_OPTIONS, *OPTIONS)  # every definition, in the order docs/options.md lists them


def options_for(spec: CommandSpec) -> list[Opt]:
    """The options of the command `spec` describes, in the order its --help lists them: the entries whose family
    (`Opt.commands`) holds it."""
    return [o for o in EVERY_OPTION if o.commands(spec)]


def by_name() -> dict[str, Opt]:
    """Each option name's first definition in the table (EXTRA_OPTIONS redefine a few for one command)."""
    seen: dict[str, Opt] = {}
    for o in (*OPTIONS, *EXTRA_OPTIONS):
        seen.setdefault(o.name, o)
    return seen
