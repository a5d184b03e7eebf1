"""`posttrainllm generate`: complete prompts with a model (posttrainllm/generate.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands.spec import CommandSpec
from posttrainllm.refs import not_a_file, special_file

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _one_source(command: str, v: Mapping[str, Any]) -> list[str]:
    problems = []
    if (v.get("prompt") is None) == (v.get("prompts") is None):
        problems.append("give either --prompt TEXT or --prompts FILE (one of them)")
    if v.get("output") and v.get("prompt") is not None:
        problems.append("--output goes with --prompts FILE (a single --prompt is printed)")
    if v.get("image") and v.get("prompt") is None:
        problems.append("--image goes with --prompt TEXT (the question about the image)")
    for key, what in (("prompts", "a prompts file"), ("image", "an image file")):
        path = v.get(key) and os.path.expanduser(v[key])
        if path and not os.path.isfile(path) and not special_file(path):  # a FIFO or device: resolve says so
            problems.append(f"--{key}: {v[key]} {not_a_file(path)}; give {what}")
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
