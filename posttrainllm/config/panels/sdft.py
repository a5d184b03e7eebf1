"""Options of the panel: sdft's teacher (the starting model shown each demonstration beside the prompt)."""

from __future__ import annotations

from posttrainllm.config.checks import one_of, unit_interval
from posttrainllm.config.opt import Opt
from posttrainllm.spec import own

TEACHER_KINDS = ("ema", "base", "live")  # TRL's SDFTConfig.teacher_model_kind

SDFT: tuple[Opt, ...] = (
    Opt(
        name="teacher_kind",
        type=str,
        default="ema",
        help="sdft's teacher: ema, a moving average of the model, updated every step at --teacher-update-rate (the "
        "paper's); base, the starting model frozen (TRL's default); live, the model itself as it trains.",
        commands=own("sdft"),
        check=one_of(TEACHER_KINDS),
        metavar="KIND",
        panel="SDFT",
    ),
    Opt(
        name="teacher_update_rate",
        type=float,
        default=0.01,
        help="--teacher-kind ema: the share of the model's weights mixed into the teacher's at each step (the "
        "paper's 0.01; TRL's default 0.05).",
        commands=own("sdft"),
        check=unit_interval,
        metavar="FLOAT",
        panel="SDFT",
    ),
)

PANEL, ORDER = SDFT, 45  # this panel's options, and its place in the help (config/panels/__init__.py)
