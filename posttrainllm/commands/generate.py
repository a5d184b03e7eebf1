"""`posttrainllm generate`: complete prompts with a model (posttrainllm/generate.py)."""

from __future__ import annotations


def main(cfg) -> None:
    from posttrainllm import generate

    generate.run(cfg)
