"""Options of the panel: eval (and the demo)."""

from __future__ import annotations

from posttrainllm.config.checks import (
    positive_int,
)
from posttrainllm.config.opt import PATH, Opt

EVAL: tuple[Opt, ...] = (
    Opt(
        name="text",
        type=list,
        default=[],
        help="Text file to measure perplexity on (repeatable).",
        commands=("eval",),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="reference",
        type=str,
        default=None,
        help="Base model to compare with: adds the mean per-token KL(reference ‖ model) on each --text "
        "(a directory, .gguf file or hub id; same tokenizer).",
        commands=("eval",),
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="sft_dataset",
        type=str,
        default=None,
        help="Instruction set whose mean completion-token loss is reported.",
        commands=("eval",),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="json",
        type=bool,
        default=False,
        help="Print only a JSON object with the results.",
        commands=("eval",),
        panel="Run",
        recipe=False,
    ),
    Opt(
        name="eval_batch_size",
        type=int,
        default=8,
        help="Windows per forward pass.",
        commands=("eval",),
        check=positive_int,
        metavar="N",
    ),
    Opt(name="quick", type=bool, default=False, help="Smaller demo (about a minute).", commands=("demo",), panel="Run"),
)
