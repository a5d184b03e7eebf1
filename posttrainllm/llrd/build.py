"""``build_param_groups``: validate once, find the depths, scale, bucket, name the groups. Torch only.

    lr = base_lr * depth_scale * pattern_factor * loraplus_factor,   depth_scale = max(gamma ** (N - 1 - i), min_scale)

Worked example: N = 4, gamma = 0.5, base_lr = 1e-3 gives block_3 1e-3, block_2 5e-4, block_1 2.5e-4, block_0 and
embeddings 1.25e-4, head 1e-3 (the package docstring has the whole rule).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import nn

from posttrainllm.constants import DEFAULT_TIED_POLICY, TIED_POLICIES
from posttrainllm.llrd.errors import BlockStructureError, LLRDArgumentError
from posttrainllm.llrd.plan import LLRDPlan, layer_decay_requested, report_rows
from posttrainllm.llrd.structure import (
    _assign_depths,
    _config_num_layers,
    _first,
    _io_embeddings,
    _Layout,
    _resolve_blocks,
    strip_wrappers,
)
from posttrainllm.llrd.towers import VisionArgs, find_towers

# LoRA+ (Hayou et al., 2024): the B matrices of LoRA adapters (PEFT names them lora_B / lora_embedding_B).
_LORA_B = re.compile(r"(?:^|\.)lora_(?:embedding_)?B(?:\.|$)")
# Weight decay exclusions, as transformers' Trainer.get_decay_parameter_names (matched on the lowercased name).
_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")
# ViT-style free tensors that never decay (timm's no_weight_decay(), MAE/BEiT recipes); whole last name part.
_NO_DECAY_TOKENS = re.compile(
    r"(?:^|\.)(?:cls_token|dist_token|reg_token|mask_token|pos_embed|absolute_pos_embed|position_embeddings"
    r"|relative_position_bias_table)$"
)


def gamma_for_bottom_scale(bottom_scale: float, num_blocks: int) -> float:
    """The γ that gives block 0 (and the embeddings) the LR scale `bottom_scale` in a `num_blocks`-block model:
    ``bottom_scale ** (1 / (num_blocks - 1))`` (1.0 for a single block)."""
    if not (isinstance(bottom_scale, (int, float)) and 0 < bottom_scale <= 1):
        raise LLRDArgumentError("bottom_scale", f"bottom scale must be in (0, 1], got {bottom_scale!r}")
    return 1.0 if num_blocks <= 1 else float(bottom_scale) ** (1.0 / (num_blocks - 1))


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _validate(base_lr, gamma, weight_decay, tied_policy, min_scale, freeze_below, lr_groups, loraplus_ratio) -> None:
    """Every argument checked once; an LLRDArgumentError naming each one at fault."""
    problems: list[tuple[str, str]] = []
    if not _number(gamma) or not 0 < gamma <= 1:
        problems.append(("gamma", f"gamma must be in (0, 1], got {gamma!r}"))
    if not _number(base_lr) or base_lr <= 0:
        problems.append(("base_lr", f"base_lr must be > 0 and finite, got {base_lr!r}"))
    if not _number(weight_decay) or weight_decay < 0:
        problems.append(("weight_decay", f"weight_decay must be >= 0 and finite, got {weight_decay!r}"))
    if not _number(min_scale) or not 0 <= min_scale <= 1:
        problems.append(("min_scale", f"min_scale must be in [0, 1], got {min_scale!r}"))
    if not _number(freeze_below) or not 0 <= freeze_below <= 1:
        problems.append(("freeze_below", f"freeze_below must be in [0, 1], got {freeze_below!r}"))
    if tied_policy not in TIED_POLICIES:
        problems.append(("tied_policy", f"tied_policy must be one of {', '.join(TIED_POLICIES)}, got {tied_policy!r}"))
    for pattern, factor in lr_groups.items():
        if not _number(factor) or factor < 0:
            why = f"LR group {pattern!r}: factor must be a finite number >= 0 (0 freezes), got {factor!r}"
            problems.append(("lr_groups", why))
    if not _number(loraplus_ratio) or loraplus_ratio <= 0:
        problems.append(("loraplus_ratio", f"loraplus_ratio must be a finite number > 0, got {loraplus_ratio!r}"))
    if problems:
        fields = tuple(dict.fromkeys(f for f, _ in problems))
        raise LLRDArgumentError(fields[0], "; ".join(m for _, m in problems), fields=fields)


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
    wrapper-stripped name). A parameter matched by two patterns, or a pattern matching nothing, is an
    LLRDArgumentError."""
    compiled = []
    for pattern, factor in lr_groups.items():
        try:
            compiled.append((pattern, re.compile(pattern), factor))
        except re.error as e:
            raise LLRDArgumentError(
                "lr_groups", f"LR group pattern {pattern!r} is not a valid regular expression: {e}"
            ) from None
    found: dict[int, tuple[str, float]] = {}
    hits = {pattern: 0 for pattern in lr_groups}
    names = []
    for name, p in model.named_parameters():
        plain = strip_wrappers(name)
        names.append(plain)
        matched = [(pattern, factor) for pattern, rx, factor in compiled if rx.search(plain)]
        if len(matched) > 1:
            both = " and ".join(repr(m[0]) for m in matched)
            raise LLRDArgumentError(
                "lr_groups", f"parameter {plain} matches LR group patterns {both}; make the patterns disjoint"
            )
        if matched:
            found[id(p)] = matched[0]
            hits[matched[0][0]] += 1
    unmatched = [pattern for pattern, n in hits.items() if n == 0]
    if unmatched:
        raise LLRDArgumentError(
            "lr_groups",
            f"LR group pattern {unmatched[0]!r} matches no parameter; parameter names look like: {_first(names, 6)}",
        )
    return found


@dataclass(frozen=True)
class _Depths:
    """The depths of a plan and their LR scales: N decoder blocks (``layout`` None: one flat depth) and, for a
    vision-language model, M vision blocks and the projector.

    Depth numbers: 0 embeddings, i + 1 block i, N + 1 head (as for a text model), then N + 2 vision embeddings,
    N + 3 + j vision block j, N + M + 3 projector. ``order`` lists them input to output (vision, projector, text)."""

    layout: _Layout | None
    gamma: float
    min_scale: float
    m: int = 0
    vision_gamma: float = 1.0
    projector_scale: float = 1.0
    freeze_vision: bool = False

    @property
    def n(self) -> int:
        return len(self.layout.blocks) if self.layout is not None else 0

    @property
    def all(self) -> range:
        if self.layout is None:
            return range(1)
        return range(self.n + self.m + 4) if self.m else range(self.n + 2)

    @property
    def order(self) -> list[int]:
        text = list(range(self.n + 2)) if self.layout is not None else [0]
        return [*range(self.n + 2, self.n + self.m + 4), *text] if self.m else text

    def tower(self, d: int) -> str:
        if not self.m or d <= self.n + 1:
            return "language"
        return "projector" if d == self.n + self.m + 3 else "vision"

    def scale(self, d: int) -> float:
        if self.layout is None:
            return 1.0
        if self.tower(d) == "projector":
            return self.projector_scale
        if self.tower(d) == "vision":  # vision block j = d - N - 3 (embeddings: block 0's scale)
            return max(self.vision_gamma ** (self.m - max(d - self.n - 2, 1)), self.min_scale)
        return max(1.0 if d > self.n else self.gamma ** (self.n - max(d, 1)), self.min_scale)

    def frozen(self, d: int, freeze_below: float) -> bool:
        """Planned frozen: a scale below ``freeze_below``, the vision tower under ``freeze_vision``, a projector
        factor of 0."""
        if self.layout is None:
            return False
        tower = self.tower(d)
        return (
            self.scale(d) < freeze_below
            or (tower == "vision" and self.freeze_vision)
            or (tower == "projector" and self.projector_scale == 0)
        )

    def name(self, d: int) -> str:
        if self.layout is None:
            return "all"
        if self.tower(d) == "projector":
            return "projector"
        if self.tower(d) == "vision":
            return "vision.embeddings" if d == self.n + 2 else f"vision.block_{d - self.n - 3}"
        return "embeddings" if d == 0 else "head" if d == self.n + 1 else f"block_{d - 1}"


def _structure(model, block_path, vision: VisionArgs, requested: bool, warnings: list[str]):
    """The decoder's block layout and, for a vision-language model, its towers; ``(None, None)`` (a flat plan, with
    a warning) when they are not found and no decay needs them."""
    try:
        _, out_emb = _io_embeddings(model)
        out_ids = {id(p) for p in out_emb.parameters()} if out_emb is not None else set()
        towers = find_towers(model, block_path, vision.block_path, out_ids)
        layout = towers.text if towers is not None else _resolve_blocks(model, block_path)
    except BlockStructureError as err:
        if requested:
            raise
        warnings.append(f"LLRD: block structure not resolved, using one flat LR group (exact for γ = 1). {err}")
        return None, None
    n_cfg = _config_num_layers(model)
    if not layout.hierarchical and n_cfg is not None and len(layout.blocks) != n_cfg:
        warnings.append(
            f"LLRD: block list {layout.path} has {len(layout.blocks)} blocks but the config says {n_cfg}; "
            f"using N = {len(layout.blocks)}"
        )
    return layout, towers


def _depths_of(model, layout, towers, gamma, min_scale, vision: VisionArgs, tied_policy):
    """The plan's depths and their scales, every parameter's depth (vision and projector ones included) and the
    tied-matrix facts."""
    m = towers.m if towers is not None else 0
    depths = _Depths(layout, gamma, min_scale, m, vision.gamma_or(gamma), vision.projector, bool(vision.freeze and m))
    depth, tied = _assign_depths(model, layout, tied_policy)
    if towers is not None:
        depth.update(towers.depths(depths.n))
    return depths, depth, tied


def _tied_fields(tied: dict, tied_policy: str, base_lr: float, depths: _Depths) -> dict:
    """The plan's fields on a tied input/output matrix: whether there is one, the policy, its name and its LR."""
    lr = None if not tied["tied"] else base_lr * depths.scale(tied["depth"])
    return {"tied": tied["tied"], "tied_policy": tied_policy, "tied_param_name": tied["name"], "tied_lr": lr}


def _low_scale_warning(depths: _Depths, freeze_below: float) -> list[str]:
    """A warning when the decoder's lowest LR scale is so small that the bottom blocks barely train."""
    n, gamma = depths.n, depths.gamma
    if depths.layout is None or not n or gamma ** (n - 1) >= 1e-3 or depths.min_scale != 0 or freeze_below != 0:
        return []
    return [
        f"LLRD: the lowest LR scale is γ^{n - 1} = {gamma ** (n - 1):.2g}, so the bottom blocks and embeddings "
        "barely train; consider a minimum scale (e.g. 0.01) or freezing the blocks below a scale"
    ]


def _bucket(model, depths: _Depths, depth, patterns, plus_ids, decays, freeze_below):
    """Trainable parameters by (depth or None when every depth has the base LR, pattern, LoRA+?, decay?), the
    per-depth [elements, tensors] counts, and what the plan freezes; an LLRDArgumentError when it freezes all."""
    per_depth = any(depths.scale(d) != 1.0 for d in depths.all)
    buckets: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
    counts = {d: [0, 0] for d in depths.all}
    frozen: list[tuple[str, torch.Tensor]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        d = depth[id(p)]
        counts[d][0] += p.numel()
        counts[d][1] += 1
        pattern, factor = patterns.get(id(p), (None, 1.0))
        if depths.frozen(d, freeze_below) or factor == 0:
            frozen.append((name, p))
            continue
        key = (d if per_depth else None, pattern, id(p) in plus_ids, id(p) in decays)
        buckets.setdefault(key, []).append((name, p))
    if frozen and not buckets:
        _nothing_left(frozen, patterns, freeze_below)
    return buckets, counts, frozen


def _groups(buckets, depths: _Depths, base_lr, weight_decay, lr_groups, loraplus_ratio):
    """One optimizer group per bucket, in depth / pattern / LoRA+ / decay order, and their parameter names."""
    order = {pattern: i for i, pattern in enumerate([None, *lr_groups])}
    groups, param_names = [], {}
    rank = {d: i for i, d in enumerate(depths.order)}
    for key in sorted(buckets, key=lambda k: (-1 if k[0] is None else rank[k[0]], order[k[1]], k[2], not k[3])):
        d, pattern, plus, decay = key
        gname = depths.name(d) if d is not None else "all"
        gname += (f"+{pattern}" if pattern is not None else "") + ("+loraplus" if plus else "")
        gname += "" if decay or weight_decay == 0 else ".no_decay"
        depth_scale = depths.scale(d) if d is not None else 1.0
        factor = lr_groups[pattern] if pattern is not None else 1.0
        plus_factor = float(loraplus_ratio) if plus else 1.0
        scale = depth_scale * factor * plus_factor
        groups.append(
            {
                "params": [p for _, p in buckets[key]],
                "lr": base_lr * scale,
                "weight_decay": weight_decay if decay else 0.0,
                "name": gname,
                "scale": scale,
                "depth": d,
                "tower": depths.tower(d) if d is not None else "all",
                "depth_scale": depth_scale,
                "pattern": pattern,
                "factor": float(factor),
                "loraplus": plus_factor,
            }
        )
        param_names[gname] = [nm for nm, _ in buckets[key]]
    return groups, param_names


def _nothing_left(frozen, patterns, freeze_below) -> None:
    """Every trainable parameter frozen (an optimizer would get no parameter): an LLRDArgumentError naming what
    froze them, ``lr_groups`` (the factor-0 patterns) and/or ``freeze_below``."""
    zero = list(dict.fromkeys(patterns[id(p)][0] for _, p in frozen if patterns.get(id(p), (None, 1.0))[1] == 0))
    by_depth = any(patterns.get(id(p), (None, 1.0))[1] != 0 for _, p in frozen)
    why = [f"LR group pattern(s) {', '.join(repr(z) for z in zero)} with factor 0"] if zero else []
    why += [f"freeze_below={freeze_below:g} (every depth whose LR scale is below it)"] if by_depth else []
    fields = (("lr_groups",) if zero else ()) + (("freeze_below",) if by_depth else ())
    raise LLRDArgumentError(
        fields[0],
        f"nothing left to train: all {len(frozen)} trainable tensors are frozen by {' and '.join(why)}; "
        "give some parameters a factor above 0 or freeze less",
        fields=fields,
    )


def _lora_b_ids(model, loraplus_ratio: float) -> set[int]:
    """The LoRA B matrices LoRA+ scales (none when the ratio is 1); a model without trainable ones is an error."""
    if loraplus_ratio == 1.0:
        return set()
    ids = {id(p) for name, p in model.named_parameters() if _LORA_B.search(name)}
    if not any(p.requires_grad for _, p in model.named_parameters() if id(p) in ids):
        raise LLRDArgumentError(
            "loraplus_ratio", "loraplus_ratio needs LoRA adapters: the model has no trainable lora_B matrix"
        )
    return ids


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
    vision_gamma: float | None = None,
    projector_scale: float | None = None,
    freeze_vision: bool = False,
    vision_block_path: str | None = None,
) -> LLRDPlan:
    """Optimizer param groups with layer-wise LR decay: ``torch.optim.AdamW(plan.groups)``.

    Each group stores its absolute ``lr = base_lr * scale`` where, for N blocks, block i → ``gamma ** (N - 1 - i)``,
    embeddings → ``gamma ** (N - 1)``, head/final norm → 1, and ``scale = max(scale, min_scale)``. Example: N = 4,
    gamma = 0.5, base_lr = 1e-3 gives block_3 1e-3, block_2 5e-4, block_1 2.5e-4, block_0 and embeddings 1.25e-4,
    head 1e-3.

    Only trainable parameters are grouped, each in exactly one group. Weight decay goes to matrices only (see the
    module docstring); with ``weight_decay == 0`` each depth is one group, otherwise up to two (``<depth>`` and
    ``<depth>.no_decay``). Parameters whose scale is below ``freeze_below`` are left out and listed in
    ``frozen_param_names`` (call ``apply_freeze(plan)`` to set ``requires_grad=False``). The model is not changed.

    ``lr_groups`` maps regexes to LR factors (``{"mlp": 0.5, "embed_tokens|wte": 0.1}``; factor 0 freezes);
    ``loraplus_ratio`` multiplies the LR of LoRA B matrices. Both compose with the depth scale:
    ``lr = base_lr * depth_scale * factor * loraplus``. The clamp and ``freeze_below`` apply to the depth scale.

    If the block list cannot be found: ``BlockStructureError`` when ``layer_decay_requested(gamma, min_scale,
    freeze_below)``; otherwise a flat plan (``structure_found=False``) with a warning. ``block_path`` names the block
    list (e.g. ``"model.layers"``). Vision-language models: vision block j of M at ``vision_gamma ** (M - 1 - j)``
    (None: ``gamma``), the projector at ``projector_scale`` (None: 1), ``freeze_vision``, ``vision_block_path``: see
    the package docstring.
    """
    lr_groups = dict(lr_groups or {})
    _validate(base_lr, gamma, weight_decay, tied_policy, min_scale, freeze_below, lr_groups, loraplus_ratio)
    gamma, base_lr, weight_decay = float(gamma), float(base_lr), float(weight_decay)
    min_scale, freeze_below = float(min_scale), float(freeze_below)
    vision = VisionArgs(vision_gamma, projector_scale, freeze_vision, vision_block_path).checked(model)
    warnings: list[str] = []
    requested = layer_decay_requested(gamma, min_scale, freeze_below) or vision.requested(gamma)
    layout, towers = _structure(model, block_path, vision, requested, warnings)
    depths, depth, tied = _depths_of(model, layout, towers, gamma, min_scale, vision, tied_policy)
    patterns = _pattern_factors(model, lr_groups)
    plus_ids = _lora_b_ids(model, loraplus_ratio)
    decays = _decay_mask(model, weight_decay)
    buckets, counts, frozen = _bucket(model, depths, depth, patterns, plus_ids, decays, freeze_below)
    groups, param_names = _groups(buckets, depths, base_lr, weight_decay, lr_groups, loraplus_ratio)
    rows = report_rows(model, groups, depths, depth, counts, patterns, tied, base_lr, weight_decay, freeze_below)
    warnings += _low_scale_warning(depths, freeze_below)
    return LLRDPlan(
        groups=groups,
        param_names=param_names,
        rows=rows,
        num_layers=depths.n if layout is not None else (_config_num_layers(model) or 0),
        block_path=layout.path if layout is not None else None,
        base_lr=base_lr,
        gamma=gamma,
        weight_decay=weight_decay,
        **_tied_fields(tied, tied_policy, base_lr, depths),
        min_scale=min_scale,
        freeze_below=freeze_below,
        frozen_param_names=[name for name, _ in frozen],
        frozen_state_bytes_saved=sum(2 * p.numel() * p.element_size() for _, p in frozen),
        warnings=warnings,
        structure_found=layout is not None,
        hierarchical=layout is not None and layout.hierarchical,
        lr_groups={k: float(v) for k, v in lr_groups.items()},
        param_depths={name: depth[id(p)] for name, p in model.named_parameters()},
        loraplus_ratio=float(loraplus_ratio),
        frozen_params=[p for _, p in frozen],
        vision=None if towers is None else vision.record(towers, depths.vision_gamma),
    )
