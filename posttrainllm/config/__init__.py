"""The run configuration: one table of options, recipes, and validation. Imports no torch/transformers.

Config flows one way: defaults < recipe (YAML, flat keys = option names) < command line. Every problem (unknown
recipe key, wrong type, value out of range) is collected and reported at once, before any model or data is loaded.

- `opt` / `panels/` / `options`: the option definitions, one module per help panel; the single source of the CLI
  flags, the recipe keys, the RunConfig fields and the option table of docs/options.md.
- `runconfig`: RunConfig, generated from the table (typed, frozen).
- `checks`: the per-option checks; `coerce`: the one conversion of text/YAML values (CLI, recipes, --trainer-arg,
  --model-arg); `recipe`: hardened YAML loading; `resolve`: defaults < recipe < command line, with cross-checks;
  `argv`: a command line → RunConfig without Typer (the sweep's cells).
"""

from posttrainllm.config.checks import (
    LLRD_BARE,
    LLRD_MAX,
    LLRD_MIN,
    LLRD_RANGE,
    PRECISIONS,
    REPORT_TO,
    SCHEDULERS,
)
from posttrainllm.config.coerce import convert, quote
from posttrainllm.config.opt import Opt
from posttrainllm.config.options import EXTRA_OPTIONS, OPTIONS, RECIPE_KEYS, options_for
from posttrainllm.config.recipe import load_recipe, producing_recipe
from posttrainllm.config.resolve import default_output_dir, resolve
from posttrainllm.config.runconfig import RunConfig
from posttrainllm.refs import special_file

__all__ = [
    "EXTRA_OPTIONS",
    "LLRD_BARE",
    "LLRD_MAX",
    "LLRD_MIN",
    "LLRD_RANGE",
    "OPTIONS",
    "PRECISIONS",
    "RECIPE_KEYS",
    "REPORT_TO",
    "SCHEDULERS",
    "Opt",
    "RunConfig",
    "convert",
    "default_output_dir",
    "load_recipe",
    "options_for",
    "producing_recipe",
    "quote",
    "resolve",
    "special_file",
]
