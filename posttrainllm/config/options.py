"""The option table: every option of every command, in the order the help lists them, one module per help panel
(posttrainllm/config/panels/). The single source of the command-line flags (posttrainllm/cli.py builds the Typer
app from it), the recipe keys, the RunConfig fields (posttrainllm/config/runconfig.py) and the README's option
table (tests/test_config.py checks it). Imports no torch/transformers."""

from __future__ import annotations

from posttrainllm.config.opt import PATH, Opt
from posttrainllm.config.panels.eval import EVAL
from posttrainllm.config.panels.everywhere import EVERYWHERE
from posttrainllm.config.panels.forgetting import FORGETTING
from posttrainllm.config.panels.generate import GENERATE
from posttrainllm.config.panels.inputs import INPUTS
from posttrainllm.config.panels.llrd import LLRD
from posttrainllm.config.panels.lora import LORA
from posttrainllm.config.panels.optimisation import OPTIMISATION
from posttrainllm.config.panels.rl import ONLINE
from posttrainllm.config.panels.run import RUN_CONTROL

OPTIONS: tuple[Opt, ...] = (
    INPUTS + LLRD + OPTIMISATION + ONLINE + LORA + FORGETTING + RUN_CONTROL + EVAL + GENERATE + EVERYWHERE
)
RECIPE_KEYS = {o.recipe_key for o in OPTIONS} | {k for o in OPTIONS for k in o.deprecated}

# options whose meaning differs for one command
EVAL_MODEL = Opt(
    "model",
    str,
    None,
    "Model to evaluate: a local directory, GGUF file or hub id.",
    ("eval",),
    metavar="PATH_OR_HUB_ID",
    required=True,
    panel="Inputs",
    input=PATH,
)

COMMAND_DEFAULT_LR = {
    "sft": 2e-5, "finetune": 2e-5, "dpo": 5e-7, "kto": 5e-7, "reward": 1e-5, "grpo": 1e-6, "rloo": 1e-6,
    "distill": 1e-5,
    "pretrain": 5e-4,
}  # fmt: skip
# options whose default depends on the command (TRL's defaults for β; generate is greedy, RL must sample)
COMMAND_DEFAULTS = {
    "beta": {"dpo": 0.1, "kto": 0.1, "grpo": 0.0, "rloo": 0.05, "distill": 1.0},
    "temperature": {"generate": 0.0, "grpo": 1.0, "rloo": 1.0, "distill": 1.0},
}
COMMAND_DEFAULT_MAX_LENGTH = {
    "sft": 512, "dpo": 512, "kto": 512, "reward": 512, "finetune": 512, "pretrain": 256, "eval": 512,
}  # fmt: skip


DEMO_OUTPUT = Opt(
    "output_dir",
    str,
    "demo-output",
    "Directory for the demo's data, models and results.",
    ("demo",),
    metavar="DIR",
    panel="Inputs",
)
GENERATE_MODEL = Opt(
    "model",
    str,
    None,
    "Model to generate with: a local directory, GGUF file or hub id.",
    ("generate",),
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
