"""How far each parameter moves from the base toward the tuned model: its merge scale s. Torch only.

    θ = θ_base + s · (θ_tuned − θ_base)

The depths are the layer-decay plan's (posttrainllm/llrd: the same block list, tied-embedding policy and head
detection as training), so block i of a merge is block i of training.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from posttrainllm.constants import DEFAULT_TIED_POLICY
from posttrainllm.llrd import build_param_groups

SCHEDULES = ("uniform", "geometric", "linear")


class MergeArgumentError(ValueError):
    """An invalid argument of ``merge_scales``; ``field`` names it (``"alpha"``, ``"gamma"``, ``"bottom_alpha"``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass
class MergeScales:
    """Every parameter's scale s by name (tied duplicates such as ``lm_head.weight`` under their own names too),
    the schedule, and one row per depth (``{"block", "depth", "scale"}``: embeddings, block_0 .. block_{N-1},
    head) for reports."""

    by_name: dict[str, float]
    schedule: str
    alpha: float
    num_blocks: int = 0
    gamma: float = 1.0
    bottom_alpha: float | None = None
    rows: list[dict] = field(default_factory=list)
    tied_param_name: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)  # stored name → parameter name, where they differ

    def scale_of(self, name: str) -> float:
        """The scale of a stored tensor: its parameter's (``aliases`` maps a stored name to its parameter's), else
        that of the nearest module holding parameters (a buffer inside block i moves with block i), else alpha."""
        name = self.aliases.get(name, name)
        if name in self.by_name:
            return self.by_name[name]
        prefix = name
        while "." in prefix:
            prefix = prefix.rsplit(".", 1)[0]
            for known, s in self.by_name.items():
                if known.startswith(prefix + "."):
                    return s
        return self.alpha


def _check(alpha, gamma, bottom_alpha) -> None:
    for fld, v, ok, want in (
        ("alpha", alpha, lambda x: 0 <= x <= 1, "[0, 1]"),
        ("gamma", gamma, lambda x: 0 < x <= 1, "(0, 1]"),
        ("bottom_alpha", bottom_alpha, lambda x: 0 <= x <= 1, "[0, 1]"),
    ):
        if v is None and fld == "bottom_alpha":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not ok(v):
            raise MergeArgumentError(fld, f"{fld} must be a number in {want}, got {v!r}")
    if bottom_alpha is not None and gamma != 1.0:
        raise MergeArgumentError("bottom_alpha", "give either gamma (geometric) or bottom_alpha (linear), not both")


def _depth_scale(d: int, n: int, alpha: float, gamma: float, bottom: float | None) -> float:
    """s of depth d (0 embeddings, i + 1 block i, n + 1 head)."""
    if d > n:
        return alpha
    i = max(d - 1, 0)
    if bottom is None:
        return alpha * gamma ** (n - 1 - i)
    return alpha if n == 1 else bottom + (alpha - bottom) * i / (n - 1)


def merge_scales(
    model: nn.Module,
    alpha: float,
    *,
    gamma: float = 1.0,
    bottom_alpha: float | None = None,
    tied_policy: str = DEFAULT_TIED_POLICY,
    block_path: str | None = None,
) -> MergeScales:
    """The merge scale s of every parameter of `model` (a model built on the meta device is enough).

    For N blocks (block 0 nearest the input):

    * uniform (WiSE-FT, ``gamma == 1`` and no ``bottom_alpha``): s = alpha everywhere;
    * geometric (``gamma < 1``): block i gets s = alpha · gamma^(N-1-i), exactly the layer-decay plan's LR factor
      (``build_param_groups(model, base_lr=1, gamma)``'s ``scale``) times alpha;
    * linear (LiNeS, ``bottom_alpha = B``): block i gets s = B + (alpha − B) · i / (N − 1);

    and in both depth schedules the embeddings get block 0's s, the head and final norm get alpha, and a tied
    input/output matrix follows ``tied_policy`` ("embedding": block 0's s; "head": alpha), as in training.

    Worked example, N = 4, alpha = 0.8: gamma = 0.5 gives blocks 0..3 the scales 0.1, 0.2, 0.4, 0.8 (embeddings 0.1,
    head 0.8); bottom_alpha = 0.2 gives 0.2, 0.4, 0.6, 0.8 (embeddings 0.2, head 0.8).

    Raises ``MergeArgumentError`` for values out of range, and the plan's ``BlockStructureError`` when a depth
    schedule needs blocks that cannot be found (``block_path`` names the block list).
    """
    _check(alpha, gamma, bottom_alpha)
    alpha, gamma = float(alpha), float(gamma)
    bottom = None if bottom_alpha is None else float(bottom_alpha)
    all_named = list(model.named_parameters(remove_duplicate=False))
    if bottom is None and gamma == 1.0:
        return MergeScales({n: alpha for n, _ in all_named}, "uniform", alpha)
    plan = build_param_groups(model, 1.0, gamma, tied_policy=tied_policy, block_path=block_path)
    n = plan.num_layers
    if bottom is None:  # the plan's factor relative to the base LR is the geometric schedule itself
        by_id = {id(p): alpha * g["scale"] for g in plan.groups for p in g["params"]}
    else:
        depth_of = dict(model.named_parameters())
        by_id = {id(depth_of[name]): _depth_scale(d, n, alpha, gamma, bottom) for name, d in plan.param_depths.items()}
    rows = [
        {"block": r["block"], "depth": r["depth"], "scale": _depth_scale(r["depth"], n, alpha, gamma, bottom)}
        for r in plan.rows
    ]
    return MergeScales(
        by_name={name: by_id[id(p)] for name, p in all_named},
        schedule="geometric" if bottom is None else "linear",
        alpha=alpha,
        num_blocks=n,
        gamma=gamma,
        bottom_alpha=bottom,
        rows=rows,
        tied_param_name=plan.tied_param_name,
    )
