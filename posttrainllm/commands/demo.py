"""`posttrainllm demo`: the offline end-to-end demo (posttrainllm/demo.py)."""

from __future__ import annotations


def main(cfg) -> None:
    from posttrainllm import demo

    demo.run_demo(cfg)
