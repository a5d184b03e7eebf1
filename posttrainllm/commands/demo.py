"""`posttrainllm demo`: the offline end-to-end demo (posttrainllm/demo.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from posttrainllm.commands.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

SPEC = CommandSpec(
    name="demo",
    help="Offline end-to-end demo: pre-train a tiny model on stdlib sources, SFT it flat vs with LLRD, compare.",
)


def main(cfg: RunConfig) -> None:
    # by name: the demo resolves the configs of the commands it runs (posttrainllm/config/, which reads this spec)
    importlib.import_module("posttrainllm.demo").run_demo(cfg)
