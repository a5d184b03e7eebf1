"""RunConfig: the resolved configuration of one command run, generated from the option table (no field is listed
twice). Imports no torch/transformers."""

from __future__ import annotations

import dataclasses
from typing import Any

from posttrainllm.config.opt import Opt
from posttrainllm.config.options import EXTRA_OPTIONS, OPTIONS, options_for

_SKIP_IN_RECORD = frozenset({"debug", "json", "recipe", "dry_run", "overwrite", "resume", "allow_config_change"})


def _annotation(o: Opt) -> Any:
    if o.type is dict:
        return dict[str, float] | None if o.item_type is float else dict[str, Any] | None
    if o.type is list:
        return list[o.item_type] | None
    return o.type | None


def _fields() -> list[tuple[str, Any, Any]]:
    seen: dict[str, Opt] = {}
    for o in (*OPTIONS, *EXTRA_OPTIONS.values()):
        seen.setdefault(o.name, o)
    return [
        ("command", str),
        ("sources", dict[str, str], dataclasses.field(default_factory=dict)),  # option -> default|recipe|cli|model
        ("argv", list[str], dataclasses.field(default_factory=list)),  # the command line as given: COMMAND OPTIONS...
        *((name, _annotation(o), dataclasses.field(default=None)) for name, o in seen.items()),
    ]


def _option_names(self) -> list[str]:
    return [o.name for o in options_for(self.command)]


def _to_dict(self) -> dict[str, Any]:
    """The command's options (not the run switches) for run_config.json and resume comparisons."""
    return {"command": self.command, **{k: getattr(self, k) for k in self.option_names() if k not in _SKIP_IN_RECORD}}


RunConfig = dataclasses.make_dataclass(
    "RunConfig",
    _fields(),
    frozen=True,
    namespace={"option_names": _option_names, "to_dict": _to_dict},
)
RunConfig.__module__ = __name__
RunConfig.__doc__ = """The resolved configuration of one command run: one typed field per option of the table (None for
options the command does not have), plus where each value came from and the command line as given. Frozen: a step
that changes a value makes a new config (`dataclasses.replace`)."""
