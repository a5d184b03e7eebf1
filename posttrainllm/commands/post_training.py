"""The setup sft, dpo, kto, grpo, rloo and finetune share: start from a model (a directory, a hub id or a GGUF
file), fit the tokenizer, prepare the data of the command's shape, load the model (and the DPO / KTO reference; the
GRPO / RLOO rewards), LoRA, plan."""

from __future__ import annotations

import copy

from posttrainllm import banner
from posttrainllm.config.checks import ONLINE_RL  # the commands that sample completions and score them with rewards
from posttrainllm.errors import UsageError
from posttrainllm.lifecycle import Context, Setup, device_name
from posttrainllm.planning import (
    bottom_scale_gamma,
    bottom_scale_note,
    check_something_trains,
    clamp_max_length,
    plan_param_groups,
)

PREFERENCE = ("dpo", "kto")  # the commands with a reference model we load


def setup(ctx: Context) -> Setup:
    from posttrainllm import models, weights
    from posttrainllm.data import check_reward_columns, label_note, pipeline

    cfg = ctx.cfg
    rewards = _rewards(cfg)  # the user's reward code is imported first: a bad --reward-fn stops before any model
    model_path, source, ref_path, ref_source = _resolve_models(cfg)
    if cfg.command == "distill":
        _check_same_vocabulary(cfg, model_path, ref_path)
    names = weights.check_config(model_path, allow_new_weights=cfg.allow_new_weights)  # before anything heavy
    check_something_trains(cfg, names)
    model_args = models.check_model_args(model_path, cfg.model_args, cfg.trust_remote_code)
    notes: list[str] = models.precision_notes(ctx.precision)
    if source and (low := gguf_note(source)):
        notes.append(low)
    tokenizer = models.load_tokenizer(
        model_path, cfg.trust_remote_code, need_eos=cfg.command != "finetune", notes=notes
    )
    cfg, clamped = clamp_max_length(cfg, models.max_positions(model_path, cfg.trust_remote_code))
    notes += clamped
    if cfg.llrd_bottom_scale and (n_cfg := models.num_layers(model_path, cfg.trust_remote_code)):
        bottom_scale_gamma(cfg, n_cfg)  # a bottom scale out of range stops here, before the model loads
    prepared = pipeline.prepare(cfg, tokenizer)
    if cfg.command in ONLINE_RL:
        check_reward_columns(prepared, cfg.reward_match)
    model = models.load_model(
        model_path, trust_remote_code=cfg.trust_remote_code, precision=ctx.precision, model_args=model_args,
        fine_tune=True, allow_new_weights=cfg.allow_new_weights, notes=notes, reward_head=cfg.command == "reward",
    )  # fmt: skip
    models.fit_embeddings_to_tokenizer(model, tokenizer)
    ref_model = _reference_model(cfg, model, ref_path, ctx.precision, model_args)
    teacher = _teacher(cfg, ref_path, ctx.precision)
    kl_base = _kl_base(cfg, model)
    if cfg.lora_r:
        model = _apply_lora(model, cfg)
    plan = plan_param_groups(cfg, model)
    notes += bottom_scale_note(cfg, plan) + [n for n in (prepared.template_note, label_note(prepared)) if n]
    if cfg.trust_remote_code:
        notes.append("--trust-remote-code is on: the model repository's own code runs")
    resolved = {
        "data_format": prepared.format,
        "n_train": prepared.n_train,
        "n_eval": prepared.n_eval,
        "model_args": {k: str(v) for k, v in model_args.items()},
    }
    if source:
        resolved["model_source"] = {**source, "converted_to": model_path}
    if ref_path and ref_source:
        resolved["teacher_source" if teacher is not None else "ref_model_source"] = {
            **ref_source,
            "converted_to": ref_path,
        }
    info = _info(cfg, model, plan, prepared, source, ctx, kl_base)
    return Setup(
        cfg, model, tokenizer, prepared, plan, info, notes, resolved, ref_model, model_path, reward_funcs=rewards,
        teacher=teacher, kl_base=kl_base,
    )  # fmt: skip


def _rewards(cfg):
    if cfg.command not in ONLINE_RL:
        return None
    from posttrainllm.rewards import build_rewards

    return build_rewards(cfg)


def _resolve_models(cfg):
    """--model (and dpo's or kto's --ref-model) as local directories: a GGUF file is converted once, cached."""
    from posttrainllm import models
    from posttrainllm.config import producing_recipe

    model_path, source = models.resolve_model(
        cfg.model, hint=lambda: producing_recipe(cfg.recipe, cfg.model), trust_remote_code=cfg.trust_remote_code
    )
    ref_path = ref_source = None
    other = cfg.ref_model if cfg.command in PREFERENCE else cfg.teacher if cfg.command == "distill" else None
    if other:  # dpo's / kto's --ref-model, distill's --teacher
        ref_path, ref_source = models.resolve_model(
            other,
            "--ref-model" if cfg.command in PREFERENCE else "--teacher",
            hint=lambda: producing_recipe(cfg.recipe, other),
            trust_remote_code=cfg.trust_remote_code,
        )
    return model_path, source, ref_path, ref_source


def _check_same_vocabulary(cfg, model_path: str, teacher_path: str) -> None:
    """distill compares the teacher's full next-token distribution with the student's: the same vocabulary size, or
    a UsageError before either model loads (read from the configs)."""
    from posttrainllm import models

    student, teacher = (models.vocab_size(p, cfg.trust_remote_code) for p in (model_path, teacher_path))
    if student and teacher and student != teacher:
        raise UsageError(
            f"--teacher {cfg.teacher} has a vocabulary of {teacher} tokens, --model {cfg.model} of {student}: "
            "distillation compares their next-token distributions token by token, so pick a teacher of the same "
            "tokenizer family"
        )


def _teacher(cfg, teacher_path, precision):
    """distill's teacher: loaded like the model, frozen, in eval mode (never in the optimizer)."""
    from posttrainllm import models

    if cfg.command != "distill":
        return None
    teacher = models.load_model(teacher_path, trust_remote_code=cfg.trust_remote_code, precision=precision,
                                what="--teacher")  # fmt: skip
    return teacher.requires_grad_(False).eval()


def _kl_base(cfg, model):
    """--kl-to-base without LoRA: a frozen copy of the starting model, in eval mode (never in the optimizer). None at
    β = 0 (nothing is built) and under LoRA (the base is then the model with its adapters disabled)."""
    if not cfg.kl_to_base or cfg.lora_r:
        return None
    return copy.deepcopy(model).requires_grad_(False).eval()


def _reference_model(cfg, model, ref_path, precision, model_args):
    """dpo and kto without LoRA: --ref-model, or a frozen copy of the model (never in the optimizer; under FSDP it is
    sharded for its forward only). None otherwise (LoRA's reference is the adapter-disabled base)."""
    from posttrainllm import models

    if cfg.command not in PREFERENCE or cfg.lora_r:
        return None
    if cfg.ref_model:
        ref_model = models.load_model(
            ref_path, trust_remote_code=cfg.trust_remote_code, precision=precision, what="--ref-model",
            model_args=model_args,
        )  # fmt: skip
    else:
        ref_model = copy.deepcopy(model)
    ref_model.requires_grad_(False)
    return ref_model


def _apply_lora(model, cfg):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise UsageError("--lora-r needs PEFT: pip install 'posttrainllm[peft]'") from None
    targets = cfg.lora_targets.strip()
    target_modules = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    lcfg = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha or 2 * cfg.lora_r,
        lora_dropout=cfg.lora_dropout,
        target_modules=target_modules,
        task_type="SEQ_CLS" if cfg.command == "reward" else "CAUSAL_LM",  # SEQ_CLS also trains the score head
    )
    try:
        return get_peft_model(model, lcfg)
    except ValueError as e:
        raise UsageError(f"--lora-targets {targets}: {str(e).splitlines()[0]}") from None


def dpo_loss_text(cfg) -> str:
    """The banner's DPO loss: `sigmoid`, or a weighted sum `0.8×sigmoid + 0.2×sft` (weights 1 when not given)."""
    types = list(cfg.loss_type or ["sigmoid"])
    if len(types) == 1 and not cfg.loss_weights:
        return types[0]
    weights = cfg.loss_weights or [1.0] * len(types)
    return " + ".join(f"{w:g}×{t}" for w, t in zip(weights, types))


def _default_reference(cfg) -> str:
    return "adapter-disabled base" if cfg.lora_r else "frozen copy of --model"


def _model_name(ref: str, source: dict | None) -> str:
    """The banner's name of the model: the reference as given, or a GGUF file with its quantization."""
    from posttrainllm import gguf

    return gguf.describe(source) if source else ref


def gguf_note(source: dict) -> str | None:
    from posttrainllm import gguf

    return gguf.low_bit_note(source)


def _packing_row(cfg) -> str | None:
    if cfg.command != "sft" or not cfg.packing:
        return None
    row = "best-fit decreasing into rows of --max-length, padding-free (each example attends only to itself)"
    return row + ("; the steps above count examples, packed rows are fewer" if cfg.max_steps <= 0 else "")


def _steps(cfg, prepared) -> str:
    from posttrainllm.training import steps_row

    if cfg.command == "distill":
        return steps_row(
            cfg, prepared.n_train, f"one sampled completion per prompt, at most {cfg.max_completion_length} tokens"
        )
    if cfg.command not in ONLINE_RL:
        return steps_row(cfg, prepared.n_train, f"max length {cfg.max_length}")
    # a row of the batch is one completion: each prompt is sampled --num-generations times
    row = steps_row(cfg, prepared.n_train * cfg.num_generations, "one row = one completion")
    return row.replace(" rows per step", " completions per step")


def _online_row(cfg) -> str:
    """The banner's GRPO / RLOO row: the sampling, the rewards, the reference."""
    from posttrainllm.rewards import describe

    reference = "none (β = 0)" if cfg.beta == 0 else f"β={cfg.beta:g}, {_default_reference(cfg)} (out of the optimizer)"
    return (
        f"{cfg.num_generations} completions per prompt, temperature {cfg.temperature:g}, at most "
        f"{cfg.max_completion_length} tokens; rewards: {describe(cfg)}; reference: {reference}"
    )


def _info(cfg, model, plan, prepared, source, ctx: Context, kl_base=None) -> dict:
    """The banner's rows: what trains on what."""
    from posttrainllm import models
    from posttrainllm.data import describe
    from posttrainllm.training.kl_to_base import banner_row

    n_total = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "model": f"{_model_name(cfg.model, source)} ({type(model).__name__}, {plan.num_layers} blocks, "
        f"{banner.fmt_count(n_total)} params, {banner.fmt_count(n_train)} trainable)",
        "data": describe(prepared),
        "loss on": prepared.loss.description if prepared.loss is not None else None,
        "steps": _steps(cfg, prepared),
        "base LR": f"{cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_ratio:g}, optim "
        f"{cfg.optim}, weight decay {cfg.weight_decay:g})",
        "LoRA": f"r={cfg.lora_r}, alpha={cfg.lora_alpha or 2 * cfg.lora_r}, targets={cfg.lora_targets}"
        if cfg.lora_r
        else None,
        "DPO": f"β={cfg.beta}, loss {dpo_loss_text(cfg)}, reference={cfg.ref_model or _default_reference(cfg)}"
        if cfg.command == "dpo"
        else None,
        "KTO": f"β={cfg.beta}, reference={cfg.ref_model or _default_reference(cfg)}" if cfg.command == "kto" else None,
        **({cfg.command.upper(): _online_row(cfg)} if cfg.command in ONLINE_RL else {}),  # GRPO / RLOO
        "distill": f"teacher {cfg.teacher} (frozen, out of the optimizer); the student samples, then matches the "
        f"teacher's next-token distribution: β={cfg.beta:g} (0 forward KL, 0.5 JSD, 1 reverse KL), temperature "
        f"{cfg.temperature:g}"
        if cfg.command == "distill"
        else None,
        "reward model": "one score per sequence from a new head on the last token (TRL's pairwise loss: chosen above "
        "rejected); the head trains at the base LR, as an LM head would"
        if cfg.command == "reward"
        else None,
        "packing": _packing_row(cfg),
        "replay": f"{cfg.replay_ratio:.0%} of rows from {cfg.replay_dataset}" if cfg.replay_dataset else None,
        "KL to base": banner_row(cfg, kl_base),
        "precision": f"{ctx.precision} on {device_name()} ({models.precision_reason(cfg.precision, ctx.precision)})",
        "recipe": cfg.recipe,
        "output": cfg.output_dir + (f" (resuming from {ctx.resume_from.name})" if ctx.resume_from else ""),
    }
