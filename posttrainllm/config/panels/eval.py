"""Options of the panel: eval (and the demo)."""

from __future__ import annotations

from posttrainllm.config.checks import (
    positive_int,
)
from posttrainllm.config.opt import PATH, Opt

EVAL: tuple[Opt, ...] = (
    Opt(
        "text",
        list,
        [],
        "Text file to measure perplexity on (repeatable).",
        ("eval",),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        "reference",
        str,
        None,
        "Base model to compare with: adds the mean per-token KL(reference ‖ model) on each --text "
        "(a directory, .gguf file or hub id; same tokenizer).",
        ("eval",),
        metavar="PATH_OR_HUB_ID",
        panel="Inputs",
        input=PATH,
    ),
    Opt(
        "sft_dataset",
        str,
        None,
        "Instruction set whose mean completion-token loss is reported.",
        ("eval",),
        metavar="FILE",
        panel="Inputs",
        input=PATH,
    ),
    Opt("json", bool, False, "Print only a JSON object with the results.", ("eval",), panel="Run", recipe=False),
    Opt("eval_batch_size", int, 8, "Windows per forward pass.", ("eval",), positive_int, "N"),
    Opt("quick", bool, False, "Smaller demo (about a minute).", ("demo",), panel="Run"),
)
