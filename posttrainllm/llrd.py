"""Layer-wise learning-rate decay (LLRD): optimizer parameter groups by depth. A torch-only library.

A model with N blocks (its block list, e.g. ``model.layers``) is cut into N + 2 depths:

    depth 0      embeddings: token + learned position embeddings and everything before the block list
                 (ViT cls_token / patch embeddings, BERT embeddings LayerNorm, OPT project_in, ...)
    depth i + 1  block i (0 = closest to the input)
    depth N + 1  head: final norm, LM head and everything after the block list (OPT project_out, ...)

and every depth trains at ``base_lr * scale`` with

    scale(block i)    = gamma ** (N - 1 - i)        (top block: 1, block 0: gamma ** (N - 1))
    scale(embeddings) = gamma ** (N - 1)            (same as block 0)
    scale(head)       = 1
    scale             = max(scale, min_scale)       (clamp, as timm's ``layer_decay_min_scale``)

Worked example, N = 4, gamma = 0.5, base_lr = 1e-3: block_3 1e-3, block_2 5e-4, block_1 2.5e-4,
block_0 and embeddings 1.25e-4, head 1e-3.

Two more factors compose with the depth scale, by what a parameter is rather than where it sits:

    lr = base_lr * depth_scale * pattern_factor * loraplus_factor

``lr_groups={"mlp": 0.5}`` multiplies every parameter whose (wrapper-stripped) name matches the regex ``mlp`` by
0.5 (a factor 0 freezes); ``loraplus_ratio=16`` trains LoRA's B matrices (``lora_B``, ``lora_embedding_B``) at 16x
their depth's LR (LoRA+, Hayou et al. 2024). E.g. N = 4, gamma = 0.5, base_lr = 1e-3, ``lr_groups={"mlp": 0.5}``:
``layers.1.mlp.up_proj.weight`` trains at 1e-3 * 0.5**2 * 0.5 = 1.25e-4.

Use in your own training loop::

    from posttrainllm import build_param_groups

    plan = build_param_groups(model, base_lr=3e-5, gamma=0.9, weight_decay=0.01)
    optimizer = torch.optim.AdamW(plan.groups)          # each group carries its absolute "lr"
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / 100))
    print(plan.to_json())                               # group name, lr, weight decay, parameter names

How the structure is found:

* The block list comes from the modules, never from which parameters happen to be trainable, so LoRA adapters
  inside block i train at block i's LR. Among the ``ModuleList``/``Sequential`` containers whose length equals
  the config's layer count, known paths (``model.layers``, ``transformer.h``, ...) come first.
* Hierarchical models (ConvNeXt / Swin style: a list of stages, each holding its own list of blocks of one
  class) get depth over the concatenated blocks of all stages, as timm's ``group_matcher`` does; stage-level
  parameters (downsampling) take the depth of the stage's first block when registered before its blocks, of its
  last block otherwise. A chosen list holding well under half of the non-embedding parameters is refused as
  ambiguous rather than silently mis-split.
* Wrapper prefixes (PEFT ``base_model.model.``, FSDP ``_fsdp_wrapped_module.``, activation checkpointing
  ``_checkpoint_wrapped_module.``, torch.compile ``_orig_mod.``, DDP ``module.``) are transparent.
* A tied input/output embedding matrix gets the head's LR (``tied_policy="head"``, the default) or the
  embeddings' (``"embedding"``).

Weight decay goes to matrices only: not to biases, norm weights, 1-D tensors, nor to ViT-style token and
position tensors (``cls_token``, ``pos_embed``, ``position_embeddings`` parameters, ... and whatever a model's
``no_weight_decay()`` lists), as in timm and the MAE/BEiT recipes.

Planning has no side effects: ``build_param_groups`` never changes the model. ``freeze_below`` only *plans*
freezing (those parameters are left out of the groups and listed in ``plan.frozen_param_names``);
``apply_freeze(plan)`` is the separate step that sets ``requires_grad=False`` on them.

The library accepts any ``gamma`` in (0, 1]. (The ``posttrainllm`` command line narrows it to [0.5, 1.0].)
Invalid arguments raise ``ValueError``; a model whose blocks cannot be found raises ``BlockStructureError``
(a ``ValueError``) when the requested decay needs them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from posttrainllm.constants import DEFAULT_TIED_POLICY, TIED_POLICIES

__all__ = [
    "BlockStructureError",
    "LLRDPlan",
    "TIED_POLICIES",
    "DEFAULT_TIED_POLICY",
    "apply_freeze",
    "build_param_groups",
    "find_block_list",
    "layer_decay_requested",
    "strip_wrappers",
]

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
_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# Weight decay exclusions, as transformers' Trainer.get_decay_parameter_names (matched on the lowercased name).
_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")
# ViT-style free tensors that never decay (timm's no_weight_decay(), MAE/BEiT recipes); whole last name part.
_NO_DECAY_TOKENS = re.compile(
    r"(?:^|\.)(?:cls_token|dist_token|reg_token|mask_token|pos_embed|absolute_pos_embed|position_embeddings"
    r"|relative_position_bias_table)$"
)
# Non-block parameters registered "out of order" (OPT defines final_layer_norm/project_out before its layers).
_AFTER_HINT = re.compile(r"(?:^|\.)(?:final_layer_?norm|final_norm|norm_f|ln_f|project_out|lm_head|embed_out)(?:\.|$)")
_BEFORE_HINT = re.compile(r"(?:^|\.)(?:embed(?!_out)\w*|\w*embeddings?|wte|wpe|project_in|cls_token)(?:\.|$)")
# LoRA+ (Hayou et al., 2024): the B matrices of LoRA adapters (PEFT names them lora_B / lora_embedding_B).
_LORA_B = re.compile(r"(?:^|\.)lora_(?:embedding_)?B(?:\.|$)")
# A chosen block list holding less than this share of the non-embedding parameters is not trusted.
_MIN_BLOCK_SHARE = 0.5


class BlockStructureError(ValueError):
    """The block list of a model could not be resolved. ``candidates`` are the ``(path, length)`` of the model's
    ModuleLists/Sequentials; ``unmatched`` the parameter names that no block holds."""

    def __init__(self, message: str, *, model_name: str = "", candidates=(), unmatched=()):
        super().__init__(message)
        self.model_name = model_name
        self.candidates = list(candidates)
        self.unmatched = list(unmatched)


def layer_decay_requested(gamma: float = 1.0, min_scale: float = 0.0, freeze_below: float = 0.0) -> bool:
    """Whether the settings make any depth's LR differ from the base LR (so the block structure is needed)."""
    return gamma < 1.0 or min_scale > 0 or freeze_below > 0


@dataclass
class LLRDPlan:
    """The optimizer groups plus what a run report needs. ``groups`` goes straight into the optimizer.

    Each group is ``{"params", "lr", "weight_decay", "name", "scale", "depth", "depth_scale", "pattern",
    "factor", "loraplus"}`` with the absolute ``lr = base_lr * depth_scale * factor * loraplus`` and
    ``scale = lr / base_lr``. When every depth trains at the base LR the depths share groups (``all``,
    ``all.no_decay``, as a flat AdamW has them); otherwise there is one group per depth, LR-factor combination and
    decay setting (``block_3``, ``block_3+mlp``, ``block_3+loraplus.no_decay``, ...), never an empty one.

    ``param_depths`` gives the depth of every parameter (frozen ones too), by name; ``rows[d]["block"]`` names
    depth ``d``. ``rows`` has one entry per depth (embeddings, block_0 .. block_{N-1}, head), always all N + 2 of them:
    ``n_params``/``n_tensors`` count the trainable parameters, those planned frozen included; a row whose
    parameters are all frozen by the user (e.g. embeddings under LoRA) has ``n_params == 0`` and
    ``trainable == False`` (``trainable`` = the row has parameters in the optimizer).
    """

    groups: list[dict]
    param_names: dict[str, list[str]]
    rows: list[dict]
    num_layers: int
    block_path: str | None
    base_lr: float
    gamma: float
    weight_decay: float
    tied: bool = False
    tied_policy: str = DEFAULT_TIED_POLICY
    tied_param_name: str | None = None
    tied_lr: float | None = None
    min_scale: float = 0.0
    freeze_below: float = 0.0
    frozen_param_names: list[str] = field(default_factory=list)
    frozen_state_bytes_saved: int = 0
    warnings: list[str] = field(default_factory=list)
    structure_found: bool = True
    hierarchical: bool = False
    lr_groups: dict[str, float] = field(default_factory=dict)
    loraplus_ratio: float = 1.0
    param_depths: dict[str, int] = field(default_factory=dict, repr=False)  # every parameter, trainable or not
    frozen_params: list[torch.Tensor] = field(default_factory=list, repr=False)

    @property
    def lr_scaled(self) -> bool:
        """True when some trainable parameter gets another LR than the base LR, or some are frozen by the plan: the
        one predicate for "layer decay (or an LR factor) is active"."""
        return any(g["lr"] != self.base_lr for g in self.groups) or bool(self.frozen_param_names)

    def to_json(self) -> list[dict]:
        """Groups without tensors (``param_groups.json``): name, lr, weight_decay, scale (= lr / base_lr), depth,
        and the factors of the composition: depth_scale, pattern (or None), factor, loraplus; then params."""
        keys = ("name", "lr", "weight_decay", "scale", "depth", "depth_scale", "pattern", "factor", "loraplus")
        return [{**{k: g[k] for k in keys}, "params": list(self.param_names[g["name"]])} for g in self.groups]

    def lr_of(self, name: str) -> float:
        """LR of a group (by group name) or of a parameter (by its name in ``model.named_parameters()``)."""
        for g in self.groups:
            if name == g["name"] or name in self.param_names[g["name"]]:
                return g["lr"]
        stripped = strip_wrappers(name)
        for g in self.groups:
            if any(strip_wrappers(n) == stripped for n in self.param_names[g["name"]]):
                return g["lr"]
        raise KeyError(f"no group or trainable parameter named {name!r}")

    def groups_for(self, model: nn.Module) -> list[dict]:
        """The groups with the tensors of ``model``: the planned model itself, or a wrapped copy of it (DDP, FSDP,
        torch.compile) whose parameters are matched by wrapper-stripped name. Raises ``ValueError`` when the two do
        not hold the same trainable parameters."""
        named = list(model.named_parameters())
        planned = {id(p) for g in self.groups for p in g["params"]}
        trainable = {id(p) for _, p in named if p.requires_grad}
        if planned == trainable:
            return self.groups
        by_name = {strip_wrappers(n): p for n, p in named}
        groups, missing = [], []
        for g in self.groups:
            params = []
            for n in self.param_names[g["name"]]:
                p = by_name.get(strip_wrappers(n))
                if p is None:
                    missing.append(n)
                else:
                    params.append(p)
            groups.append({**g, "params": params})
        covered = [id(p) for g in groups for p in g["params"]]
        extra = [n for n, p in named if p.requires_grad and id(p) not in set(covered)]
        if missing or extra or len(covered) != len(set(covered)):
            raise ValueError(
                f"the model does not hold the planned parameters: {len(missing)} planned not found "
                f"({_first(missing, 3)}), {len(extra)} trainable not planned ({_first(extra, 3)})"
            )
        return groups


def apply_freeze(plan: LLRDPlan) -> int:
    """Set ``requires_grad=False`` on the parameters the plan froze (``freeze_below``); returns how many."""
    for p in plan.frozen_params:
        p.requires_grad_(False)
    return len(plan.frozen_params)


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


# ------------------------------------------------------------------------------------------------ structure
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
        for key in _LAYER_COUNT_KEYS:
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
    ``named_modules()`` name, or a suffix of the wrapper-stripped name). Raises ``ValueError`` for a bad
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
            raise ValueError(
                f"block list {block_path!r}: {what}; ModuleLists in "
                f"{type(model).__name__}: {_describe(cands) or 'none'}"
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
    blocks, extra = [], {}
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


# ------------------------------------------------------------------------------------------------ the steps
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


def _decay_mask(model: nn.Module, weight_decay: float) -> set[int]:
    """Ids of the parameters that get weight decay: matrices, except norms, biases and ViT-style token tensors."""
    if weight_decay == 0:
        return set()
    norm_ids = {
        id(p)
        for m in model.modules()
        if isinstance(m, nn.LayerNorm) or "Norm" in type(m).__name__
        for p in m.parameters(recurse=False)
    }
    listed: set[str] = set()
    for module in model.modules():  # timm convention: model.no_weight_decay() -> names relative to that module
        getter = getattr(module, "no_weight_decay", None)
        if callable(getter):
            try:
                listed |= {strip_wrappers(str(n)) for n in getter()}
            except Exception:
                pass
            break
    decay = set()
    for name, p in model.named_parameters():
        plain = strip_wrappers(name)
        if p.ndim < 2 or id(p) in norm_ids or _NO_DECAY.search(name.lower()) or _NO_DECAY_TOKENS.search(plain):
            continue
        if any(plain == n or plain.endswith("." + n) for n in listed):
            continue
        decay.add(id(p))
    return decay


def _pattern_factors(model: nn.Module, lr_groups: dict[str, float]) -> dict[int, tuple[str, float]]:
    """(pattern, factor) of every parameter matched by one of the ``lr_groups`` regexes (searched in the
    wrapper-stripped name). A parameter matched by two patterns, or a pattern matching nothing, is a ValueError."""
    compiled = []
    for pattern, factor in lr_groups.items():
        try:
            compiled.append((pattern, re.compile(pattern), factor))
        except re.error as e:
            raise ValueError(f"LR group pattern {pattern!r} is not a valid regular expression: {e}") from None
    found: dict[int, tuple[str, float]] = {}
    hits = {pattern: 0 for pattern in lr_groups}
    names = []
    for name, p in model.named_parameters():
        plain = strip_wrappers(name)
        names.append(plain)
        matched = [(pattern, factor) for pattern, rx, factor in compiled if rx.search(plain)]
        if len(matched) > 1:
            both = " and ".join(repr(m[0]) for m in matched)
            raise ValueError(f"parameter {plain} matches LR group patterns {both}; make the patterns disjoint")
        if matched:
            found[id(p)] = matched[0]
            hits[matched[0][0]] += 1
    unmatched = [pattern for pattern, n in hits.items() if n == 0]
    if unmatched:
        raise ValueError(
            f"LR group pattern {unmatched[0]!r} matches no parameter; parameter names look like: {_first(names, 6)}"
        )
    return found


def count_blocks(model: nn.Module, block_path: str | None = None) -> int:
    """N, the number of blocks layer decay counts in `model` (all stages' blocks for hierarchical models)."""
    return len(_resolve_blocks(model, block_path).blocks)


def gamma_for_bottom_scale(bottom_scale: float, num_blocks: int) -> float:
    """The γ that gives block 0 (and the embeddings) the LR scale `bottom_scale` in a `num_blocks`-block model:
    ``bottom_scale ** (1 / (num_blocks - 1))`` (1.0 for a single block)."""
    if not (isinstance(bottom_scale, (int, float)) and 0 < bottom_scale <= 1):
        raise ValueError(f"bottom scale must be in (0, 1], got {bottom_scale!r}")
    return 1.0 if num_blocks <= 1 else float(bottom_scale) ** (1.0 / (num_blocks - 1))


def _check_args(base_lr, gamma, weight_decay, tied_policy, min_scale, freeze_below) -> None:
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    problems = []
    if not number(gamma) or not 0 < gamma <= 1:
        problems.append(f"gamma must be in (0, 1], got {gamma!r}")
    if not number(base_lr) or base_lr <= 0:
        problems.append(f"base_lr must be > 0 and finite, got {base_lr!r}")
    if not number(weight_decay) or weight_decay < 0:
        problems.append(f"weight_decay must be >= 0 and finite, got {weight_decay!r}")
    if not number(min_scale) or not 0 <= min_scale <= 1:
        problems.append(f"min_scale must be in [0, 1], got {min_scale!r}")
    if not number(freeze_below) or not 0 <= freeze_below <= 1:
        problems.append(f"freeze_below must be in [0, 1], got {freeze_below!r}")
    if tied_policy not in TIED_POLICIES:
        problems.append(f"tied_policy must be one of {', '.join(TIED_POLICIES)}, got {tied_policy!r}")
    if problems:
        raise ValueError("; ".join(problems))


def build_param_groups(
    model: nn.Module,
    base_lr: float,
    gamma: float = 1.0,
    weight_decay: float = 0.0,
    *,
    tied_policy: str = DEFAULT_TIED_POLICY,
    min_scale: float = 0.0,
    freeze_below: float = 0.0,
    block_path: str | None = None,
    lr_groups: dict[str, float] | None = None,
    loraplus_ratio: float = 1.0,
) -> LLRDPlan:
    """Optimizer param groups with layer-wise LR decay: ``torch.optim.AdamW(plan.groups)``.

    Each group stores its absolute ``lr = base_lr * scale`` where, for N blocks, block i →
    ``gamma ** (N - 1 - i)``, embeddings → ``gamma ** (N - 1)``, head/final norm → 1, and
    ``scale = max(scale, min_scale)``. Example: N = 4, gamma = 0.5, base_lr = 1e-3 gives block_3 1e-3,
    block_2 5e-4, block_1 2.5e-4, block_0 and embeddings 1.25e-4, head 1e-3.

    Only trainable parameters are grouped, each in exactly one group. Weight decay goes to matrices only
    (see the module docstring); with ``weight_decay == 0`` each depth is one group, otherwise up to two
    (``<depth>`` and ``<depth>.no_decay``). Parameters whose scale is below ``freeze_below`` are left out and
    listed in ``frozen_param_names`` (call ``apply_freeze(plan)`` to set ``requires_grad=False``). The model is
    not changed.

    ``lr_groups`` maps regexes to LR factors (``{"mlp": 0.5, "embed_tokens|wte": 0.1}``; factor 0 freezes);
    ``loraplus_ratio`` multiplies the LR of LoRA B matrices. Both compose with the depth scale:
    ``lr = base_lr * depth_scale * factor * loraplus``. The clamp and ``freeze_below`` apply to the depth scale.

    If the block list cannot be found: ``BlockStructureError`` when ``layer_decay_requested(gamma, min_scale,
    freeze_below)``; otherwise a flat plan (``structure_found=False``) with a warning. ``block_path`` names the
    block list explicitly (e.g. ``"model.layers"``).
    """
    _check_args(base_lr, gamma, weight_decay, tied_policy, min_scale, freeze_below)
    lr_groups = dict(lr_groups or {})
    for pattern, factor in lr_groups.items():
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 0:
            raise ValueError(f"LR group {pattern!r}: factor must be a finite number >= 0 (0 freezes), got {factor!r}")
    if (
        isinstance(loraplus_ratio, bool)
        or not isinstance(loraplus_ratio, (int, float))
        or not (math.isfinite(loraplus_ratio) and loraplus_ratio > 0)
    ):
        raise ValueError(f"loraplus_ratio must be a finite number > 0, got {loraplus_ratio!r}")
    gamma, base_lr, weight_decay = float(gamma), float(base_lr), float(weight_decay)
    min_scale, freeze_below = float(min_scale), float(freeze_below)
    warnings: list[str] = []
    try:
        layout = _resolve_blocks(model, block_path)
    except BlockStructureError as err:
        if layer_decay_requested(gamma, min_scale, freeze_below):
            raise
        layout = None
        warnings.append(f"LLRD: block structure not resolved, using one flat LR group (exact for γ = 1). {err}")
    n_cfg = _config_num_layers(model)
    if layout is not None and not layout.hierarchical and n_cfg is not None and len(layout.blocks) != n_cfg:
        warnings.append(
            f"LLRD: block list {layout.path} has {len(layout.blocks)} blocks but the config says {n_cfg}; "
            f"using N = {len(layout.blocks)}"
        )
    n = len(layout.blocks) if layout is not None else 0
    head = n + 1

    def scale_of(d: int) -> float:
        if layout is None:
            return 1.0
        raw = 1.0 if d > n else gamma ** (n - max(d, 1))
        return max(raw, min_scale)

    def depth_name(d: int) -> str:
        if layout is None:
            return "all"
        return "embeddings" if d == 0 else "head" if d == head else f"block_{d - 1}"

    depth, tied = _assign_depths(model, layout, tied_policy)
    decays = _decay_mask(model, weight_decay)
    patterns = _pattern_factors(model, lr_groups)
    lora_b = {id(p) for name, p in model.named_parameters() if _LORA_B.search(name)}
    if loraplus_ratio != 1.0 and not any(p.requires_grad for _, p in model.named_parameters() if id(p) in lora_b):
        raise ValueError("loraplus_ratio needs LoRA adapters: the model has no trainable lora_B matrix")
    depths = range(n + 2) if layout is not None else range(1)
    per_depth = any(scale_of(d) != 1.0 for d in depths)

    # bucket: (depth or None when every depth has the base LR, pattern, LoRA+?, decay?) -> [(name, tensor)]
    buckets: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
    counts = {d: [0, 0] for d in depths}  # [elements, tensors] of trainable parameters per depth
    frozen_names, frozen_params, saved = [], [], 0
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        d = depth[id(p)]
        counts[d][0] += p.numel()
        counts[d][1] += 1
        pattern, factor = patterns.get(id(p), (None, 1.0))
        if (layout is not None and scale_of(d) < freeze_below) or factor == 0:
            frozen_names.append(name)
            frozen_params.append(p)
            saved += 2 * p.numel() * p.element_size()
            continue
        key = (d if per_depth else None, pattern, id(p) in lora_b and loraplus_ratio != 1.0, id(p) in decays)
        buckets.setdefault(key, []).append((name, p))

    order = {pattern: i for i, pattern in enumerate([None, *lr_groups])}
    groups, param_names = [], {}
    for key in sorted(buckets, key=lambda k: (-1 if k[0] is None else k[0], order[k[1]], k[2], not k[3])):
        d, pattern, plus, decay = key
        members = buckets[key]
        gname = depth_name(d) if d is not None else "all"
        gname += (f"+{pattern}" if pattern is not None else "") + ("+loraplus" if plus else "")
        gname += "" if decay or weight_decay == 0 else ".no_decay"
        depth_scale = scale_of(d) if d is not None else 1.0
        factor = lr_groups[pattern] if pattern is not None else 1.0
        plus_factor = float(loraplus_ratio) if plus else 1.0
        scale = depth_scale * factor * plus_factor
        groups.append(
            {
                "params": [p for _, p in members],
                "lr": base_lr * scale,
                "weight_decay": weight_decay if decay else 0.0,
                "name": gname,
                "scale": scale,
                "depth": d,
                "depth_scale": depth_scale,
                "pattern": pattern,
                "factor": float(factor),
                "loraplus": plus_factor,
            }
        )
        param_names[gname] = [nm for nm, _ in members]

    grouped_depths = {depth[id(p)] for g in groups for p in g["params"]}
    factors_at: dict[int, set[str]] = {d: set() for d in depths}
    for g in groups:
        for p in g["params"]:
            if g["pattern"] is not None:
                factors_at[depth[id(p)]].add(f"{g['pattern']}×{g['factor']:g}")
            if g["loraplus"] != 1.0:
                factors_at[depth[id(p)]].add(f"LoRA+ B×{g['loraplus']:g}")
    for p in model.parameters():
        if id(p) in patterns and patterns[id(p)][1] == 0 and p.requires_grad:
            factors_at[depth[id(p)]].add(f"{patterns[id(p)][0]}×0 (frozen)")
    rows = [
        {
            "block": depth_name(d),
            "depth": d,
            "n_params": counts[d][0],
            "n_tensors": counts[d][1],
            "lr": base_lr * scale_of(d),
            "scale": scale_of(d),
            "weight_decay": weight_decay,
            "frozen": layout is not None and scale_of(d) < freeze_below,
            "tied": tied["tied"] and tied["depth"] == d,
            "trainable": d in grouped_depths,
            "factors": sorted(factors_at[d]),
        }
        for d in depths
    ]

    if layout is not None and n and gamma ** (n - 1) < 1e-3 and min_scale == 0 and freeze_below == 0:
        warnings.append(
            f"LLRD: the lowest LR scale is γ^{n - 1} = {gamma ** (n - 1):.2g}, so the bottom blocks and embeddings "
            "barely train; consider a minimum scale (e.g. 0.01) or freezing the blocks below a scale"
        )
    num_layers = n if layout is not None else (n_cfg or 0)
    return LLRDPlan(
        groups=groups,
        param_names=param_names,
        rows=rows,
        num_layers=num_layers,
        block_path=layout.path if layout is not None else None,
        base_lr=base_lr,
        gamma=gamma,
        weight_decay=weight_decay,
        tied=tied["tied"],
        tied_policy=tied_policy,
        tied_param_name=tied["name"],
        tied_lr=None if not tied["tied"] else base_lr * scale_of(tied["depth"]),
        min_scale=min_scale,
        freeze_below=freeze_below,
        frozen_param_names=frozen_names,
        frozen_state_bytes_saved=saved,
        warnings=warnings,
        structure_found=layout is not None,
        hierarchical=layout is not None and layout.hierarchical,
        lr_groups={k: float(v) for k, v in lr_groups.items()},
        param_depths={name: depth[id(p)] for name, p in model.named_parameters()},
        loraplus_ratio=float(loraplus_ratio),
        frozen_params=frozen_params,
    )
