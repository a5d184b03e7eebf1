"""The plan: plain data (the optimizer groups and what a report needs), and freezing as its own step. Torch only."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from posttrainllm.constants import DEFAULT_TIED_POLICY
from posttrainllm.llrd.structure import _first, strip_wrappers


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
    vision: dict | None = None  # a vision-language model's towers: gamma, projector_scale, freeze, num_layers, paths

    @property
    def display_order(self) -> list[dict]:
        """The rows input to output: a vision-language model's vision rows and projector first, then the decoder's."""
        first = {"vision": 0, "projector": 1}
        return sorted(self.rows, key=lambda r: first.get(r.get("tower", "language"), 2))

    @property
    def lr_scaled(self) -> bool:
        """True when some trainable parameter gets another LR than the base LR, or some are frozen by the plan: the
        one predicate for "layer decay (or an LR factor) is active"."""
        return any(g["lr"] != self.base_lr for g in self.groups) or bool(self.frozen_param_names)

    def to_json(self) -> list[dict]:
        """Groups without tensors (``param_groups.json``): name, lr, weight_decay, scale (= lr / base_lr), depth,
        the factors of the composition: depth_scale, pattern (or None), factor, loraplus; for a vision-language
        model the group's tower; then params."""
        keys: tuple[str, ...] = ("name", "lr", "weight_decay", "scale", "depth", "depth_scale", "pattern", "factor")
        keys += ("loraplus",)
        keys += ("tower",) if self.vision is not None else ()
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
    """Set ``requires_grad=False`` on the parameters the plan froze (``freeze_below``, a factor 0, a frozen vision
    tower); returns how many."""
    for p in plan.frozen_params:
        p.requires_grad_(False)
    return len(plan.frozen_params)


def report_rows(
    model, groups, depths, depth, counts, patterns, tied, base_lr, weight_decay, freeze_below
) -> list[dict]:
    """One row per depth (embeddings, block_0 .. block_{N-1}, head) for the banner and the records: its parameter
    counts, LR, scale, whether it is frozen or holds the tied matrix, and the LR factors that apply inside it."""
    grouped_depths = {depth[id(p)] for g in groups for p in g["params"]}
    factors_at: dict[int, set[str]] = {d: set() for d in depths.all}
    for g in groups:
        for p in g["params"]:
            if g["pattern"] is not None:
                factors_at[depth[id(p)]].add(f"{g['pattern']}×{g['factor']:g}")
            if g["loraplus"] != 1.0:
                factors_at[depth[id(p)]].add(f"LoRA+ B×{g['loraplus']:g}")
    for p in model.parameters():
        if id(p) in patterns and patterns[id(p)][1] == 0 and p.requires_grad:
            factors_at[depth[id(p)]].add(f"{patterns[id(p)][0]}×0 (frozen)")
    return [
        {
            "block": depths.name(d),
            "depth": d,
            "n_params": counts[d][0],
            "n_tensors": counts[d][1],
            "lr": base_lr * depths.scale(d),
            "scale": depths.scale(d),
            "weight_decay": weight_decay,
            "tower": depths.tower(d),
            "frozen": depths.frozen(d, freeze_below),
            "tied": tied["tied"] and tied["depth"] == d,
            "trainable": d in grouped_depths,
            "factors": sorted(factors_at[d]),
        }
        for d in depths.all
    ]
