"""Every command's spec, in the order `posttrainllm --help` lists them. The one list a new command joins: the CLI
registers its commands from it, and config/ reads each command's defaults, checks and help from its spec.

Read by the CLI and config/ only; the run itself gets its spec as a value (a command's `main` hands its own `SPEC` to
posttrainllm/lifecycle.py), so nothing the run imports reaches back here."""

from __future__ import annotations

from posttrainllm.commands import (
    demo,
    distill,
    dpo,
    finetune,
    generate,
    grpo,
    kto,
    merge,
    pretrain,
    recipes,
    reward,
    rloo,
    sdft,
    sft,
)  # fmt: skip
from posttrainllm.commands import eval as evaluate
from posttrainllm.commands.spec import CommandSpec

SPECS: dict[str, CommandSpec] = {
    m.SPEC.name: m.SPEC
    for m in (
        pretrain,
        sft,
        dpo,
        kto,
        reward,
        grpo,
        rloo,
        distill,
        sdft,
        finetune,
        evaluate,
        generate,
        merge,
        recipes,
        demo,
    )
}


def spec_of(command: str) -> CommandSpec:
    return SPECS[command]
