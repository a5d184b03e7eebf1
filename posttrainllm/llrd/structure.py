"""Where the blocks are and every parameter's depth (0 embeddings, i + 1 block i, N + 1 head), found from the
modules, never from which parameters happen to be trainable. Like timm's ``group_matcher``; torch only."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

from posttrainllm.constants import LAYER_COUNT_KEYS
from posttrainllm.llrd.errors import BlockStructureError, LLRDArgumentError

_WRAPPER_PARTS = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"}
# Known block-list paths (after stripping wrappers), most specific first; matched as a dotted suffix.
_BLOCK_SUFFIXES = (
    "model.layers",
    "model.language_model.layers",
    "language_model.layers",
    "transformer.h",
    "gpt_neox.layers",
    "model.decoder.layers",
    "decoder.layers",
    "transformer.blocks",
    "transformer.layers",
    "encoder.layer",
    "encoder.layers",
    "layers",
    "h",
    "blocks",
    "layer",
    "block",
)
# Non-block parameters registered "out of order" (OPT defines final_layer_norm/project_out before its layers).
_AFTER_HINT = re.compile(r"(?:^|\.)(?:final_layer_?norm|final_norm|norm_f|ln_f|project_out|lm_head|embed_out)(?:\.|$)")
_BEFORE_HINT = re.compile(r"(?:^|\.)(?:embed(?!_out)\w*|\w*embeddings?|wte|wpe|project_in|cls_token)(?:\.|$)")
# A chosen block list holding less than this share of the non-embedding parameters is not trusted.
_MIN_BLOCK_SHARE = 0.5


def strip_wrappers(name: str) -> str:
    """Name without wrapper prefixes: ``base_model.model.model.layers.0._orig_mod.x`` → ``model.layers.0.x``."""
    parts = [p for p in name.split(".") if p not in _WRAPPER_PARTS]
    while True:
        if parts[:1] == ["module"]:
            parts = parts[1:]
        elif parts[:2] == ["base_model", "model"]:
            parts = parts[2:]
        else:
            return ".".join(parts)


def _config_num_layers(model: nn.Module) -> int | None:
    """Layer count from ``config`` on the model or on the first wrapped module that has one."""
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is None:
            continue
        try:
            cfg = cfg.get_text_config()
        except Exception:
            pass
        for key in LAYER_COUNT_KEYS:
            value = cfg.get(key) if isinstance(cfg, dict) else getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _is_list(module: nn.Module) -> bool:
    return isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 0


def _list_candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if _is_list(m)]


def _first(items: list[str], k: int) -> str:
    return ", ".join(items[:k]) + (f", +{len(items) - k} more" if len(items) > k else "")


def _describe(cands) -> str:
    return _first([f"{n} ({len(m)})" for n, m in cands], 12)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_block_list(model: nn.Module, block_path: str | None = None) -> tuple[str, nn.Module]:
    """Dotted path (as in ``model.named_modules()``, wrapper prefixes included) and the block list.

    Auto-detection: among ModuleLists (or Sequentials) whose length equals the config's layer count, take the
    first known path suffix (``model.layers``, ``transformer.h``, ...), else the one with most parameters.
    Without a config, only known suffixes are accepted. ``block_path`` names the list explicitly (exact
    ``named_modules()`` name, or a suffix of the wrapper-stripped name). Raises ``LLRDArgumentError`` for a bad
    ``block_path`` and ``BlockStructureError`` when nothing fits. (Hierarchical models: see ``_resolve_blocks``.)
    """
    cands = _list_candidates(model)
    if block_path:
        modules = dict(model.named_modules())
        want = strip_wrappers(block_path)
        hits = (
            [n for n in modules if n == block_path]
            or [n for n in modules if strip_wrappers(n) == want]
            or [n for n in modules if strip_wrappers(n).endswith("." + want)]
        )
        if not hits or not _is_list(modules[hits[0]]):
            what = "no such module" if not hits else f"{type(modules[hits[0]]).__name__} is not a list of blocks"
            raise LLRDArgumentError(
                "block_path",
                f"block list {block_path!r}: {what}; ModuleLists in "
                f"{type(model).__name__}: {_describe(cands) or 'none'}",
            )
        return hits[0], modules[hits[0]]

    n_cfg = _config_num_layers(model)
    pool = [(n, m) for n, m in cands if n_cfg is None or len(m) == n_cfg]

    def rank(item):
        stripped = strip_wrappers(item[0])
        known = [i for i, s in enumerate(_BLOCK_SUFFIXES) if stripped == s or stripped.endswith("." + s)]
        return known[0] if known else len(_BLOCK_SUFFIXES), -_numel(item[1])

    ranked = sorted(pool, key=rank)
    if ranked and (n_cfg is not None or rank(ranked[0])[0] < len(_BLOCK_SUFFIXES)):
        return ranked[0]
    wanted = f"N = {n_cfg} blocks (config.num_hidden_layers)" if n_cfg else "blocks (no layer count in a config)"
    raise _structure_error(model, f"no block list of {wanted} found", cands)


def _structure_error(model: nn.Module, what: str, cands) -> BlockStructureError:
    names = [n for n, _ in model.named_parameters()]
    return BlockStructureError(
        f"{what} in {type(model).__name__}. Parameters not matched to any block ({len(names)}): "
        f"{_first(names, 8) or 'none'}. ModuleLists in the model: {_describe(cands) or 'none'}",
        model_name=type(model).__name__,
        candidates=[(n, len(m)) for n, m in cands],
        unmatched=names,
    )


def _inner_block_list(stage: nn.Module) -> nn.Module | None:
    """The direct child of ``stage`` that is a list of blocks of one class (the largest, if several)."""
    lists = [m for m in stage.children() if _is_list(m) and len({type(b) for b in m}) == 1]
    return max(lists, key=_numel) if lists else None


def _as_stages(blocks: nn.Module) -> list[nn.Module] | None:
    """The inner block lists when ``blocks`` is a list of stages (ConvNeXt/Swin): every element has a direct child
    list of blocks of one class, the same class in every stage (not the stage's own), holding most of the stage
    parameters. T5-style blocks (a list of different sub-layers) are not stages."""
    inner = [_inner_block_list(stage) for stage in blocks]
    if any(lst is None for lst in inner):
        return None
    classes = {type(b) for lst in inner for b in lst}
    if len(classes) != 1 or classes & {type(s) for s in blocks} or sum(len(lst) for lst in inner) <= len(blocks):
        return None
    if sum(_numel(lst) for lst in inner) < _MIN_BLOCK_SHARE * _numel(blocks):
        return None
    return inner


def _io_embeddings(model: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """``get_input_embeddings()`` / ``get_output_embeddings()`` of the first (possibly wrapped) module having them."""
    for module in model.modules():
        if callable(getattr(module, "get_input_embeddings", None)):
            found = []
            for getter in ("get_input_embeddings", "get_output_embeddings"):
                try:
                    mod = getattr(module, getter)()
                except Exception:
                    mod = None
                found.append(mod if isinstance(mod, nn.Module) else None)
            return found[0], found[1]
    return None, None


@dataclass
class _Layout:
    """Where the blocks are: ``blocks[i]`` is block i; ``extra`` gives stage-level parameters a block index."""

    path: str | None
    blocks: list[nn.Module]
    extra: dict[int, int] = field(default_factory=dict)
    hierarchical: bool = False


def _resolve_blocks(model: nn.Module, block_path: str | None) -> _Layout:
    """The block layout: a plain block list, or the concatenated blocks of a list of stages."""
    path, blocks = find_block_list(model, block_path)
    if block_path:
        return _Layout(path, list(blocks))
    modules = dict(model.named_modules())
    # The chosen list may be one stage's blocks, or the list of stages itself: look at it and at its ancestors.
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        outer = modules.get(".".join(parts[:cut]))
        if outer is not None and _is_list(outer) and (inner := _as_stages(outer)) is not None:
            return _stage_layout(".".join(parts[:cut]), outer, inner)
    cands = _list_candidates(model)
    # Embedding tables are lookups, not compute: leave them (and the output embeddings) out of the comparison.
    in_emb, out_emb = _io_embeddings(model)
    tables = [m for m in model.modules() if isinstance(m, nn.Embedding)] + [m for m in (in_emb, out_emb) if m]
    emb = {id(p) for m in tables for p in m.parameters()}
    rest = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values() if id(p) not in emb)
    share = _numel(blocks) / rest if rest else 1.0
    if share < _MIN_BLOCK_SHARE:
        raise _structure_error(
            model,
            f"ambiguous block structure: the list {path} ({len(blocks)} blocks) holds only {share:.0%} of the "
            "non-embedding parameters",
            cands,
        )
    return _Layout(path, list(blocks))


def _stage_layout(path: str, stages: nn.Module, inner: list[nn.Module]) -> _Layout:
    blocks: list[nn.Module] = []
    extra = {}
    for stage, lst in zip(stages, inner):
        first, last = len(blocks), len(blocks) + len(lst) - 1
        blocks.extend(lst)
        in_list = {id(p) for p in lst.parameters()}
        seen_list = False
        for p in stage.parameters():
            if id(p) in in_list:
                seen_list = True
            elif id(p) not in extra:
                extra[id(p)] = last if seen_list else first
    return _Layout(f"{path}.*", blocks, extra, hierarchical=True)


def _assign_depths(model: nn.Module, layout: _Layout | None, tied_policy: str) -> tuple[dict[int, int], dict]:
    """Depth of every parameter (by id): 0 embeddings, i + 1 block i, N + 1 head; plus the tied-matrix facts."""
    n = len(layout.blocks) if layout else 0
    head = n + 1
    block_depth: dict[int, int] = {}
    for i, block in enumerate(layout.blocks if layout else []):
        for p in block.parameters():
            block_depth.setdefault(id(p), i + 1)
    for pid, i in layout.extra.items() if layout else ():
        block_depth.setdefault(pid, i + 1)
    in_emb, out_emb = _io_embeddings(model)
    in_ids = {id(p) for p in in_emb.parameters()} if in_emb is not None else set()
    out_ids = {id(p) for p in out_emb.parameters()} if out_emb is not None else set()
    in_w, out_w = getattr(in_emb, "weight", None), getattr(out_emb, "weight", None)
    tied = (
        isinstance(in_w, torch.Tensor)
        and isinstance(out_w, torch.Tensor)
        and (
            in_w is out_w
            or (
                in_w.device.type != "meta"
                and in_w.data_ptr() != 0
                and in_w.data_ptr() == out_w.data_ptr()
                and in_w.shape == out_w.shape
            )
        )
    )
    tied_ids = {id(in_w), id(out_w)} if tied else set()
    depth: dict[int, int] = {}
    tied_info = {"tied": tied, "name": None, "depth": None}
    seen_block = False
    for name, p in model.named_parameters():
        if layout is None:
            d = 0
        elif id(p) in block_depth:
            d, seen_block = block_depth[id(p)], True
        elif id(p) in tied_ids:
            d = 0 if tied_policy == "embedding" else head
        elif id(p) in out_ids:
            d = head
        elif id(p) in in_ids:
            d = 0
        elif _AFTER_HINT.search(strip_wrappers(name)):
            d = head
        elif _BEFORE_HINT.search(strip_wrappers(name)):
            d = 0
        else:
            d = head if seen_block else 0
        depth[id(p)] = d
        if id(p) in tied_ids and tied_info["name"] is None:
            tied_info.update(name=name, depth=d)
    return depth, tied_info
