"""`posttrainllm dpo`: Direct preference optimisation with TRL's DPOTrainer.

The setup the post-training commands share is posttrainllm/commands/post_training.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from posttrainllm.commands import POST_TRAINING_SETUP, default_reference, num_proc
from posttrainllm.commands.sft import max_length_steps
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def _fields(cfg: RunConfig) -> dict[str, Any]:
    return dict(
        beta=cfg.beta, max_length=cfg.max_length, dataset_num_proc=num_proc(cfg),
        loss_type=list(cfg.loss_type or ["sigmoid"]), loss_weights=cfg.loss_weights,
    )  # fmt: skip


def positive_beta(command: str, v: Mapping[str, Any]) -> list[str]:
    """dpo, kto: β > 0 (β = 0 removes the preference signal)."""
    if v.get("beta") is not None and v["beta"] <= 0:
        return [f"--beta must be > 0 for {command} (β = 0 removes the preference signal), got {v['beta']:g}"]
    return []


def loss_checks(command: str, v: Mapping[str, Any]) -> list[str]:
    """--loss-type / --loss-weights: each loss once, one weight per loss, the losses TRL would refuse later."""
    types, weights = v.get("loss_type") or [], v.get("loss_weights")
    problems = []
    twice = sorted({t for t in types if types.count(t) > 1})
    if twice:
        problems.append(
            f"--loss-type {', '.join(twice)} given more than once: give each loss once (--loss-weights "
            "sets how much it counts)"
        )
    if weights is not None and len(weights) != len(types):
        problems.append(
            f"--loss-weights has {len(weights)} weight(s) for {len(types)} --loss-type loss(es) "
            f"({', '.join(types)}): give one weight per loss, in the same order"
        )
    if "exo_pair" in types:
        smoothing = (v.get("trainer_args") or {}).get("label_smoothing", 0)
        try:
            ok = float(smoothing) > 0
        except (TypeError, ValueError):
            ok = True  # a malformed value is reported by the --trainer-arg check, naming the field's type
        if not ok:
            problems.append("--loss-type exo_pair needs label smoothing ε > 0: add --trainer-arg label_smoothing=1e-3")
    return problems


def dpo_loss_text(cfg: RunConfig) -> str:
    """The banner's DPO loss: `sigmoid`, or a weighted sum `0.8×sigmoid + 0.2×sft` (weights 1 when not given)."""
    types = list(cfg.loss_type or ["sigmoid"])
    if len(types) == 1 and not cfg.loss_weights:
        return types[0]
    weights = cfg.loss_weights or [1.0] * len(types)
    return " + ".join(f"{w:g}×{t}" for w, t in zip(weights, types))


def _rows(cfg: RunConfig) -> dict[str, str | None]:
    return {"DPO": f"β={cfg.beta}, loss {dpo_loss_text(cfg)}, reference={cfg.ref_model or default_reference(cfg)}"}


SPEC = CommandSpec(
    name="dpo",
    setup=POST_TRAINING_SETUP,
    sweep=True,
    help="Direct preference optimisation with TRL's DPOTrainer (prompt/chosen/rejected or ShareGPT preference data).",
    trainer="trl:DPOTrainer",
    trainer_config="trl:DPOConfig",
    trainer_fields=_fields,
    owned_fields={"loss_type": "--loss-type", "loss_weights": "--loss-weights"},
    data="preference",
    vision=True,
    reference="ref_model",
    lr=5e-7,
    max_length=512,
    defaults={"beta": 0.1},
    checks=(positive_beta, loss_checks),
    rows=_rows,
    steps=max_length_steps,
)
