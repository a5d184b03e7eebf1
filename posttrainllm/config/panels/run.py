"""Options of the panel: checkpoints, logging, dry run, output-dir handling."""

from __future__ import annotations

from posttrainllm.config.checks import (
    positive_int,
)
from posttrainllm.config.opt import Opt
from posttrainllm.spec import TRAINING, own

RUN_CONTROL: tuple[Opt, ...] = (
    Opt(
        name="save_steps",
        type=int,
        default=200,
        help="Save a checkpoint every N steps.",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
        panel="Run",
    ),
    Opt(
        name="save_total_limit",
        type=int,
        default=2,
        help="Keep at most N checkpoints.",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
        panel="Run",
    ),
    Opt(
        name="logging_steps",
        type=int,
        default=10,
        help="Log every N steps.",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
        panel="Run",
    ),
    Opt(
        name="eval_steps",
        type=int,
        default=None,
        help="Evaluate every N steps (default: at the end only).",
        commands=TRAINING,
        check=positive_int,
        metavar="N",
        panel="Run",
    ),
    Opt(
        name="dry_run",
        type=bool,
        default=False,
        help="Build model, data and parameter groups, print the plan, write param_groups.json; train nothing.",
        commands=TRAINING,
        panel="Run",
    ),
    Opt(
        name="overwrite",
        type=bool,
        default=False,
        help="Replace what is there: a non-empty --output-dir (its previous run is removed only once the new one is "
        "complete), or generate's existing --output file.",
        commands=TRAINING | own("demo") | own("generate"),
        panel="Run",
    ),
    Opt(
        name="resume",
        type=bool,
        default=False,
        help="Continue from the newest complete checkpoint in --output-dir.",
        commands=TRAINING,
        panel="Run",
    ),
    Opt(
        name="allow_config_change",
        type=bool,
        default=False,
        help="With --resume: accept a different LR / γ / grouping than the checkpoint's run.",
        commands=TRAINING,
        panel="Run",
    ),
)

PANEL, ORDER = RUN_CONTROL, 70  # this panel's options, and its place in the help (config/panels/__init__.py)
