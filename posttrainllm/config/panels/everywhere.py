"""Options of the panel: options of every command."""

from __future__ import annotations

from posttrainllm.config.opt import PATH, Opt
from posttrainllm.spec import EVERY, TRAINING, own

EVERYWHERE: tuple[Opt, ...] = (
    Opt(
        name="recipe",
        type=str,
        default=None,
        help="YAML recipe: a file, or the name of a bundled recipe (`posttrainllm recipes` lists them); keys are these "
        "option names; command-line flags override it.",
        commands=TRAINING | own("eval"),
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
        commands=EVERY,
        panel="Run",
        recipe=False,
    ),
)

PANEL, ORDER = EVERYWHERE, 100  # this panel's options, and its place in the help (config/panels/__init__.py)
