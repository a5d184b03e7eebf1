"""Build the trainer for a kind (one of args.TRL_KINDS, or 'causal_lm') with the mixins installed and the run's
plan."""

from __future__ import annotations

import math

from posttrainllm.config.checks import ONLINE_RL, SAMPLING  # SAMPLING: the kinds using TRL's RepeatSampler
from posttrainllm.errors import DataError
from posttrainllm.training.args import TRL_KINDS, trainer_config
from posttrainllm.training.kl_to_base import KLToBaseMixin, kl_to_base_kwargs
from posttrainllm.training.mixins import (
    DivergenceGuardMixin,
    EngineMixin,
    LLRDMixin,
    ResumedOrderMixin,
    check_distributed_engine,
)
from posttrainllm.training.progress import _log_callbacks, interactive


def build_trainer(
    kind: str,
    cfg,
    *,
    model,
    tokenizer,
    train,
    eval_ds,
    precision: str,
    plan,
    ref_model=None,
    callbacks=(),
    loss=None,
    reward_funcs=None,
    teacher=None,
    kl_base=None,
):
    """Build the trainer for `kind` (TRL_KINDS, or 'causal_lm') with the LLRD mixin and the run's plan. The
    reference model (dpo, kto), the reward functions (grpo, rloo) and the teacher (distill) are the trainer's, never
    in the optimizer. `kl_base`: --kl-to-base's frozen base (None under LoRA: the adapter-disabled model)."""
    conf = trainer_config(kind, cfg, precision, has_eval=eval_ds is not None, loss=loss)
    common = dict(
        args=conf, train_dataset=train, eval_dataset=eval_ds, processing_class=tokenizer, callbacks=list(callbacks)
    )
    kl = kl_to_base_kwargs(cfg, kl_base)  # {} at β = 0: no mixin, the plain trainer
    common.update(kl)
    anchor = (KLToBaseMixin,) if kl else ()
    if kind in TRL_KINDS:
        import trl

        base = getattr(trl, TRL_KINDS[kind][0])
        mixins = (EngineMixin, DivergenceGuardMixin, LLRDMixin, *anchor) + (
            (ResumedOrderMixin,) if kind in SAMPLING else ()
        )
        cls = type(f"LLRD{base.__name__}", (*mixins, base), {"llrd_plan": plan})
        own = {"ref_model": ref_model} if kind in ("dpo", "kto") else {}
        if kind in ONLINE_RL:
            own = {"reward_funcs": list(reward_funcs or [])}
        elif kind == "distill":
            own = {"teacher_model": teacher}
        trainer = cls(model=model, **own, **common)
    else:
        from transformers import Trainer, default_data_collator

        mixins = (EngineMixin, DivergenceGuardMixin, LLRDMixin, *anchor)
        cls = type("LLRDTrainer", (*mixins, Trainer), {"llrd_plan": plan})
        trainer = cls(model=model, data_collator=default_data_collator, **common)
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    plain, bars = _log_callbacks()
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(bars() if interactive() and not conf.disable_tqdm else plain())
    check_distributed_engine(trainer, llrd_active=plan.lr_scaled)
    if hasattr(trainer.train_dataset, "__len__") and len(trainer.train_dataset) == 0:  # a stream has no length
        raise DataError(
            "no training example is left after tokenization: every example was "
            f"longer than --max-length {cfg.max_length} before its completion "
            "started (or was empty); raise --max-length"
        )
    return trainer


def total_steps(cfg, n_train: int | None, world_size: int = 1) -> int:
    """The optimizer steps of a run, as transformers' Trainer counts them: --max-steps when set, else
    ceil(epochs × ceil(batches per rank / accum)) with batches per rank = ceil(rows / (batch × ranks)).

    E.g. 32 rows, batch 4, accum 1, 1 epoch: 8 steps on one rank, 4 under ``torchrun --nproc_per_node 2``."""
    if cfg.max_steps > 0:
        return cfg.max_steps
    batches = math.ceil(n_train / (cfg.batch_size * world_size))
    return max(1, math.ceil(cfg.epochs * math.ceil(batches / cfg.grad_accum)))


def steps_row(cfg, n_train: int | None, length: str, world_size: int | None = None) -> str:
    """The banner's steps row: the true step count and the batch each step takes, across the ranks.

    E.g. ``4 (batch 4 per rank × 2 ranks × accum 2 = 16 rows per step, max length 64)``; on one rank
    ``8 (batch 4 × accum 2 = 8 rows per step, max length 64)``."""
    if world_size is None:
        from posttrainllm.rundir.layout import world_size as launched

        world_size = launched()
    steps = total_steps(cfg, n_train, world_size)
    per_step = cfg.batch_size * world_size * cfg.grad_accum
    ranks = f" per rank × {world_size} ranks" if world_size > 1 else ""
    return f"{steps} (batch {cfg.batch_size}{ranks} × accum {cfg.grad_accum} = {per_step} rows per step, {length})"
