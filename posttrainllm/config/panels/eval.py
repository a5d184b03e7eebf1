"""Options of the panel: eval (and the demo)."""

from __future__ import annotations

from posttrainllm.config.checks import (
    positive_int,
)
from posttrainllm.config.opt import PATH, Opt
from posttrainllm.spec import own

EVAL: tuple[Opt, ...] = (
    Opt(
        name="text",
        type=list,
        default=[],
        help="Text file to measure perplexity on (repeatable).",
        commands=own("eval"),
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
        commands=own("eval"),
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="sft_dataset",
        type=str,
        default=None,
        help="Instruction set whose mean completion-token loss is reported: prompt/completion or Alpaca rows (the "
        "completion scored), or conversations (messages, ShareGPT; the assistant turns scored, as sft trains them).",
        commands=own("eval"),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        name="json",
        type=bool,
        default=False,
        help="Print only a JSON object with the results.",
        commands=own("eval"),
        panel="Run",
        recipe=False,
    ),
    Opt(
        name="eval_batch_size",
        type=int,
        default=8,
        help="Windows per forward pass.",
        commands=own("eval"),
        check=positive_int,
        metavar="N",
    ),
    Opt(
        name="quick", type=bool, default=False, help="Smaller demo (about a minute).", commands=own("demo"), panel="Run"
    ),
)

PANEL, ORDER = EVAL, 80  # this panel's options, and its place in the help (config/panels/__init__.py)
