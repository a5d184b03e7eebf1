"""Build a command's trainer (its spec names the class) with the mixins installed and the run's plan passed to its
constructor."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from posttrainllm.errors import DataError
from posttrainllm.planning import length_advice
from posttrainllm.spec import load
from posttrainllm.training.args import trainer_config
from posttrainllm.training.kl_to_base import KLToBaseMixin, kl_to_base_kwargs
from posttrainllm.training.mixins import (
    DivergenceGuardMixin,
    EngineMixin,
    LLRDMixin,
    ResumedOrderMixin,
    check_distributed_engine,
)
from posttrainllm.training.padding_free import PaddingFreeMixin
from posttrainllm.training.progress import _log_callbacks, interactive

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.spec import CommandSpec


@functools.cache
def trainer_class(base: type, samples: bool, anchored: bool, *own: type) -> type:
    """`base` (a transformers/TRL trainer class) with posttrainllm's mixins in front: FSDP2 on CPU, the divergence
    guard, the plan's groups through create_optimizer, (`anchored`: --kl-to-base) the KL anchor's loss,
    (`samples`: TRL's RepeatSampler) the resumed order, (SFTTrainer) padding-free batches where exact, and the
    command's own mixins (`own`: its spec's `trainer_mixins`, e.g. sdft's moving teacher). One class per trainer class;
    the plan and the anchor's base are constructor arguments (`llrd_plan=`, `kl_base=`), never part of the class."""
    mixins: tuple[type, ...] = (EngineMixin, DivergenceGuardMixin, LLRDMixin) + ((KLToBaseMixin,) if anchored else ())
    mixins += (ResumedOrderMixin,) if samples else ()
    mixins += (PaddingFreeMixin,) if _is_sft(base) else ()
    mixins += own

    class Trainer(*mixins, base):  # type: ignore[misc]
        pass

    Trainer.__name__ = Trainer.__qualname__ = f"LLRD{base.__name__}"
    return Trainer


def _is_sft(base: type) -> bool:
    from trl import SFTTrainer

    return issubclass(base, SFTTrainer)


def build_trainer(
    spec: CommandSpec,
    cfg: RunConfig,
    *,
    model,
    tokenizer,
    train,
    eval_ds,
    plan,
    args=None,
    precision: str = "fp32",
    callbacks=(),
    **trainer_models: Any,
):
    """The command's trainer (`spec.trainer`) with the mixins and the run's plan. `args`: the run's trainer config
    (posttrainllm/lifecycle.py builds it once); without it, one is built here from `cfg` and `precision` (library
    use). `trainer_models`: the trainer's own models and rewards by its keywords (ref_model for dpo/kto,
    reward_funcs for grpo/rloo, teacher_model for distill; kl_base for --kl-to-base: the frozen base, absent under
    LoRA, where the base is the adapter-disabled model), never in the optimizer."""
    conf = args if args is not None else trainer_config(spec, cfg, precision, has_eval=eval_ds is not None)
    common = dict(
        args=conf, train_dataset=train, eval_dataset=eval_ds, processing_class=tokenizer, callbacks=list(callbacks)
    )
    if spec.collator is not None:
        common["data_collator"] = load(spec.collator)
    kl = kl_to_base_kwargs(cfg, trainer_models.pop("kl_base", None))  # {} at β = 0: no mixin, the plain trainer
    cls = trainer_class(load(spec.trainer), spec.samples, bool(kl), *(load(m) for m in spec.trainer_mixins))
    own = load(spec.trainer_kwargs)(cfg) if spec.trainer_kwargs else {}  # the command's own mixins' keywords
    trainer = cls(model=model, llrd_plan=plan, **trainer_models, **kl, **own, **common)
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    plain, bars = _log_callbacks()
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(bars() if interactive() and not conf.disable_tqdm else plain())
    check_distributed_engine(trainer, llrd_active=plan.lr_scaled)
    if hasattr(trainer.train_dataset, "__len__") and len(trainer.train_dataset) == 0:  # a stream has no length
        raise DataError(
            "no training example is left after tokenization: every example was longer before its completion started "
            f"(or was empty) than {length_advice(cfg)}"
        )
    return trainer


def total_steps(cfg: RunConfig, n_train: int | None, world_size: int = 1) -> int:
    """The optimizer steps of a run, as transformers' Trainer counts them: --max-steps when set, else
    ceil(epochs × ceil(batches per rank / accum)) with batches per rank = ceil(rows / (batch × ranks)).

    E.g. 32 rows, batch 4, accum 1, 1 epoch: 8 steps on one rank, 4 under ``torchrun --nproc_per_node 2``."""
    if cfg.max_steps > 0:
        return cfg.max_steps
    batches = math.ceil(n_train / (cfg.batch_size * world_size))
    return max(1, math.ceil(cfg.epochs * math.ceil(batches / cfg.grad_accum)))


def steps_row(cfg: RunConfig, n_train: int | None, length: str, world_size: int | None = None) -> str:
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
