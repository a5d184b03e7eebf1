"""One conversion for every value posttrainllm reads as text or YAML: command-line options, recipe values,
`--trainer-arg KEY=VALUE` and `--model-arg KEY=VALUE`. Imports no torch/transformers.

`convert(value, hint)` turns a command-line string or a YAML value into type `hint`:
- bool: true/yes/1/on and false/no/0/off (any case), or a YAML bool;
- int: an integer, or a float with no fraction (8.0 → 8); never a bool;
- float: anything float() reads; never a bool;
- str: any scalar (not a mapping or list);
- `X | None`: "none"/"null" → None, else the first member that takes it (str last);
- Literal, Enum, list (JSON "[...]" or "a,b"), dict (JSON "{...}");
- `Any` (no type known, e.g. a field of a model's config): a string as YAML reads it ("true" → True, "8" → 8,
  "{a: 1}" → a dict); anything else as given.
It raises ValueError when the value cannot be of that type.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

from posttrainllm.config.checks import LLRD_RANGE, llrd_range
from posttrainllm.config.opt import Opt

TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")

_QUOTE = reprlib.Repr()
_QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlevel = 60, 60, 3
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 4


def quote(value: Any, limit: int = 80) -> str:
    """A short repr for error messages: a value of any size (an 80 MB string, a huge list) quotes at most a prefix."""
    text = _QUOTE.repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def yaml_scalar(value: Any) -> Any:
    """A command-line string as YAML would read it ("true" → True, "8" → 8, "{...}" → dict); other values as given."""
    if not isinstance(value, str):
        return value
    import yaml

    try:
        return yaml.safe_load(value) if value.strip() else value
    except yaml.YAMLError:
        return value


def _scalar(value: Any, hint: type) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in TRUE + FALSE:
            return value.lower() in TRUE
        raise ValueError
    if isinstance(value, bool):  # a YAML true is not 1
        raise ValueError
    if hint is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value if isinstance(value, int) else int(str(value).strip())
    if hint is float:
        return float(value)
    raise TypeError(hint)


def _union(value: Any, args: tuple) -> Any:
    none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
    if none and type(None) in args:
        return None
    for arg in sorted((a for a in args if a is not type(None)), key=lambda a: a is str):  # str last: it takes anything
        try:
            return convert(value, arg)
        except (ValueError, TypeError):
            continue
    raise ValueError


def _container(value: Any, hint: Any, origin: Any, args: tuple) -> Any:
    import json

    if origin in (list, tuple) or hint in (list, tuple):
        if isinstance(value, str):
            value = json.loads(value) if value.lstrip().startswith("[") else [v for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError
        return [convert(v, args[0]) for v in value] if args else list(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError from None
    if not isinstance(value, dict):
        raise ValueError
    return value


def convert(value: Any, hint: Any = Any) -> Any:
    """`value` (a command-line string or a YAML value) as type `hint`; ValueError when it cannot be (module doc)."""
    import enum
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return yaml_scalar(value)
    if origin in (typing.Union, types.UnionType):
        return _union(value, args)
    if origin is typing.Literal:
        for arg in args:
            if value == arg or str(value) == str(arg):
                return arg
        raise ValueError
    if hint in (bool, int, float):
        return _scalar(value, hint)
    if hint is str:
        if isinstance(value, (dict, list, tuple)):
            raise ValueError
        return str(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value).value
    if origin in (list, tuple, dict) or hint in (list, tuple, dict):
        return _container(value, hint, origin, args)
    if isinstance(value, hint if isinstance(hint, type) else object):
        return value
    raise ValueError


def key_values(raw: Any, *, numbers: bool) -> dict[str, Any]:
    """KEY=VALUE entries (command line) or a mapping (recipe) as a dict. `numbers`: the values are factors (floats)
    and the key is what precedes the *last* "=" (a pattern may hold "=", a factor never); otherwise the key is what
    precedes the first "=" (a value may hold one) and values are kept as given. ValueError when malformed."""
    items = list(raw.items()) if isinstance(raw, dict) else raw if isinstance(raw, (list, tuple)) else [raw]
    out: dict[str, Any] = {}
    for item in items:
        if isinstance(item, tuple):
            key, value = item
        elif isinstance(item, str) and "=" in item:
            key, value = item.rsplit("=", 1) if numbers else item.split("=", 1)
        else:
            raise ValueError
        if not isinstance(key, str) or not key.strip():
            raise ValueError
        if numbers:
            if isinstance(value, (bool, dict, list)):
                raise ValueError
            value = float(value)
        out[key if numbers else key.strip()] = value
    return out


_KIND = {bool: "true/false", list: "a list of strings", int: "an integer", float: "a number", str: "a string"}


class _Empty(ValueError):
    """A list option given only blanks (or commas)."""


def _entries(opt: Opt, raw: Any) -> list:
    """A list option's value: one string or a list (of strings, or numbers), each string split at commas when the
    option is comma-separated, each entry as the option's entry type (str or float). ValueError when malformed."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not all(
        isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in items
    ):
        raise ValueError
    if items and all(isinstance(x, str) and not x.replace("," if opt.split else "", "").strip() for x in items):
        raise _Empty  # "", " ", "," : nothing given
    if opt.split:
        items = [part for x in items for part in ([p.strip() for p in x.split(",")] if isinstance(x, str) else [x])]
        if any(part == "" for part in items):
            raise ValueError  # "a,,b" or a trailing comma
    return [_scalar(x, float) if opt.item_type is float else str(x) for x in items]


def option_value(opt: Opt, raw: Any, origin: str) -> tuple[Any, str | None]:
    """Turn a CLI string or a YAML value into the option's type. Returns (value, problem)."""
    if raw is None:
        return None, None
    try:
        if opt.type is dict:
            return key_values(raw, numbers=opt.item_type is float), None
        if opt.type is list:
            return _entries(opt, raw), None
        value = convert(raw, opt.type)
        return (not value if opt.negates and origin == "cli" else value), None
    except _Empty:
        where = f"{opt.cli_flag}" if origin == "cli" else f"recipe key '{opt.recipe_key}'"
        return None, f"{where} is empty ({quote(raw)}): give a value ({opt.metavar or opt.recipe_key})"
    except (TypeError, ValueError):
        pass
    where = f"{opt.cli_flag}" if origin == "cli" else f"recipe key '{opt.recipe_key}'"
    kind = "a list of numbers" if opt.type is list and opt.item_type is float else _KIND.get(opt.type)
    kind = kind or f"{opt.metavar} entries (a mapping in recipes)"
    extra = f" {LLRD_RANGE}" if opt.check is llrd_range else ""
    return None, f"{where}: expected {kind}{extra}, got {quote(raw)}"


def check_keyed(
    flag: str,
    raw: Mapping[str, Any],
    fields: Mapping[str, Any],
    *,
    owned: Mapping[str, str],
    unknown: str,
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """KEY=VALUE settings handed on to a library (`--trainer-arg` to the trainer's config class, `--model-arg` to
    `from_pretrained`), checked in one pass: a key an option owns names that option, a key not in `fields` (name →
    type; `Any` for untyped) is `unknown` with the closest names, and each value is converted to its field's type.
    Every problem is reported at once (ConfigErrors, exit 2); `aliases` maps an old key to its field.

    E.g. check_keyed("--trainer-arg", {"packin": "true"}, {"packing": bool}, owned={}, unknown="not a field of X")
    raises "--trainer-arg packin: not a field of X; did you mean packing?"."""
    import difflib

    from posttrainllm.errors import ConfigErrors

    problems, out = [], {}
    for key, value in raw.items():
        name = (aliases or {}).get(key, key)
        if name in owned:
            problems.append(f"{flag} {key}: set it with {owned[name]} (the option posttrainllm owns)")
        elif name not in fields:
            close = difflib.get_close_matches(name, list(fields), 3)
            problems.append(f"{flag} {key}: {unknown}" + (f"; did you mean {', '.join(close)}?" if close else ""))
        else:
            try:
                out[name] = convert(value, fields[name])
            except ValueError:
                hint, text = fields[name], str(value)
                type_name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
                text = text if len(text) <= 60 else text[:57] + "..."
                problems.append(f"{flag} {key}={text}: expected {type_name}")
    if problems:
        raise ConfigErrors(problems)
    return out
