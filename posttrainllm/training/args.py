"""The trainer configuration: posttrainllm's settings as TrainingArguments / SFTConfig / DPOConfig, then the
user's --trainer-arg values, each checked against the installed class."""

from __future__ import annotations

import os
from typing import Any

from posttrainllm.config.checks import ONLINE_RL
from posttrainllm.config.coerce import convert
from posttrainllm.errors import UsageError
from posttrainllm.training.progress import interactive


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
}
_ONLINE_OWNED = {
    "num_generations": "--num-generations",
    "max_completion_length": "--max-completion-length",
    "temperature": "--temperature",
    "reward_weights": "--reward-weights",
    "trust_remote_code": "--trust-remote-code",
}
# ... and the fields a first-class option sets for one kind only (SFTConfig's own loss_type stays a --trainer-arg).
FIRST_CLASS_OF_KIND = {
    "dpo": {"loss_type": "--loss-type", "loss_weights": "--loss-weights"},
    "sft": {"packing": "--packing", "padding_free": "--packing"},
    **dict.fromkeys(ONLINE_RL, _ONLINE_OWNED),
    "distill": {**_ONLINE_OWNED, "teacher_model_name_or_path": "--teacher"},
}


# Each TRL kind's trainer and config class (names in the installed `trl`); causal_lm is transformers' Trainer.
TRL_KINDS = {
    "sft": ("SFTTrainer", "SFTConfig"),
    "dpo": ("DPOTrainer", "DPOConfig"),
    "kto": ("KTOTrainer", "KTOConfig"),
    "reward": ("RewardTrainer", "RewardConfig"),
    "grpo": ("GRPOTrainer", "GRPOConfig"),
    "rloo": ("RLOOTrainer", "RLOOConfig"),
    "distill": ("DistillationTrainer", "DistillationConfig"),
}


def _config_class(kind: str):
    if kind == "causal_lm":
        from transformers import TrainingArguments

        return TrainingArguments
    import trl

    return getattr(trl, TRL_KINDS[kind][1])


def check_trainer_args(kind: str, raw: dict[str, Any]) -> dict[str, Any]:
    """--trainer-arg KEY=VALUE / recipe trainer_args, checked against the installed config class: unknown keys (with
    the closest names), keys a first-class option owns, and values of the wrong type are UsageErrors (exit 2);
    values are coerced to the field's type ("true" → True, "8" → 8, JSON for lists/dicts)."""
    import difflib

    from posttrainllm.errors import ConfigErrors

    cls = _config_class(kind)
    hints = _field_types(cls)
    owned = {**FIRST_CLASS, **FIRST_CLASS_OF_KIND.get(kind, {})}
    problems, out = [], {}
    for key, value in raw.items():
        if key in owned:
            problems.append(f"--trainer-arg {key}: set it with {owned[key]} (the option posttrainllm owns)")
        elif key not in hints:
            close = difflib.get_close_matches(key, list(hints), 3)
            problems.append(
                f"--trainer-arg {key}: not a field of {cls.__name__}"
                + (f"; did you mean {', '.join(close)}?" if close else "")
            )
        else:
            try:
                out[key] = convert(value, hints[key])
            except ValueError:
                problems.append(f"--trainer-arg {key}={_clip(value)}: expected {_type_name(hints[key])}")
    if problems:
        raise ConfigErrors(problems)
    if out.get("chat_template_path"):  # TRL reads that template itself: bounded like the model's own
        from posttrainllm.template_guard import check_template_source

        check_template_source(str(out["chat_template_path"]), "--trainer-arg chat_template_path")
    return out


def _clip(value: Any, n: int = 60) -> str:
    text = str(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _field_types(cls) -> dict[str, Any]:
    import dataclasses
    import typing

    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: treat those fields as Any
        hints = {}
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def trainer_config(kind: str, cfg, precision: str, *, has_eval: bool, loss=None):
    """The SFTConfig / DPOConfig / TrainingArguments of a run: posttrainllm's settings, then the user's
    --trainer-arg values; every argument must exist in the installed version. `loss`: the SFT data's LossMask
    (what the loss falls on, data.apply_loss_mask)."""
    args = common_args(cfg, precision, has_eval=has_eval)
    if kind == "sft":
        args.update(max_length=cfg.max_length, packing=cfg.packing, dataset_num_proc=_num_proc(cfg))
        if cfg.packing:  # best-fit decreasing, padding-free: per-example position ids keep the examples apart
            args.update(packing_strategy="bfd", padding_free=True)
        if loss is not None:
            args["assistant_only_loss"] = loss.assistant_only_loss
            if loss.completion_only_loss is not None:
                args["completion_only_loss"] = loss.completion_only_loss
    elif kind == "dpo":
        args.update(beta=cfg.beta, max_length=cfg.max_length, dataset_num_proc=_num_proc(cfg))
        args.update(loss_type=list(cfg.loss_type or ["sigmoid"]), loss_weights=cfg.loss_weights)
    elif kind == "kto":
        args.update(beta=cfg.beta, max_length=cfg.max_length, dataset_num_proc=_num_proc(cfg))
    elif kind == "distill":
        args.update(
            beta=cfg.beta, max_completion_length=cfg.max_completion_length, temperature=cfg.temperature,
            trust_remote_code=bool(cfg.trust_remote_code),
        )  # fmt: skip
    elif kind == "reward":
        args.update(max_length=cfg.max_length, dataset_num_proc=_num_proc(cfg))
    elif kind in ONLINE_RL:
        args.update(
            beta=cfg.beta, num_generations=cfg.num_generations, max_completion_length=cfg.max_completion_length,
            temperature=cfg.temperature, reward_weights=cfg.reward_weights,
            trust_remote_code=bool(cfg.trust_remote_code),
        )  # fmt: skip
    extra = check_trainer_args(kind, cfg.trainer_args or {})
    try:
        return make_config(_config_class(kind), **{**args, **extra})
    except (ValueError, TypeError) as e:
        if not extra:
            raise
        raise UsageError(f"--trainer-arg {', '.join(extra)}: {str(e).splitlines()[0][:300]}") from None


def _num_proc(cfg) -> int | None:
    """--dataset-num-proc for TRL's tokenization map (None: in this process)."""
    n = cfg.dataset_num_proc or 1
    return n if n > 1 else None
