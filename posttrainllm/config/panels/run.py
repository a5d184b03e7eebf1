"""Options of the panel: checkpoints, logging, dry run, output-dir handling."""

from __future__ import annotations

from posttrainllm.config.checks import (
    TRAINING,
    positive_int,
)
from posttrainllm.config.opt import Opt

RUN_CONTROL: tuple[Opt, ...] = (
    Opt("save_steps", int, 200, "Save a checkpoint every N steps.", TRAINING, positive_int, "N", panel="Run"),
    Opt("save_total_limit", int, 2, "Keep at most N checkpoints.", TRAINING, positive_int, "N", panel="Run"),
    Opt("logging_steps", int, 10, "Log every N steps.", TRAINING, positive_int, "N", panel="Run"),
    Opt(
        "eval_steps",
        int,
        None,
        "Evaluate every N steps (default: at the end only).",
        TRAINING,
        positive_int,
        "N",
        panel="Run",
    ),
    Opt(
        "dry_run",
        bool,
        False,
        "Build model, data and parameter groups, print the plan, write param_groups.json; train nothing.",
        TRAINING,
        panel="Run",
    ),
    Opt(
        "overwrite",
        bool,
        False,
        "Replace what is there: a non-empty --output-dir (its previous run is removed only once the new one is "
        "complete), or generate's existing --output file.",
        TRAINING + ("demo", "generate"),
        panel="Run",
    ),
    Opt("resume", bool, False, "Continue from the newest complete checkpoint in --output-dir.", TRAINING, panel="Run"),
    Opt(
        "allow_config_change",
        bool,
        False,
        "With --resume: accept a different LR / γ / grouping than the checkpoint's run.",
        TRAINING,
        panel="Run",
    ),
)
