"""A LoRA adapter checked against --base before it is merged into it: peft merges an adapter of another base
without a word when the names line up (an adapter of a 3-block model loses block 2 in a 2-block base; one of a
2-block model leaves a 3-block base's block 2 untouched), so the adapter is compared with what it was trained on:

- the base it records (``base_model_name_or_path`` in adapter_config.json), when that is a local model directory:
  its block count and width against --base's;
- its own tensors (the safetensors header of adapter_model.safetensors): every targeted module is in --base, at a
  block --base has, with the shape its lora_A/lora_B pair was trained for; and, when the adapter targets modules by
  plain name in every block, it holds weights for every block of --base;
- its weights are finite.

Every refusal is one UsageError naming the adapter and --base. Reads headers and the adapter's own (small) weights,
never the base's weights. Imports torch only through the safetensors reader."""

from __future__ import annotations

import json
import re
from pathlib import Path

from posttrainllm.errors import UsageError, one_line, shorten
from posttrainllm.merging.sources import Source, config_int, num_blocks
from posttrainllm.merging.tensors import TensorFileError, read_header

ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_BLOCK = re.compile(r"\.(\d+)(?=\.)")
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")


def _width(config: dict) -> int | None:
    return config_int(config, _WIDTH_KEYS)


def _recorded_base(adapter: Source) -> tuple[str, dict | None]:
    """The base the adapter records, and its config when that is a local model directory (else None)."""
    ref = str(adapter.config.get("base_model_name_or_path") or "")
    config = Path(ref).expanduser() / "config.json" if ref else None
    if config is None or not config.is_file():
        return ref, None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ref, None
    return ref, data if isinstance(data, dict) else None


def _refuse(adapter: Source, base: Source, what: str, recorded: str) -> UsageError:
    own = f" ({shorten(recorded)})" if recorded else ""
    return UsageError(
        f"--model {shorten(adapter.ref)} is a LoRA adapter of another base than --base {shorten(base.ref)}: {what}; "
        f"pass the base it was trained on{own} as --base"
    )


def check_recorded_base(base: Source, adapter: Source) -> None:
    """The recorded base (when it is a local directory) has --base's block count and width."""
    recorded, config = _recorded_base(adapter)
    if config is None:
        return
    for what, get in (("blocks", num_blocks), ("hidden size", _width)):
        theirs, ours = get(config), get(base.config)
        if theirs is not None and ours is not None and theirs != ours:
            raise _refuse(adapter, base, f"{what}: {theirs} in the base it was trained on, {ours} in --base", recorded)


def _pairs(header: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    """module name (as --base stores its weight, less ".weight") → {"A": shape, "B": shape} of its LoRA pair."""
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for key, info in header.items():
        module, sep, rest = key.partition(".lora_")
        if not sep:
            continue
        kind = rest.removeprefix("embedding_")[:1]
        if kind in ("A", "B"):
            out.setdefault(module.removeprefix(_PREFIX), {})[kind] = info.shape
    return out


def _shape_problem(module: str, pair: dict, stored: dict[str, tuple[int, ...]]) -> str | None:
    name = f"{module}.weight"
    if name not in stored or len(pair) != 2 or len(pair["A"]) != 2 or len(pair["B"]) != 2:
        return None
    trained = (pair["B"][0], pair["A"][1])  # (out, in); a Conv1D or an embedding stores it transposed
    shape = tuple(stored[name])
    if shape in (trained, trained[::-1]):
        return None
    return f"its {module} was trained for a weight of shape {list(trained)}, --base holds {name} of shape {list(shape)}"


def _split(module: str) -> tuple[str, str, str] | None:
    """(head, block, tail) of a module name, the first index being the block: "model.layers.2.self_attn.q_proj" →
    ("model.layers.", "2", ".self_attn.q_proj"); None without an index."""
    m = _BLOCK.search(module)
    return (module[: m.start(1)], m.group(1), module[m.end(1) :]) if m else None


def _depth_problem(module: str, stored: dict, n_blocks: int | None) -> str | None:
    """A module --base does not store, though it stores the same module at block 0: a block --base lacks."""
    parts = _split(module)
    if f"{module}.weight" in stored or parts is None or f"{parts[0]}0{parts[2]}.weight" not in stored:
        return None
    has = f" (it has {n_blocks} blocks)" if n_blocks is not None else ""
    return f"it has weights for {module} (block {parts[1]}), a block --base does not have{has}"


def _missing_blocks(adapter: Source, pairs: dict, stored: dict) -> str | None:
    """With plain module names as targets in every block, every block of --base holding such a module has weights
    in the adapter (peft would leave a block it has none for as it is)."""
    cfg = adapter.config
    targets = cfg.get("target_modules")
    if cfg.get("layers_to_transform") is not None or cfg.get("exclude_modules"):
        return None
    if not isinstance(targets, list) or not all(isinstance(t, str) and "." not in t for t in targets):
        return None
    trained: dict[tuple[str, str], set[str]] = {}
    for parts in filter(None, map(_split, pairs)):
        trained.setdefault((parts[0], parts[2]), set()).add(parts[1])
    for (head, tail), blocks in sorted(trained.items()):
        end = tail + ".weight"
        found = {n[len(head) : -len(end)] for n in stored if n.startswith(head) and n.endswith(end)}
        missing = sorted((i for i in found - blocks if i.isdigit()), key=int)
        if missing:
            return f"it has no weights for {head}{missing[0]}{tail} (block {missing[0]} of --base)"
    return None


def check_adapter_tensors(base: Source, adapter: Source, stored: dict[str, tuple[int, ...]]) -> None:
    """The adapter's LoRA pairs against --base's stored tensors (name → shape): modules, blocks, shapes."""
    weights = adapter.path / ADAPTER_WEIGHTS
    if not weights.is_file():
        return  # an older adapter_model.bin: peft checks what it can
    try:
        header = read_header(weights)
    except TensorFileError as e:
        raise UsageError(f"--model {shorten(adapter.ref)}: {one_line(e)}") from None
    pairs = _pairs(header)
    recorded, _ = _recorded_base(adapter)
    n_blocks = num_blocks(base.config)
    for module in sorted(pairs):
        problem = _depth_problem(module, stored, n_blocks) or _shape_problem(module, pairs[module], stored)
        if problem:
            raise _refuse(adapter, base, problem, recorded)
    problem = _missing_blocks(adapter, pairs, stored)
    if problem:
        raise _refuse(adapter, base, problem, recorded)


def check_adapter_finite(adapter: Source) -> None:
    """Every tensor of the adapter's weights holds finite values (a UsageError naming the file and tensor)."""
    import torch
    from safetensors import SafetensorError, safe_open

    weights = adapter.path / ADAPTER_WEIGHTS
    if not weights.is_file():
        return
    try:
        with safe_open(str(weights), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t.float()).all()):
                    raise UsageError(
                        f"--model {shorten(adapter.ref)}: tensor {name} in {weights} holds NaN or infinite values, "
                        "so no merge of it is a model; pass an adapter with finite weights"
                    )
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise UsageError(f"--model {shorten(adapter.ref)}: cannot read {weights} ({one_line(e)})") from None


def check_adapter(base: Source, adapter: Source, base_tensors) -> None:
    """All of the above, before the output directory is claimed."""
    check_recorded_base(base, adapter)
    stored = {name: base_tensors.meta(name)[1] for name in base_tensors.names()}
    check_adapter_tensors(base, adapter, stored)
    check_adapter_finite(adapter)
