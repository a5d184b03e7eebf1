"""Options of the panel: options of every command."""

from __future__ import annotations

from posttrainllm.config.checks import ALL_COMMANDS, TRAINING
from posttrainllm.config.opt import PATH, Opt

EVERYWHERE: tuple[Opt, ...] = (
    Opt(
        "recipe",
        str,
        None,
        "YAML recipe: keys are these option names; command-line flags override it.",
        TRAINING + ("eval",),
        metavar="FILE",
        panel="Run",
        recipe=False,
        input=PATH,
    ),
    Opt("debug", bool, False, "Show full tracebacks.", ALL_COMMANDS, panel="Run", recipe=False),
)
