"""The run's inputs, read off the option table: every option marked `Opt.input` names something the run reads (a
model, data, a config, a recipe, reward code). The output-directory guard (posttrainllm/rundir/outdir.py), the resume
fingerprint (posttrainllm/rundir/fingerprint.py) and `generate --output` all take this one list, so a new input
option is guarded and compared once it is marked. Imports no torch/transformers, and imports none of the user's code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from posttrainllm.config.opt import CODE, Opt
from posttrainllm.config.options import by_name
from posttrainllm.errors import shorten

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def input_options(names: Iterable[str] | None = None, opts: Iterable[Opt] | None = None) -> list[Opt]:
    """The options that name something the run reads: among `opts` (a command's own definitions) when given, else
    among the first definitions of `names` (a training command's options: RunConfig.names), else of every option."""
    if opts is None:
        table = by_name()
        opts = table.values() if names is None else [table[n] for n in names if n in table]
    return [o for o in opts if o.input]


def code_file(spec: str) -> str | None:
    """The file a `module:function` or `path/to/file.py:function` spec names (None when it names none that exists).

    A module is looked for as Python would import it, from the working directory and then `sys.path`, without
    importing anything (so no code runs): `pkg.rewards:f` → `pkg/rewards.py` or `pkg/rewards/__init__.py`."""
    module, sep, _ = spec.rpartition(":")
    if not sep or not module:
        return None
    if module.endswith(".py"):
        path = os.path.expanduser(module)
        return path if os.path.isfile(path) else None
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    for base in dict.fromkeys([os.getcwd(), *(p or os.getcwd() for p in sys.path if isinstance(p, str))]):
        stem = os.path.join(base, *parts)
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def entries(value: Any) -> list[str]:
    """An input option's value as a list of its entries (one path, or the paths of a repeatable option)."""
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, str) and v]
    return []


def local_path(opt: Opt, entry: str) -> str | None:
    """The local file or directory an entry of an input option reads (None for a hub id, a preset, a module that
    is not found, or a path that is not there)."""
    path = code_file(entry) if opt.input == CODE else os.path.expanduser(entry)
    try:
        return path if path and os.path.exists(path) else None
    except (OSError, ValueError):
        return None


def local_inputs(values: RunConfig | dict, opts: Iterable[Opt] | None = None) -> list[tuple[str, str]]:
    """(label, path) for every local file or directory the run reads: the label is the flag and the value as given
    (`--teacher runs/prev`), the path what it reads on disk. `values`: a RunConfig, or a mapping of option values;
    `opts`: the command's option definitions (merge's `--tuned` is its `model`), else the first definition of each
    option `values` holds."""
    found = []
    get = values.get if isinstance(values, dict) else lambda name: getattr(values, name, None)
    names = list(values) if isinstance(values, dict) else getattr(values, "names", None)
    for o in input_options(names, opts):
        for entry in entries(get(o.name)):
            path = local_path(o, entry)
            if path is not None:
                found.append((f"{o.cli_flag} {entry}", path))
    return found


def inside(path: str, folder: str) -> bool:
    """`path` is `folder` or lies under it, once both are resolved (symbolic links, `..`, `~`)."""
    try:
        p, d = os.path.realpath(os.path.expanduser(path)), os.path.realpath(os.path.expanduser(folder))
    except (OSError, ValueError):
        return False
    return p == d or p.startswith(d.rstrip(os.sep) + os.sep)


def eval_cache_problems(values: dict, opts: Iterable[Opt] | None = None) -> list[str]:
    """--eval-cache names a folder (created when missing) that is none of the run's inputs and lies inside none: the
    cache writes there, and a base or data set written into would no longer be what the run read."""
    cache = values.get("eval_cache")
    if not cache:
        return []
    path = os.path.expanduser(str(cache))
    if os.path.lexists(path) and not os.path.isdir(path):
        return [f"--eval-cache {shorten(str(cache))} is not a folder: name a folder (it is created when missing)"]
    for label, source in local_inputs(values, opts):
        if inside(path, source):
            return [
                f"--eval-cache {shorten(str(cache))} is inside {shorten(label, 120)}: the cache would write into "
                "what the run reads; choose a folder outside the run's inputs"
            ]
    return []


def output_file_problems(flag: str, output: str, overwrite: bool, inputs: list[tuple[str, str]]) -> list[str]:
    """Why `output` cannot be the file a command writes (empty when it can): its folder must exist, it must not be a
    directory or a special file, an existing file needs --overwrite (then it is replaced whole, never written in
    place), and it must be none of the run's inputs nor lie inside one (a model directory)."""
    shown = shorten(output)
    if "\0" in output:
        return [f"{flag} {shown} holds a NUL character: name a file"]
    if output.endswith(("/", os.sep)):
        return [f"{flag} {shown} ends with a path separator: give a file name"]
    path = os.path.expanduser(output)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as e:  # a name too long, a file where a folder should be, no permission to look
        return [f"{flag} {shown} cannot be written: {e.strerror or e}"]
    if not os.path.isdir(folder):
        return [f"{flag} {shown}: its folder {shorten(folder)} does not exist; create it or pick another path"]
    if not os.access(folder, os.W_OK | os.X_OK):
        return [f"{flag} {shown}: its folder {shorten(folder)} is not writable"]
    real = os.path.realpath(path)
    for label, input_path in sorted(inputs, key=lambda item: os.path.realpath(item[1]) != real):  # the same file first
        if inside(path, input_path):
            what = "is" if real == os.path.realpath(input_path) else "is inside"
            return [f"{flag} {shown} {what} {shorten(label)}, which this run reads: write the output elsewhere"]
    if os.path.isdir(path):
        return [f"{flag} {shown} is a directory: give a file name"]
    if os.path.lexists(path) and not os.path.islink(path) and not os.path.isfile(path):
        return [f"{flag} {shown} is not a regular file: leave out {flag} to print to stdout, or name a file"]
    if os.path.lexists(path) and not overwrite:
        return [f"{flag} {shown} already exists: pass --overwrite to replace it, or pick another path"]
    return []
