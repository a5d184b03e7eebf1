"""Build the trainer for a kind ('sft' | 'dpo' | 'causal_lm') with the mixins installed and the run's plan."""

from __future__ import annotations

import math

from posttrainllm.errors import DataError
from posttrainllm.training.args import trainer_config
from posttrainllm.training.mixins import DivergenceGuardMixin, EngineMixin, LLRDMixin, check_distributed_engine
from posttrainllm.training.progress import _log_callbacks, interactive


def build_trainer(
    kind: str, cfg, *, model, tokenizer, train, eval_ds, precision: str, plan, ref_model=None, callbacks=(), loss=None
):
    """Build the trainer for `kind` ('sft' | 'dpo' | 'causal_lm') with the LLRD mixin installed and the run's plan."""
    conf = trainer_config(kind, cfg, precision, has_eval=eval_ds is not None, loss=loss)
    common = dict(
        args=conf, train_dataset=train, eval_dataset=eval_ds, processing_class=tokenizer, callbacks=list(callbacks)
    )
    if kind == "sft":
        from trl import SFTTrainer

        cls = type("LLRDSFTTrainer", (EngineMixin, DivergenceGuardMixin, LLRDMixin, SFTTrainer), {"llrd_plan": plan})
        trainer = cls(model=model, **common)
    elif kind == "dpo":
        from trl import DPOTrainer

        cls = type("LLRDDPOTrainer", (EngineMixin, DivergenceGuardMixin, LLRDMixin, DPOTrainer), {"llrd_plan": plan})
        trainer = cls(model=model, ref_model=ref_model, **common)
    else:
        from transformers import Trainer, default_data_collator

        cls = type("LLRDTrainer", (EngineMixin, DivergenceGuardMixin, LLRDMixin, Trainer), {"llrd_plan": plan})
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
    if cfg.max_steps > 0:
        return cfg.max_steps
    return max(1, math.ceil(math.ceil(n_train / (cfg.batch_size * world_size)) / cfg.grad_accum * cfg.epochs))
