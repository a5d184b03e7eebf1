"""Options of the panel: generate."""

from __future__ import annotations

from posttrainllm.config.checks import (
    SAMPLING,
    non_negative,
    one_of,
    positive_int,
    unit_interval,
)
from posttrainllm.config.opt import PATH, Opt

GENERATE: tuple[Opt, ...] = (
    Opt("prompt", str, None, "Prompt to complete (printed to stdout).", ("generate",), metavar="TEXT", panel="Inputs"),
    Opt(
        "prompts",
        str,
        None,
        "File of prompts: one per line, or JSON Lines with prompt / messages / instruction; writes JSON Lines.",
        ("generate",),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt("system", str, None, "System message put before the prompt.", ("generate",), metavar="TEXT", panel="Inputs"),
    Opt(
        "prompt_format",
        str,
        "auto",
        "auto (the chat template when the tokenizer has one, else plain), "
        "chat, alpaca (the template sft uses for Alpaca data) or plain.",
        ("generate",),
        one_of(("auto", "chat", "alpaca", "plain")),
        "FORMAT",
    ),
    Opt("max_new_tokens", int, 128, "Most tokens to generate per prompt.", ("generate",), positive_int, "N"),
    Opt(
        "temperature",
        float,
        None,
        "Sampling temperature (0 = greedy). Default: 0 for generate, 1.0 for grpo/rloo/distill (which sample "
        "completions to learn from; distill also softens both distributions by it).",
        ("generate",) + SAMPLING,
        non_negative,
        "T",
    ),
    Opt(
        "top_p",
        float,
        1.0,
        "Nucleus sampling: keep the smallest token set with this much probability.",
        ("generate",),
        unit_interval,
        "P",
    ),
    Opt(
        "output",
        str,
        None,
        "With --prompts: write the JSON Lines here instead of stdout.",
        ("generate",),
        metavar="FILE",
        panel="Run",
    ),
)
