"""`posttrainllm generate`: complete prompts with a model (posttrainllm/generate.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _one_source(command: str, v: Mapping[str, Any]) -> list[str]:
    problems = []
    if (v.get("prompt") is None) == (v.get("prompts") is None):
        problems.append("give either --prompt TEXT or --prompts FILE (one of them)")
    if v.get("output") and v.get("prompt") is not None:
        problems.append("--output goes with --prompts FILE (a single --prompt is printed)")
    if v.get("prompts") and not os.path.isfile(os.path.expanduser(v["prompts"])):
        problems.append(f"--prompts: {v['prompts']} does not exist")
    if v.get("image") and v.get("prompt") is None:
        problems.append("--image goes with --prompt TEXT (the question about the image)")
    if v.get("image") and not os.path.isfile(os.path.expanduser(v["image"])):
        problems.append(f"--image: {v['image']} does not exist")
    return problems


SPEC = CommandSpec(
    name="generate",
    help="Complete prompts with a trained model (chat template when the tokenizer has one): a quick look at a "
    "fine-tune.",
    defaults={"temperature": 0.0},  # greedy
    checks=(_one_source,),
)


def main(cfg: RunConfig) -> None:
    from posttrainllm import generate

    generate.run(cfg)
