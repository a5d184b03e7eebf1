"""The option table, one module per help panel. Each module holds `PANEL` (its options) and `ORDER` (its place in
the help, ascending); `collect` finds every module of this folder, so a command's own panel joins the table by being
written here, with no list to edit."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def collect() -> tuple[Any, ...]:
    """Every panel's options, the panels in their ORDER."""
    found = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
    return tuple(o for panel in sorted(found, key=lambda m: m.ORDER) for o in panel.PANEL)
