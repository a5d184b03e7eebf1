"""Options of the panel: options of every command."""

from __future__ import annotations

from posttrainllm.config.checks import ALL_COMMANDS, TRAINING
from posttrainllm.config.opt import PATH, Opt

EVERYWHERE: tuple[Opt, ...] = (
    Opt(
        name="recipe",
        type=str,
        default=None,
        help="YAML recipe: a file, or the name of a bundled recipe (`posttrainllm recipes` lists them); keys are these "
        "option names; command-line flags override it.",
        commands=TRAINING + ("eval",),
        metavar="FILE|NAME",
        panel="Run",
        recipe=False,
        input=PATH,
    ),
    Opt(
        name="debug",
        type=bool,
        default=False,
        help="Show full tracebacks.",
        commands=ALL_COMMANDS,
        panel="Run",
        recipe=False,
    ),
)
