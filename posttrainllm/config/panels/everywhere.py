"""Options of the panel: options of every command."""

from __future__ import annotations

from posttrainllm.config.checks import ALL_COMMANDS, TRAINING
from posttrainllm.config.opt import Opt

EVERYWHERE: tuple[Opt, ...] = (
    Opt(
        "recipe",
        str,
        None,
        "YAML recipe: a file, or the name of a bundled recipe (`posttrainllm recipes` lists them); keys are these "
        "option names; command-line flags override it.",
        TRAINING + ("eval",),
        metavar="FILE|NAME",
        panel="Run",
        recipe=False,
    ),
    Opt("debug", bool, False, "Show full tracebacks.", ALL_COMMANDS, panel="Run", recipe=False),
)
