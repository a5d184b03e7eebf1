"""`Opt`: one option's definition. The table of them (posttrainllm/config/options.py) is the single source of the
command-line flags, the recipe keys, the RunConfig fields and the option table of docs/options.md."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrainllm.spec import Family

PATH, CODE = "path", "code"  # the kinds of Opt.input


@dataclass(frozen=True, kw_only=True)
class Opt:
    """One option: its recipe key is `name`, its flag is `--name-with-dashes` (or `flag`). Built with keywords only
    (`Opt(name="lr", type=float, ...)`), so that an entry reads the same in every panel."""

    name: str
    type: type  # float, int, str, bool, list, dict (repeatable KEY=VALUE on the command line, a mapping in recipes)
    default: Any
    help: str
    commands: Family  # the commands that take it, as a test over their specs (posttrainllm/spec.py)
    check: Callable[[Any], str | None] | None = None
    metavar: str | None = None
    flag: str | None = None
    bare: Any = None  # value of the flag given without a value (e.g. `--llrd` alone → 0.95)
    negates: bool = False  # a bool option whose flag turns it off (`--no-padding-free`: padding_free false);
    # its recipe key holds the value itself (`padding_free: false`)
    required: bool = False
    required_unless: str | None = None  # another option whose value stands in for this one (merge: max_forgetting)
    recipe: bool = True  # may appear in a recipe
    panel: str = "Training"
    item: builtins.type | None = None  # dict: the values' type (float default; object = kept as given, checked later);
    # list: the entries' type (str default, or float)
    split: bool = False  # list options: one value may also hold several entries separated by commas ("a,b")
    key: str | None = None  # recipe key and flag name when they differ from the internal name
    deprecated: tuple[str, ...] = ()  # older names still read (as a recipe key and as --name-with-dashes), never shown
    # what the run reads through this option: PATH (a file or directory: a model, data, a config; or a hub id) or
    # CODE (module:function or path/to/file.py:function). Inputs are never inside an output the run replaces, and a
    # resume compares them by content (posttrainllm/config/inputs.py).
    input: str | None = None
    # an option whose default depends on the command ("lr", "max_length", "beta", "temperature"): its help ends with
    # the defaults the command specs give (config/per_command.full_help), written from the specs, never by hand
    defaults_from: str | None = None

    @property
    def item_type(self) -> builtins.type:
        """The type of a dict option's values (float unless set) or a list option's entries (str unless set)."""
        return self.item or (float if self.type is dict else str)

    @property
    def recipe_key(self) -> str:
        return self.key or self.name

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.recipe_key.replace("_", "-")

    @property
    def deprecated_flags(self) -> tuple[str, ...]:
        return tuple("--" + k.replace("_", "-") for k in self.deprecated)
