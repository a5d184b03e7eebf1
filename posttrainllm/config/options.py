"""The option table: every option of every command, in the order the help lists them, one module per help panel
(posttrainllm/config/panels/). The single source of the command-line flags (posttrainllm/cli.py builds the Typer
app from it), the recipe keys, the RunConfig fields (posttrainllm/config/runconfig.py, written by config/typed.py) and
the option table of docs/options.md (tests/unit/config/test_config.py checks it). Imports no torch/transformers."""

from __future__ import annotations

from posttrainllm.config.opt import PATH, Opt
from posttrainllm.config.panels.eval import EVAL
from posttrainllm.config.panels.everywhere import EVERYWHERE
from posttrainllm.config.panels.forgetting import FORGETTING
from posttrainllm.config.panels.generate import GENERATE
from posttrainllm.config.panels.inputs import INPUTS
from posttrainllm.config.panels.llrd import LLRD
from posttrainllm.config.panels.lora import LORA
from posttrainllm.config.panels.merge import MERGE
from posttrainllm.config.panels.optimisation import OPTIMISATION
from posttrainllm.config.panels.rl import ONLINE
from posttrainllm.config.panels.run import RUN_CONTROL
from posttrainllm.config.panels.sdft import SDFT

OPTIONS: tuple[Opt, ...] = (
    INPUTS
    + LLRD
    + OPTIMISATION
    + ONLINE
    + SDFT
    + LORA
    + FORGETTING
    + RUN_CONTROL
    + EVAL
    + GENERATE
    + EVERYWHERE
    + MERGE
)
RECIPE_KEYS = {o.recipe_key for o in OPTIONS} | {k for o in OPTIONS for k in o.deprecated}

# options whose meaning differs for one command
EVAL_MODEL = Opt(
    name="model",
    type=str,
    default=None,
    help="Model to evaluate: a local directory, GGUF file or hub id.",
    commands=("eval",),
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
    commands=("demo",),
    metavar="DIR",
    panel="Inputs",
)
GENERATE_MODEL = Opt(
    name="model",
    type=str,
    default=None,
    help="Model to generate with: a local directory, GGUF file or hub id.",
    commands=("generate",),
    metavar="PATH_OR_HUB_ID",
    required=True,
    panel="Inputs",
    input=PATH,
)
EXTRA_OPTIONS = {"eval": EVAL_MODEL, "demo": DEMO_OUTPUT, "generate": GENERATE_MODEL}


def options_for(command: str) -> list[Opt]:
    opts = [o for o in OPTIONS if command in o.commands]
    if command in EXTRA_OPTIONS:
        opts.insert(0, EXTRA_OPTIONS[command])
    return opts
