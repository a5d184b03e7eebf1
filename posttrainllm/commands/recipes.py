"""`posttrainllm recipes`: the curated recipes shipped with the package, one line each (name, command, what it does).

A recipe's header says both: line 1 is its invocation (`# posttrainllm sft --recipe alpaca-sft-llrd`), line 2 a
one-line description. Header lines are YAML comments, so they add no key (unknown keys stay errors)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from posttrainllm.config.bundled import BUNDLED_DIR, bundled_recipes
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

SPEC = CommandSpec(
    name="recipes",
    help="List the curated recipes shipped with posttrainllm, one line each: run one with `--recipe NAME`.",
)

INVOCATION = "# posttrainllm "


def header(path: Path) -> tuple[str, str]:
    """(command, description) from a recipe's first two comment lines; ("?", "") where they are missing."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[:2] + ["", ""]
    first, second = lines[0], lines[1]
    command = first[len(INVOCATION) :].split()[0] if first.startswith(INVOCATION) and first.split()[2:] else "?"
    description = second[1:].strip() if second.startswith("#") else ""
    return command, description


def rows() -> list[tuple[str, str, str]]:
    """(name, command, description) of every bundled recipe, by name."""
    return [(name, *header(path)) for name, path in bundled_recipes().items()]


def main(cfg: RunConfig) -> None:
    table = [("NAME", "COMMAND", "DESCRIPTION"), *rows()]
    widths = [max(len(r[i]) for r in table) for i in range(2)]
    for name, command, description in table:
        print(f"{name:<{widths[0]}}  {command:<{widths[1]}}  {description}".rstrip())
    print(
        f"\nRun one with `posttrainllm COMMAND --recipe NAME` (command-line flags override its keys). "
        f"The files are in {BUNDLED_DIR}: copy one to make your own."
    )
