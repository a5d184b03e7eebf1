"""Options of the panel: generate."""

from __future__ import annotations

from posttrainllm.config.checks import (
    non_negative,
    one_of,
    positive_int,
    unit_interval,
)
from posttrainllm.config.opt import PATH, Opt
from posttrainllm.spec import SAMPLING, own

GENERATE: tuple[Opt, ...] = (
    Opt(
        name="prompt",
        type=str,
        default=None,
        help="Prompt to complete (printed to stdout).",
        commands=own("generate"),
        metavar="TEXT",
        panel="Inputs",
    ),
    Opt(
        name="prompts",
        type=str,
        default=None,
        help="File of prompts: one per line, or JSON Lines with prompt / messages / instruction (and images, for a "
        "vision-language model); writes JSON Lines.",
        commands=own("generate"),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="image",
        type=str,
        default=None,
        help="Image file for --prompt (a vision-language model): it goes before the prompt's text.",
        commands=own("generate"),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="system",
        type=str,
        default=None,
        help="System message put before the prompt.",
        commands=own("generate"),
        metavar="TEXT",
        panel="Inputs",
    ),
    Opt(
        name="prompt_format",
        type=str,
        default="auto",
        help="auto (the chat template when the tokenizer has one, else plain), "
        "chat, alpaca (the template sft uses for Alpaca data) or plain.",
        commands=own("generate"),
        check=one_of(("auto", "chat", "alpaca", "plain")),
        metavar="FORMAT",
    ),
    Opt(
        name="max_new_tokens",
        type=int,
        default=128,
        help="Most tokens to generate per prompt.",
        commands=own("generate"),
        check=positive_int,
        metavar="N",
    ),
    Opt(
        name="temperature",
        type=float,
        default=None,
        help="Sampling temperature (0 = greedy; grpo, rloo and distill sample completions to learn from, and "
        "distill also softens both distributions by it).",
        defaults_from="temperature",
        commands=own("generate") | SAMPLING,
        check=non_negative,
        metavar="T",
    ),
    Opt(
        name="top_p",
        type=float,
        default=1.0,
        help="Nucleus sampling: keep the smallest token set with this much probability.",
        commands=own("generate"),
        check=unit_interval,
        metavar="P",
    ),
    Opt(
        name="output",
        type=str,
        default=None,
        help="With --prompts: write the JSON Lines here instead of stdout.",
        commands=own("generate"),
        metavar="FILE",
        panel="Run",
    ),
)

PANEL, ORDER = GENERATE, 90  # this panel's options, and its place in the help (config/panels/__init__.py)
