"""The trainer configuration: posttrainllm's settings as TrainingArguments / SFTConfig / DPOConfig, then the
user's --trainer-arg values, each checked against the installed class."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from posttrainllm.config.coerce import check_keyed
from posttrainllm.errors import UsageError
from posttrainllm.spec import load
from posttrainllm.training.progress import interactive

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.spec import CommandSpec


def check_optim_name(name: str) -> None:
    from transformers.training_args import OptimizerNames

    valid = [o.value for o in OptimizerNames]
    if name not in valid:
        raise UsageError(f"--optim {name} is not a transformers optimizer; use one of: {', '.join(valid[:12])}, ...")


def common_args(cfg: RunConfig, precision: str, *, has_eval: bool) -> dict[str, Any]:
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
        logging_nan_inf_filter=False,  # a NaN/inf loss must reach the divergence check, not be averaged away
        eval_strategy=("steps" if eval_steps else "no") if has_eval else "no",
        eval_steps=eval_steps,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        activation_checkpointing=cfg.gradient_checkpointing,
        report_to=cfg.report_to,
        ddp_timeout=cfg.ddp_timeout,
        disable_tqdm=not interactive(),
        use_cpu=not _cuda_available(),  # bf16 on CPU: autocast (accelerate's CPU mixed precision)
        ddp_backend="gloo" if not _cuda_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        ddp_find_unused_parameters=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=_cuda_available(),
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
        hints = "; ".join(
            f"{k} (closest: {', '.join(difflib.get_close_matches(k, fields, 3)) or 'none'})" for k in unknown
        )
        raise UsageError(f"{config_cls.__name__} of the installed version has no argument {hints}")
    return config_cls(**kwargs)


# Trainer fields that a first-class option sets: --trainer-arg may not set them (the option is the one place).
FIRST_CLASS = {
    "learning_rate": "--lr",
    "weight_decay": "--weight-decay",
    "optim": "--optim",
    "lr_scheduler_type": "--lr-scheduler",
    "warmup_steps": "--warmup-ratio",
    "warmup_ratio": "--warmup-ratio",
    "max_steps": "--max-steps",
    "num_train_epochs": "--epochs",
    "per_device_train_batch_size": "--batch-size",
    "per_device_eval_batch_size": "--batch-size",
    "gradient_accumulation_steps": "--grad-accum",
    "seed": "--seed",
    "data_seed": "--seed",
    "save_steps": "--save-steps",
    "save_total_limit": "--save-total-limit",
    "logging_steps": "--logging-steps",
    "eval_steps": "--eval-steps",
    "bf16": "--precision",
    "fp16": "--precision",
    "activation_checkpointing": "--gradient-checkpointing",
    "gradient_checkpointing": "--gradient-checkpointing",
    "output_dir": "--output-dir",
    "max_length": "--max-length",
    "beta": "--beta",
    "report_to": "--report-to",
    "ddp_timeout": "--ddp-timeout",
    "dataset_num_proc": "--dataset-num-proc",
    "resume_from_checkpoint": "--resume",
    "overwrite_output_dir": "--overwrite",
    "assistant_only_loss": "--train-on-prompt",
}  # ... and the fields a command's own options set: its spec's `owned_fields`


def config_class(spec: CommandSpec):
    """The command's trainer config class (its spec names it: SFTConfig, DPOConfig, TrainingArguments, ...)."""
    return load(spec.trainer_config)


def check_trainer_args(spec: CommandSpec, raw: dict[str, Any]) -> dict[str, Any]:
    """--trainer-arg KEY=VALUE / recipe trainer_args, checked against the installed config class: unknown keys (with
    the closest names), keys a first-class option owns, and values of the wrong type are UsageErrors (exit 2);
    values are coerced to the field's type ("true" → True, "8" → 8, JSON for lists/dicts)."""
    cls = config_class(spec)
    out = check_keyed(
        "--trainer-arg", raw, _field_types(cls), owned={**FIRST_CLASS, **spec.owned_fields},
        unknown=f"not a field of {cls.__name__}",
    )  # fmt: skip
    if out.get("chat_template_path"):  # TRL reads that template itself: bounded like the model's own
        from posttrainllm.models.template_guard import check_template_source

        check_template_source(str(out["chat_template_path"]), "--trainer-arg chat_template_path")
    return out


def _field_types(cls) -> dict[str, Any]:
    import dataclasses
    import typing

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: treat those fields as Any
        hints = {}
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def trainer_config(
    spec: CommandSpec,
    cfg: RunConfig,
    precision: str,
    *,
    has_eval: bool,
    extra: dict[str, Any] | None = None,
    loss=None,
):
    """The SFTConfig / DPOConfig / TrainingArguments of a run: posttrainllm's settings, the command's own fields (its
    spec's `trainer_fields`), the user's --trainer-arg values (`extra`: already checked; checked here when None),
    then, for SFT data, what the loss falls on (`loss`: the data's LossMask, data.apply_loss_mask); every argument
    must exist in the installed version. A run builds it once, from the config its setup settled
    (posttrainllm/lifecycle.py): nothing is patched into it afterwards."""
    args = common_args(cfg, precision, has_eval=has_eval)
    if spec.trainer_fields is not None:
        args.update(spec.trainer_fields(cfg))
    if extra is None:
        extra = check_trainer_args(spec, cfg.trainer_args or {})
    settled = {}
    if loss is not None:
        settled["assistant_only_loss"] = loss.assistant_only_loss
        if loss.completion_only_loss is not None:
            settled["completion_only_loss"] = loss.completion_only_loss
    try:
        return make_config(config_class(spec), **{**args, **extra, **settled})
    except (ValueError, TypeError) as e:
        if not extra:
            raise
        raise UsageError(f"--trainer-arg {', '.join(extra)}: {str(e).splitlines()[0][:300]}") from None
