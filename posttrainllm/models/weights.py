"""What a local model directory's weights hold, read from the safetensors headers without loading a tensor, and
the config checked against it before a model is built: a config.json claiming far more (or fewer) blocks than the
weights hold would otherwise build (and random-initialise) them first, e.g. 2,000,000 blocks filling the memory.

A safetensors file starts with an 8-byte little-endian header length and that many bytes of JSON:
``{"<tensor name>": {"dtype": "F32", "shape": [4, 32], "data_offsets": [a, b]}, "__metadata__": {...}}``.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

from posttrainllm.constants import LAYER_COUNT_KEYS
from posttrainllm.errors import ModelError, UsageError, shorten

_MAX_HEADER = 100 << 20  # bytes: a real header is a few MB even for the largest models
# a block index in a tensor name: "model.layers.12.mlp.up_proj.weight" → ("model.layers", 12)
_BLOCK = re.compile(r"^(.*?[A-Za-z_][\w]*)\.(\d+)\.")
# the config's parameter count may exceed what the weights store by this factor before it is called absurd
# (a new head or a few new blocks are far below it; 2,000,000 blocks over 4 are far above)
ABSURD_FACTOR = 16


def _header(path: Path) -> dict[str, dict] | None:
    """name → {"dtype", "shape", ...} of one safetensors file; None when the header is not one (the model load
    that follows reports the file)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            header = json.loads(f.read(size)) if 0 < size <= _MAX_HEADER else None
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def stored_tensors(model_dir: str | Path) -> dict[str, tuple[int, ...]] | None:
    """name → shape of every tensor in the directory's safetensors weights (model.safetensors, or the shards that
    model.safetensors.index.json names), read from the headers only. None when there are no safetensors weights
    (a .bin checkpoint, an adapter, a hub id) or when a header is unreadable (the model load reports it): nothing
    is downloaded to find out."""
    d = Path(model_dir).expanduser()
    index, single = d / "model.safetensors.index.json", d / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted({d / str(f) for f in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # the model load reports an unreadable index
    elif single.is_file():
        files = [single]
    else:
        return None
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        header = _header(f)
        if header is None:
            return None
        for name, info in header.items():
            shape = info.get("shape")
            out[name] = tuple(int(x) for x in shape) if isinstance(shape, list) else ()
    return out


def _config_layers(model_dir: Path) -> tuple[str, int] | None:
    """(key, value) of the config.json's block count (text_config's for a multimodal config), if it says."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the model load reports an unreadable config
    for section in (config.get("text_config"), config) if isinstance(config, dict) else ():
        if isinstance(section, dict):
            for key in LAYER_COUNT_KEYS:
                value = section.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return key, value
    return None


def stored_blocks(tensors: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, int]]:
    """block list path → (blocks stored, parameters of its block 0) for every numbered list in the tensor names
    (``model.layers.0…3`` → 4 blocks, from the highest index)."""
    indices: dict[str, set[int]] = {}
    for name in tensors:
        m = _BLOCK.match(name)
        if m:
            indices.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {
        path: (max(ix) + 1, sum(math.prod(s) for name, s in tensors.items() if name.startswith(f"{path}.0.")))
        for path, ix in indices.items()
    }


def check_config(model_dir: str | Path, *, allow_new_weights: bool = False, what: str = "--model") -> list[str] | None:
    """The config's block count against the blocks the safetensors weights hold, before anything is built: a
    UsageError (exit 2) naming the config field and both numbers when the config claims more blocks than any
    numbered list of the weights holds (unless ``allow_new_weights``), or so many that the model would be absurdly
    larger than its weights (always). Fewer blocks than stored is left to the load's unexpected-weights check (a
    model class may ignore extra stored layers). Returns the stored tensor names; None without safetensors weights
    (nothing is checked, nothing downloaded)."""
    d = Path(model_dir).expanduser()
    tensors = stored_tensors(d) if d.is_dir() else None
    if tensors is None:
        return None
    claimed, blocks = _config_layers(d), stored_blocks(tensors)
    if claimed is None or not blocks or any(n >= claimed[1] for n, _ in blocks.values()):
        return list(tensors)
    key, n_cfg = claimed
    path = max(blocks, key=lambda p: blocks[p][0])
    n_stored, per_block = blocks[path]
    stored = sum(math.prod(s) for s in tensors.values())
    estimate = stored + (n_cfg - n_stored) * per_block
    where = f"{what} {shorten(d)}: config.json says {key}: {n_cfg} but the weights hold {n_stored} blocks"
    where += f" ({path}.0-{n_stored - 1})"
    if estimate > ABSURD_FACTOR * stored:
        raise UsageError(
            f"{where}, which would build about {_count(estimate)} parameters from {_count(stored)} stored; "
            f"set {key} to {n_stored} in config.json"
        )
    if not allow_new_weights:
        raise UsageError(
            f"{where}: {n_cfg - n_stored} blocks would start from random weights; set {key} to {n_stored} in "
            "config.json, or pass --allow-new-weights if you mean it"
        )
    return list(tensors)


def _count(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def check_loaded(ref: str, info: dict, *, allow_new_weights: bool, what: str = "--model") -> list[str]:
    """transformers' loading info (``from_pretrained(..., output_loading_info=True)``) of a model about to be
    fine-tuned: weights the model has but the checkpoint lacks (random-initialised) or the checkpoint has but the
    model drops are a ModelError naming a few, unless ``allow_new_weights``; then the notes that say so. Tied
    weights (an lm_head sharing the embeddings) and the keys a model class declares ignorable are not reported by
    transformers, so they are not flagged."""
    missing = sorted(set(info.get("missing_keys") or ()) | {str(k[0]) for k in info.get("mismatched_keys") or ()})
    unexpected = sorted(info.get("unexpected_keys") or ())
    parts = []
    if missing:
        parts.append(f"{len(missing)} weights of the model are not in the checkpoint (random init: {_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} weights of the checkpoint are not in the model (dropped: {_few(unexpected)})")
    if not parts:
        return []
    if not allow_new_weights:
        raise ModelError(
            f"{what} {shorten(ref)}: " + "; ".join(parts) + ". The config does not match the weights: fix "
            "config.json, or pass --allow-new-weights if new (random-initialised) weights are meant"
        )
    return [f"--allow-new-weights: {p}" for p in parts]


def reward_head_keys(model, info: dict) -> tuple[dict, list[str]]:
    """A causal-LM checkpoint loaded as a reward model (sequence classification, one output): its new score head
    and the LM head it no longer uses are expected. Returns the loading info without them, and the note that says
    so; any other missing or unused weight is still reported by `check_loaded`."""
    head = [n for n, _ in model.named_parameters() if n.split(".")[0] in ("score", "classifier")]
    missing = [k for k in info.get("missing_keys") or () if k not in head]
    unexpected = [k for k in info.get("unexpected_keys") or () if not k.startswith(("lm_head.", "embed_out."))]
    n_new = sum(p.numel() for n, p in model.named_parameters() if n in head)
    notes = [f"reward model: a new score head ({', '.join(head) or 'none found'}, {n_new} weights) starts random"]
    return {**info, "missing_keys": missing, "unexpected_keys": unexpected}, notes


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f", … (+{len(names) - n})" if len(names) > n else "")
