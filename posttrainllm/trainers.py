"""The trainers: TRL's SFTTrainer / DPOTrainer and transformers' Trainer, plus one mixin that puts the
layer-wise LR groups in through `create_optimizer` (the hook FSDP and DeepSpeed respect, unlike `optimizers=`).
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Any

from posttrainllm.errors import DataError, ModelError, UsageError
from posttrainllm.llrd import build_param_groups


class LLRDMixin:
    """Mixed in before a transformers/TRL trainer class.

    `llrd_settings` holds the keyword arguments of `build_param_groups` except the base LR (taken from
    `args.learning_rate`). The optimizer class and its kwargs come from the user's `--optim` via
    `get_optimizer_cls_and_kwargs`, so fused/foreach AdamW, Adafactor, 8-bit AdamW... all get our groups;
    optimizers that build their own groups (GaLore, LOMO, Muon...) are refused when γ < 1.
    """

    llrd_settings: dict[str, Any] | None = None
    llrd_plan = None

    def create_optimizer(self, model=None):
        if self.optimizer is not None or not _llrd_active(self.llrd_settings):
            # γ = 1 without clamp/freeze: transformers' own two-group AdamW, exactly a flat run
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        plan = build_param_groups(opt_model, self.args.learning_rate, **self.llrd_settings)
        optimizer_cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        if not inspect.isclass(optimizer_cls) or {"params", "model", "optimizer_dict"} & set(kwargs):
            raise UsageError(f"--optim {self.args.optim} builds its own parameter groups, so it cannot apply layer-wise LR decay; use an AdamW variant (e.g. adamw_torch) or drop --llrd")
        _check_same_groups_on_every_rank(plan)
        self.optimizer = optimizer_cls(plan.groups, **kwargs)
        self.llrd_plan = plan
        return self.optimizer

    def _load_optimizer_and_scheduler(self, checkpoint):
        # Loading an optimizer state dict restores the *saved* group LRs. Resuming is refused when the LR settings
        # changed unless --allow-config-change, and then the new per-group LRs are put back here, at the resumed
        # point of the schedule.
        super()._load_optimizer_and_scheduler(checkpoint)
        plan = self.llrd_plan
        if checkpoint is None or plan is None or self.lr_scheduler is None:
            return
        groups = self.optimizer.param_groups
        if len(groups) != len(plan.groups):
            return
        new = [g["lr"] for g in plan.groups]
        if all(g.get("initial_lr") == lr for g, lr in zip(groups, new)):
            return
        sched = self.lr_scheduler
        for i, (g, lr) in enumerate(zip(groups, new)):
            g["initial_lr"] = lr
            factor = sched.lr_lambdas[i](sched.last_epoch) if hasattr(sched, "lr_lambdas") else 1.0
            g["lr"] = lr * factor
        if hasattr(sched, "base_lrs"):
            sched.base_lrs = list(new)
            sched._last_lr = [g["lr"] for g in groups]

    def log(self, logs: dict[str, float], *args, **kwargs) -> None:
        # HF logs only group 0's LR (the embeddings when LLRD is on): add the smallest and largest group LR at the
        # same point of the schedule (every group follows the same schedule, so scale by the initial ratios).
        if self.optimizer is not None and "learning_rate" in logs:
            initial = [g.get("initial_lr", g["lr"]) for g in self.optimizer.param_groups]
            if initial and initial[0] > 0:
                logs["lr_min"] = logs["learning_rate"] * min(initial) / initial[0]
                logs["lr_max"] = logs["learning_rate"] * max(initial) / initial[0]
        super().log(logs, *args, **kwargs)


def _llrd_active(settings: dict[str, Any] | None) -> bool:
    return bool(settings) and (settings.get("gamma", 1.0) < 1.0 or settings.get("min_scale", 0) > 0 or settings.get("freeze_below", 0) > 0)


def _check_same_groups_on_every_rank(plan) -> None:
    """Under DDP/FSDP every rank must build identical groups (names, LRs, parameter shapes), or ranks diverge."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    import hashlib

    desc = [(g["name"], g["lr"], g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in plan.groups]
    mine = hashlib.sha256(repr(desc).encode()).hexdigest()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if len(set(every)) != 1:
        raise ModelError(f"ranks built different LLRD parameter groups ({len(set(every))} distinct layouts); every rank must load the same model and options")


def check_distributed_engine(trainer, llrd_active: bool) -> None:
    """FSDP needs per-parameter groups (use_orig_params / FSDP2); a DeepSpeed config with its own "optimizer"
    would silently replace our groups, so both are refused when layer decay is on."""
    if not llrd_active:
        return
    if getattr(trainer, "is_deepspeed_enabled", False):
        plugin = trainer.accelerator.state.deepspeed_plugin
        ds_config = getattr(plugin, "deepspeed_config", None) or {}
        if "optimizer" in ds_config:
            raise UsageError("the DeepSpeed config defines its own \"optimizer\", which replaces the layer-wise LR groups; remove the \"optimizer\" section (posttrainllm builds AdamW with per-block groups) or drop --llrd")
    if getattr(trainer, "is_fsdp_enabled", False):
        plugin = trainer.accelerator.state.fsdp_plugin
        if getattr(plugin, "fsdp_version", 1) == 1 and not getattr(plugin, "use_orig_params", False):
            raise UsageError("FSDP with use_orig_params=false flattens parameters across blocks, so per-block LRs cannot apply; set fsdp_use_orig_params: true in the accelerate config (or use FSDP2)")


def check_optim_name(name: str) -> None:
    from transformers.training_args import OptimizerNames

    valid = [o.value for o in OptimizerNames]
    if name not in valid:
        raise UsageError(f"--optim {name} is not a transformers optimizer; use one of: {', '.join(valid[:12])}, ...")


def common_args(cfg, precision: str, *, has_eval: bool) -> dict[str, Any]:
    """TrainingArguments fields shared by every command (TRL configs extend TrainingArguments)."""
    eval_steps = cfg.eval_steps
    return dict(
        output_dir=cfg.output_dir,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        optim=cfg.optim,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_ratio,
        max_steps=cfg.max_steps,
        num_train_epochs=cfg.epochs,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum,
        seed=cfg.seed,
        data_seed=cfg.seed,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        save_safetensors=True,
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        eval_strategy=("steps" if eval_steps else "no") if has_eval else "no",
        eval_steps=eval_steps,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        activation_checkpointing=cfg.gradient_checkpointing,
        report_to=[],
        disable_tqdm=False,
        use_cpu=precision == "fp32" and not _cuda_available(),
        ddp_backend="gloo" if not _cuda_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        ddp_find_unused_parameters=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=precision != "fp32",
    )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _filter_kwargs(config_cls, kwargs: dict[str, Any]) -> dict[str, Any]:
    fields = set(getattr(config_cls, "__dataclass_fields__", {}))
    return {k: v for k, v in kwargs.items() if k in fields}


def build_trainer(kind: str, cfg, *, model, tokenizer, train, eval_ds, precision: str, llrd_settings: dict[str, Any], ref_model=None, callbacks=()):
    """Build the trainer for `kind` ('sft' | 'dpo' | 'causal_lm') with the LLRD mixin installed."""
    has_eval = eval_ds is not None
    args = common_args(cfg, precision, has_eval=has_eval)
    if kind == "sft":
        from trl import SFTConfig, SFTTrainer

        conf = SFTConfig(**_filter_kwargs(SFTConfig, args), max_length=cfg.max_length, packing=False, dataset_num_proc=_num_proc(cfg))
        cls = type("LLRDSFTTrainer", (LLRDMixin, SFTTrainer), {"llrd_settings": llrd_settings})
        trainer = cls(model=model, args=conf, train_dataset=train, eval_dataset=eval_ds, processing_class=tokenizer, callbacks=list(callbacks))
    elif kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        conf = DPOConfig(**_filter_kwargs(DPOConfig, args), beta=cfg.beta, max_length=cfg.max_length, dataset_num_proc=_num_proc(cfg))
        cls = type("LLRDDPOTrainer", (LLRDMixin, DPOTrainer), {"llrd_settings": llrd_settings})
        trainer = cls(model=model, ref_model=ref_model, args=conf, train_dataset=train, eval_dataset=eval_ds, processing_class=tokenizer, callbacks=list(callbacks))
    elif kind == "causal_lm":
        from transformers import Trainer, TrainingArguments, default_data_collator

        conf = TrainingArguments(**_filter_kwargs(TrainingArguments, args))
        cls = type("LLRDTrainer", (LLRDMixin, Trainer), {"llrd_settings": llrd_settings})
        trainer = cls(model=model, args=conf, train_dataset=train, eval_dataset=eval_ds, processing_class=tokenizer, data_collator=default_data_collator, callbacks=list(callbacks))
    else:  # pragma: no cover - programming error
        raise ValueError(kind)
    check_distributed_engine(trainer, llrd_active=_llrd_active(llrd_settings))
    if hasattr(trainer.train_dataset, "__len__") and len(trainer.train_dataset) == 0:  # a stream has no length
        raise DataError(f"no training example is left after tokenization: every example was longer than --max-length {cfg.max_length} before its completion started (or was empty); raise --max-length")
    return trainer


def _num_proc(cfg) -> int | None:
    """--dataset-num-proc for TRL's tokenization map (None: in this process)."""
    n = cfg.values.get("dataset_num_proc") or 1
    return n if n > 1 else None


def total_steps(cfg, n_train: int | None, world_size: int = 1) -> int:
    if cfg.max_steps > 0:
        return cfg.max_steps
    return max(1, math.ceil(math.ceil(n_train / (cfg.batch_size * world_size)) / cfg.grad_accum * cfg.epochs))
