"""The curated recipes shipped inside the package (posttrainllm/recipes/*.yaml), by name. A leaf: imports nothing of
the project, so `posttrainllm recipes` and the recipe loader (config/recipe.py) both read it."""

from __future__ import annotations

from pathlib import Path

BUNDLED_DIR = Path(__file__).resolve().parents[1] / "recipes"  # posttrainllm/recipes/


def bundled_recipes() -> dict[str, Path]:
    """The curated recipes shipped with the package, by name (the file's stem), sorted:
    {"alpaca-sft": .../posttrainllm/recipes/alpaca-sft.yaml, ...}."""
    return {p.stem: p for p in sorted(BUNDLED_DIR.glob("*.yaml"), key=lambda p: p.stem)}
