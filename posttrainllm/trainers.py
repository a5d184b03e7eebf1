"""The trainers: TRL's SFTTrainer / DPOTrainer and transformers' Trainer, plus one mixin that puts the
layer-wise LR groups in through `create_optimizer` (the hook FSDP and DeepSpeed respect, unlike `optimizers=`).
"""

from __future__ import annotations

import inspect
import math
import os
from typing import Any

from posttrainllm.errors import DataError, ModelError, UsageError


class LLRDMixin:
    """Mixed in before a transformers/TRL trainer class; `llrd_plan` is the run's one plan (llrd.LLRDPlan).

    The optimizer gets the plan's groups (re-mapped by name onto the trainer's model when it wraps it), with the
    optimizer class and kwargs from the user's `--optim` via `get_optimizer_cls_and_kwargs`, so fused/foreach
    AdamW, Adafactor, 8-bit AdamW... all get our groups. Optimizers that build their own groups (GaLore, LOMO,
    Muon...) are refused when the plan scales any depth, and get transformers' own setup when it does not.
    """

    llrd_plan = None

    def create_optimizer(self, model=None):
        plan = self.llrd_plan
        if self.optimizer is not None or plan is None:
            return super().create_optimizer(model)
        opt_model = self.model if model is None else model
        optimizer_cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        if not inspect.isclass(optimizer_cls) or {"params", "model", "optimizer_dict"} & set(kwargs):
            if plan.lr_scaled:
                raise UsageError(
                    f"--optim {self.args.optim} builds its own parameter groups, so it cannot apply layer-wise LR "
                    "decay; use an AdamW variant (e.g. adamw_torch) or drop --llrd"
                )
            return super().create_optimizer(model)
        try:
            groups = plan.groups_for(opt_model)
        except ValueError as e:
            raise ModelError(f"the trainer's model differs from the planned one: {e}") from None
        groups = _split_by_device_mesh(groups)
        _check_same_groups_on_every_rank(groups)
        self.optimizer = optimizer_cls(groups, **kwargs)
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
        # HF logs group 0's LR, which is the embeddings' under layer decay. Log the base (head) LR as
        # `learning_rate`, plus the smallest and largest group LR at the same point of the schedule (every group
        # follows the same schedule, so the current LRs keep the initial ratios).
        if self.optimizer is not None and "learning_rate" in logs:
            initial = [g.get("initial_lr", g["lr"]) for g in self.optimizer.param_groups]
            if initial and initial[0] > 0:
                now = logs["learning_rate"] / initial[0]  # the schedule factor at this step
                base = self.llrd_plan.base_lr if self.llrd_plan is not None else max(initial)
                logs["learning_rate"] = base * now
                logs["lr_min"] = min(initial) * now
                logs["lr_max"] = max(initial) * now
        super().log(logs, *args, **kwargs)


def _split_by_device_mesh(groups: list[dict]) -> list[dict]:
    """Parameters on different device meshes (FSDP2 on a 2-D mesh, expert parallelism) cannot share one
    fused/foreach kernel call: give each mesh its own group, as transformers does for its own groups."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return groups
    out = []
    for g in groups:
        meshes: dict = {}
        for p in g["params"]:
            meshes.setdefault(p.device_mesh if isinstance(p, DTensor) else None, []).append(p)
        out.extend({**g, "params": params} for params in meshes.values())
    return out


def _check_same_groups_on_every_rank(groups: list[dict]) -> None:
    """Under DDP/FSDP every rank must build identical groups (names, LRs, parameter shapes), or ranks diverge."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    import hashlib

    desc = [(g["name"], g["lr"], g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in groups]
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


def make_config(config_cls, **kwargs: Any):
    """`config_cls(**kwargs)` where every keyword must be a field of the installed class: an unknown one (a renamed
    or removed transformers/TRL argument) is an error naming it and the closest fields, never dropped silently."""
    import difflib

    fields = set(getattr(config_cls, "__dataclass_fields__", {}))
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        hints = "; ".join(f"{k} (closest: {', '.join(difflib.get_close_matches(k, fields, 3)) or 'none'})" for k in unknown)
        raise UsageError(f"{config_cls.__name__} of the installed version has no argument {hints}")
    return config_cls(**kwargs)


def trainer_config(kind: str, cfg, precision: str, *, has_eval: bool):
    """The SFTConfig / DPOConfig / TrainingArguments of a run; every argument must exist in the installed version."""
    args = common_args(cfg, precision, has_eval=has_eval)
    if kind == "sft":
        from trl import SFTConfig

        return make_config(SFTConfig, **args, max_length=cfg.max_length, packing=False, dataset_num_proc=None)
    if kind == "dpo":
        from trl import DPOConfig

        return make_config(DPOConfig, **args, beta=cfg.beta, max_length=cfg.max_length)
    if kind == "causal_lm":
        from transformers import TrainingArguments

        return make_config(TrainingArguments, **args)
    raise ValueError(kind)  # pragma: no cover - programming error


def build_trainer(kind: str, cfg, *, model, tokenizer, train, eval_ds, precision: str, plan, ref_model=None, callbacks=()):
    """Build the trainer for `kind` ('sft' | 'dpo' | 'causal_lm') with the LLRD mixin installed and the run's plan."""
    conf = trainer_config(kind, cfg, precision, has_eval=eval_ds is not None)
    common = dict(args=conf, train_dataset=train, eval_dataset=eval_ds, processing_class=tokenizer, callbacks=list(callbacks))
    if kind == "sft":
        from trl import SFTTrainer

        cls = type("LLRDSFTTrainer", (LLRDMixin, SFTTrainer), {"llrd_plan": plan})
        trainer = cls(model=model, **common)
    elif kind == "dpo":
        from trl import DPOTrainer

        cls = type("LLRDDPOTrainer", (LLRDMixin, DPOTrainer), {"llrd_plan": plan})
        trainer = cls(model=model, ref_model=ref_model, **common)
    else:
        from transformers import Trainer, default_data_collator

        cls = type("LLRDTrainer", (LLRDMixin, Trainer), {"llrd_plan": plan})
        trainer = cls(model=model, data_collator=default_data_collator, **common)
    check_distributed_engine(trainer, llrd_active=plan.lr_scaled)
    if len(trainer.train_dataset) == 0:
        raise DataError(f"no training example is left after tokenization: every example was longer than --max-length {cfg.max_length} before its completion started (or was empty); raise --max-length")
    return trainer


def total_steps(cfg, n_train: int, world_size: int = 1) -> int:
    if cfg.max_steps > 0:
        return cfg.max_steps
    return max(1, math.ceil(math.ceil(n_train / (cfg.batch_size * world_size)) / cfg.grad_accum * cfg.epochs))
