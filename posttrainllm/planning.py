"""The run's one LLRD plan, built from the config: library errors in the CLI's words (by the error's field), the γ
a bottom scale gives, and the max length the model allows. Imports torch only through posttrainllm.llrd."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from posttrainllm.errors import ModelStructureError, UsageError

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig

# the library's argument (LLRDArgumentError.field) -> the option that sets it; any other: "layer-wise LR decay"
LLRD_FLAGS = {
    "block_path": "--llrd-blocks",
    "lr_groups": "--lr-group",
    "loraplus_ratio": "--loraplus-ratio",
    "freeze_below": "--llrd-freeze-below",
    "vision_gamma": "--vision-llrd",
    "projector_scale": "--projector-lr-scale",
    "freeze_vision": "--freeze-vision",
    "vision_block_path": "--vision-blocks",
}
_VISION_FIELDS = ("vision_gamma", "projector_scale", "freeze_vision")


def plan_param_groups(cfg: RunConfig, model):
    """The run's one LLRD plan (llrd.build_param_groups), with freezing applied; library errors get the CLI's words.

    The plan printed in the banner and saved as param_groups.json is the plan the trainer's optimizer receives."""
    from posttrainllm import llrd

    try:
        gamma = cfg.llrd
        if cfg.llrd_bottom_scale:
            gamma = bottom_scale_gamma(cfg, llrd.count_blocks(model, cfg.llrd_blocks))
        plan = llrd.build_param_groups(
            model,
            cfg.lr,
            gamma,
            cfg.weight_decay,
            tied_policy=cfg.tied_embeddings,
            min_scale=cfg.llrd_min_scale,
            freeze_below=cfg.llrd_freeze_below,
            block_path=cfg.llrd_blocks,
            lr_groups=cfg.lr_groups,
            loraplus_ratio=cfg.loraplus_ratio or 1.0,
            vision_gamma=cfg.vision_llrd,
            projector_scale=cfg.projector_lr_scale,
            freeze_vision=cfg.freeze_vision,
            vision_block_path=cfg.vision_blocks,
        )
    except llrd.BlockStructureError as e:
        raise _structure_error(e) from None
    except llrd.LLRDArgumentError as e:
        if e.field in _VISION_FIELDS:  # every vision setting at fault, by its flag
            flags = ", ".join(LLRD_FLAGS[f] for f in e.fields if f in LLRD_FLAGS)
            raise UsageError(f"{flags}: {e}") from None
        raise UsageError(f"{LLRD_FLAGS.get(e.field, 'layer-wise LR decay')}: {e}") from None
    llrd.apply_freeze(plan)
    return plan


def _structure_error(e) -> ModelStructureError | UsageError:
    """A block list not found: what was found, and the flag (and recipe key) that names the list. A vision tower not
    found is a usage error (exit 2): the vision settings need it, and --vision-blocks names it."""
    flag = LLRD_FLAGS.get(e.field, "--llrd-blocks")
    key = flag.removeprefix("--").replace("-", "_")
    if e.field == "vision_block_path":
        example = e.candidates[0][0] if e.candidates else "model.vision_tower.encoder.layers"
        return UsageError(
            f"LLRD: {e}. Fix: name the vision tower's block list with {flag} PATH (recipe key `{key}`), e.g. "
            f"{flag} {example}; or drop --vision-llrd, --projector-lr-scale, --freeze-vision and use γ = 1"
        )
    example = e.candidates[0][0] if e.candidates else "model.layers"
    return ModelStructureError(
        f"LLRD: {e}. Fix: name the block list with {flag} PATH (recipe key `{key}`), "
        f"e.g. {flag} {example}; or use γ = 1 (no layer-wise decay)"
    )


def bottom_scale_gamma(cfg: RunConfig, num_blocks: int) -> float:
    """--llrd-bottom-scale S: the γ that gives block 0 (and the embeddings) the LR scale S on `num_blocks` blocks,
    γ = S^(1/(N-1)); a UsageError when that γ is outside the CLI's range."""
    from posttrainllm.config.checks import LLRD_MAX, LLRD_MIN, LLRD_RANGE
    from posttrainllm.llrd import gamma_for_bottom_scale

    s = cfg.llrd_bottom_scale
    gamma = gamma_for_bottom_scale(s, num_blocks)
    if not LLRD_MIN <= gamma <= LLRD_MAX:
        raise UsageError(
            f"--llrd-bottom-scale {s:g} on a {num_blocks}-block model means γ = {gamma:.4g}, outside {LLRD_RANGE}: "
            f"use a bottom scale of at least {LLRD_MIN ** (num_blocks - 1):.3g} (0.5^{num_blocks - 1})"
        )
    return gamma


def bottom_scale_note(cfg: RunConfig, plan) -> list[str]:
    """The banner's line saying which γ --llrd-bottom-scale gave."""
    n, s = plan.num_layers, cfg.llrd_bottom_scale
    if not s or n < 2:
        return []
    return [f"--llrd-bottom-scale {s:g} on {n} blocks: γ = {s:g}^(1/{n - 1}) = {plan.gamma:.4f}"]


CLAMPED = "model"  # cfg.sources' value for --max-length clamped to the model's positions


def length_advice(cfg: RunConfig) -> str:
    """How to fit examples that are too long: raise --max-length, or, when it was clamped to the model's positions,
    shorten them (the model reads no more)."""
    if cfg.sources.get("max_length") == CLAMPED:
        return (
            f"the model's limit of {cfg.max_length} positions (--max-length was clamped to it); shorten the examples "
            "or use a model with a longer context"
        )
    return f"--max-length {cfg.max_length}; raise --max-length"


def clamp_max_length(cfg: RunConfig, limit: int | None):
    """--max-length above the model's positions would crash models with learned position embeddings: clamp it
    (with a note when the user asked for more; the default simply becomes the model's limit). Returns the
    (possibly new) config and the notes."""
    if limit is None or cfg.max_length is None or cfg.max_length <= limit:
        return cfg, []
    asked = cfg.sources.get("max_length") != "default"
    note = f"--max-length {cfg.max_length} is more than the model's {limit} positions: using {limit}"
    sources = {**cfg.sources, "max_length": CLAMPED}  # the messages that follow speak of the model's limit
    return dataclasses.replace(cfg, max_length=limit, sources=sources), ([note] if asked else [])


def check_something_trains(cfg: RunConfig, names: list[str] | None) -> None:
    """Before the model loads: when the stored tensor names (posttrainllm/models/weights.py, local safetensors) are all
    matched by --lr-group patterns of factor 0, nothing would be left to train: a UsageError. Without names, or
    with LoRA (whose adapters are not stored), the plan builder says the same once the model is built."""
    import re

    zero = [p for p, f in cfg.lr_groups.items() if f == 0]
    if not names or not zero or cfg.lora_r:
        return
    try:
        compiled = [re.compile(p) for p in zero]
    except re.error:
        return  # the plan builder names the invalid pattern
    if all(any(rx.search(n) for rx in compiled) for n in names):
        shown = ", ".join(f"'{p}=0'" for p in zero)
        raise UsageError(
            f"--lr-group {shown}: nothing left to train: the pattern(s) freeze all {len(names)} weights of "
            f"{cfg.model}; give some parameters a factor above 0 or narrow the pattern(s)"
        )
