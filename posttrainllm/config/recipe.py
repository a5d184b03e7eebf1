"""Recipes: YAML files of flat `option: value` lines, read with bounds on hostile input; and the hint naming the recipe
that produces a missing model directory. Imports no torch/transformers."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from posttrainllm.config.bundled import BUNDLED_DIR, bundled_recipes
from posttrainllm.config.coerce import quote
from posttrainllm.errors import UsageError, shorten
from posttrainllm.refs import special_file

RECIPE_MAX_BYTES = 1 << 20  # recipes are a few hundred bytes; a bound keeps a hostile file from costing memory
RECIPE_MAX_NODES = 10_000  # values after YAML aliases are expanded (a flat recipe has a few dozen)


def recipe_file(ref: str) -> Path:
    """The file `--recipe REF` names: REF itself when that path exists (a file of the user's always wins), else the
    bundled recipe named REF (`alpaca-sft-llrd` or `alpaca-sft-llrd.yaml`, no folder). Neither: a UsageError listing
    the bundled names. E.g. recipe_file("alpaca-sft-llrd") is BUNDLED_DIR / "alpaca-sft-llrd.yaml", unless the
    working directory holds a file or folder named alpaca-sft-llrd."""
    p = Path(ref).expanduser()
    try:
        if p.exists() or p.is_symlink():
            return p
    except OSError as e:  # e.g. a name longer than the file system allows
        raise UsageError(f"cannot read recipe {shorten(ref)}: {e.strerror or e}") from None
    bundled = bundled_recipes()
    name = ref.removesuffix(".yaml")
    if name in bundled and Path(name).name == name:
        return bundled[name]
    stem = Path(ref).stem
    close = difflib.get_close_matches(stem[:100], bundled, n=1)
    hint = f" (the bundled recipe of that name is `--recipe {stem}`)" if stem in bundled else ""
    hint = hint or (f" (did you mean `--recipe {close[0]}`?)" if close else "")
    raise UsageError(
        f"recipe not found: {shorten(ref)} is neither a file nor a bundled recipe{hint}; bundled recipes: "
        f"{', '.join(bundled) or 'none'} (`posttrainllm recipes` describes them)"
    )


def _children(node) -> list:
    """A YAML node's child nodes (a mapping's keys and values), computed in one place."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def _expanded_nodes(root, cap: int = RECIPE_MAX_NODES) -> int:
    """How many nodes the YAML document holds once every alias is expanded, computed on the node graph (shared
    nodes counted once per use, in linear time, without expanding anything). Recursive aliases count as > cap."""

    size: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            size[key] = min(cap + 1, 1 + sum(size[id(k)] for k in _children(node)))
            continue
        if key in size:
            continue
        if key in on_path:
            return cap + 1  # an alias to an enclosing node: infinite when expanded
        on_path.add(key)
        stack.append((node, True))
        for kid in _children(node):
            if id(kid) in on_path:
                return cap + 1
            if id(kid) not in size:
                stack.append((kid, False))
    return size[id(root)]


def _unique_key_loader(shown: str):
    """A SafeLoader class whose mappings refuse a key given twice (PyYAML keeps the last one silently), naming the
    key, both lines and the recipe, in every mapping (nested ones such as trainer_args too)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # keys merged in with << may be overridden: that is what merging is for
                    key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: SafeLoader's own error says so
                        break
                    if first is not None:
                        raise UsageError(
                            f"recipe {shown}: key {quote(key)} is given twice (line {first} and line {line}); "
                            "keep one of them"
                        )
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def load_recipe(path: str) -> dict[str, Any]:
    """Read a YAML recipe (a file, or a bundled recipe's name: `recipe_file`) into a flat dict; problems are
    UsageErrors (exit 2).

    Bounded on hostile input: only regular files, at most RECIPE_MAX_BYTES, and at most RECIPE_MAX_NODES values
    once YAML aliases are expanded (a 400-byte "billion laughs" is refused before anything is expanded)."""
    import yaml

    p = recipe_file(path)
    shown = shorten(path)
    if not p.exists():
        raise UsageError(f"recipe not found: {shown} (a link to nothing)")
    if p.is_dir():
        raise UsageError(f"recipe {shown} is a directory; pass a .yaml file")
    kind = special_file(str(p))
    if kind:
        raise UsageError(f"recipe {shown} is {kind}, not a regular file; pass a .yaml file")
    try:
        with open(p, "rb") as fh:
            raw = fh.read(RECIPE_MAX_BYTES + 1)
    except OSError as e:
        raise UsageError(f"cannot read recipe {shown}: {e.strerror or e}") from None
    if len(raw) > RECIPE_MAX_BYTES:
        raise UsageError(
            f"recipe {shown} is larger than {RECIPE_MAX_BYTES // 1024} KiB; a "
            "recipe is a short list of option: value lines"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"recipe {shown} is not UTF-8 text (byte {e.start})") from None
    loader = _unique_key_loader(shown)(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_nodes(node) > RECIPE_MAX_NODES:
            raise UsageError(
                f"recipe {shown} holds more than {RECIPE_MAX_NODES} values once its "
                "YAML aliases (*name) are expanded; a recipe is a flat list of option: "
                "value lines"
            )
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise UsageError(f"recipe {shown}{line}: invalid YAML ({shorten(problem)})") from None
    except RecursionError:
        raise UsageError(
            f"recipe {shown} is nested too deeply; a recipe is a flat list of option: value lines"
        ) from None
    finally:
        loader.dispose()
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"recipe {shown} must be a mapping of option names to values (got {type(data).__name__})")
    out: dict[str, Any] = {}
    spelled: dict[str, Any] = {}
    for k, v in data.items():
        if not isinstance(k, (str, int, float, bool)):
            raise UsageError(f"recipe {shown}: keys must be option names, got {quote(k)}")
        name = str(k).replace("-", "_")
        if name in out:
            raise UsageError(
                f"recipe {shown}: {quote(spelled[name])} and {quote(k)} are the same option; keep one of them"
            )
        out[name], spelled[name] = v, k
    return out


def producing_recipe(recipe: str | None, ref: str) -> str | None:
    """When `ref` (e.g. runs/shakespeare-base) is the output_dir of a recipe beside `recipe`, among the bundled
    recipes or in ./recipes, a hint naming the command that produces it."""
    dirs = []
    if recipe:
        try:
            dirs.append(recipe_file(recipe).parent)
        except UsageError:
            pass
    dirs += [BUNDLED_DIR, Path("recipes")]
    want = os.path.normpath(ref.rstrip("/"))
    seen = set()
    for d in dirs:
        if not d.is_dir() or d.resolve() in seen:
            continue
        seen.add(d.resolve())
        for f in sorted(d.glob("*.y*ml")):
            try:
                data = load_recipe(str(f))
            except UsageError:
                continue
            if isinstance(data.get("output_dir"), str) and os.path.normpath(data["output_dir"].rstrip("/")) == want:
                first = f.read_text(encoding="utf-8", errors="replace").splitlines()[:1]
                command = (
                    first[0][2:].strip()
                    if first and first[0].startswith("# posttrainllm ")
                    else f"posttrainllm ... --recipe {f}"
                )
                shown = f.stem if d.resolve() == BUNDLED_DIR else f
                return f"{ref} is what recipe {shown} produces: run `{command}` first, or pass --model"
    return None
