"""The setup every post-training command shares (sft, dpo, kto, reward, grpo, rloo, distill, finetune): start from a
model (a directory, a hub id or a GGUF file), fit the tokenizer, prepare the data of the command's shape, load the
model (and the reference or teacher; the rewards), LoRA, plan. What differs is read off the command's spec
(`ctx.spec`, posttrainllm/spec.py)."""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any

from posttrainllm.context import Context, Setup
from posttrainllm.errors import UsageError
from posttrainllm.planning import (
    bottom_scale_gamma,
    bottom_scale_note,
    check_something_trains,
    clamp_max_length,
    plan_param_groups,
)
from posttrainllm.reporting import banner
from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig


def setup(ctx: Context) -> Setup:
    from posttrainllm import models
    from posttrainllm.data import check_reward_columns, label_note, pipeline, self_replay
    from posttrainllm.models import weights

    cfg, spec = ctx.cfg, ctx.spec
    rewards = _rewards(cfg, spec)  # the user's reward code is imported first: a bad --reward-fn stops before any model
    model_path, source, ref_path, ref_source = _resolve_models(cfg, spec)
    vocab_notes = _check_same_vocabulary(cfg, model_path, ref_path) if spec.reference == "teacher" else []
    names = weights.check_config(model_path, allow_new_weights=cfg.allow_new_weights)  # before anything heavy
    check_something_trains(cfg, names)
    model_args = models.check_model_args(model_path, cfg.model_args, cfg.trust_remote_code)
    notes: list[str] = models.precision_notes(ctx.precision) + vocab_notes
    if source and (low := gguf_note(source)):
        notes.append(low)
    if vision := _vision(cfg, spec, model_path):  # a vision-language model: its processor, image-text data
        tokenizer = models.load_processor(model_path, cfg.trust_remote_code, need_eos=spec.needs_eos)
    else:
        tokenizer = models.load_tokenizer(model_path, cfg.trust_remote_code, need_eos=spec.needs_eos, notes=notes)
    positions = models.max_positions(model_path, cfg.trust_remote_code)
    cfg, clamped = clamp_max_length(cfg, positions)
    notes += clamped
    if cfg.llrd_bottom_scale and (n_cfg := models.num_layers(model_path, cfg.trust_remote_code)):
        bottom_scale_gamma(cfg, n_cfg)  # a bottom scale out of range stops here, before the model loads
    if vision:
        from posttrainllm.vision import data as vision_data

        prepared = vision_data.prepare(cfg, tokenizer, spec.data)
    else:
        starting = _starting_model(cfg, model_path, ctx.precision, model_args, tokenizer)
        prepared = pipeline.prepare(cfg, tokenizer, spec.data, *starting, reader=spec.prepare)
    if spec.rewards:
        check_reward_columns(prepared, cfg.reward_match)
    if spec.samples:
        cfg, fitted = _fit_completions(cfg, prepared, tokenizer, _sampling_positions(cfg, positions, ref_path))
        notes += fitted
    model = models.load_model(
        model_path, trust_remote_code=cfg.trust_remote_code, precision=ctx.precision, model_args=model_args,
        fine_tune=True, allow_new_weights=cfg.allow_new_weights, notes=notes, reward_head=spec.reward_head,
    )  # fmt: skip
    models.fit_embeddings_to_tokenizer(model, tokenizer)
    trainer_models = _trainer_models(cfg, spec, model, ref_path, ctx.precision, model_args, rewards)
    if cfg.lora_r:
        model = _apply_lora(model, cfg, spec)
    plan = plan_param_groups(cfg, model)
    notes += bottom_scale_note(cfg, plan) + [n for n in (prepared.template_note, label_note(prepared)) if n]
    notes += shape_notes(model, cfg)
    if cfg.trust_remote_code:
        notes.append("--trust-remote-code is on: the model repository's own code runs")
    resolved = {
        "data_format": prepared.format,
        "n_train": prepared.n_train,
        "n_eval": prepared.n_eval,
        "model_args": {k: str(v) for k, v in model_args.items()},
    }
    if prepared.self_replay is not None:
        resolved[self_replay.RECORD] = prepared.self_replay.record()
    if source:
        resolved["model_source"] = {**source, "converted_to": model_path}
    if ref_path and ref_source:
        resolved[f"{spec.reference}_source"] = {
            **ref_source,
            "converted_to": ref_path,
        }
    info = _info(cfg, spec, model, plan, prepared, source, ctx, trainer_models.get("kl_base"))
    return Setup(
        cfg=cfg, model=model, tokenizer=tokenizer, prepared=prepared, plan=plan, info=info, notes=notes,
        resolved=resolved, model_path=model_path, trainer_models=trainer_models,
        after_plan=prepared.self_replay.write if prepared.self_replay is not None else None,
    )  # fmt: skip


def _vision(cfg: RunConfig, spec: CommandSpec, model_path: str) -> bool:
    """Whether --model is a vision-language model (from its config), with what such a run cannot take refused at
    once (exit 2); image-text data given to a text-only model is refused too."""
    from posttrainllm.errors import ConfigErrors
    from posttrainllm.vision import data as vision_data
    from posttrainllm.vision import detect

    if not detect.is_vlm(model_path, cfg.trust_remote_code):
        what = detect.describe_config(model_path, cfg.trust_remote_code)
        streaming = bool(getattr(cfg, "streaming", False))
        for flag, source in (("--dataset", cfg.dataset), ("--eval-dataset", cfg.eval_dataset)):
            if source:
                vision_data.check_text_model(source, cfg.model, what, streaming=streaming, flag=flag)
                streaming = False  # an eval dataset is read whole
        return False
    if not spec.vision:
        raise UsageError(f"--model {cfg.model} is a vision-language model; {cfg.command} does not train one yet: "
                         "sft and dpo do (docs/vlm.md)")  # fmt: skip
    problems = vision_data.unsupported(cfg)
    if problems:
        raise ConfigErrors(problems)
    return True


def _starting_model(cfg: RunConfig, model_path: str, precision: str, model_args: dict, tokenizer):
    """--self-replay's loader of the model training starts from (loaded for sampling, on the GPU when there is
    one, and released before the model to train loads; its embeddings grown to the tokenizer's tokens as the model
    to train's are, e.g. for the EOS sft adds) and that model's identity; (None, None) without it."""
    if not cfg.self_replay:
        return None, None
    from posttrainllm import models
    from posttrainllm.rundir.fingerprint import input_identity

    def load():
        import torch

        model = models.load_model(model_path, trust_remote_code=cfg.trust_remote_code, precision=precision,
                                  model_args=model_args)  # fmt: skip
        with torch.random.fork_rng(devices=[]):  # new rows' init draws nothing from the run's random state
            models.fit_embeddings_to_tokenizer(model, tokenizer)
        return model.to("cuda") if torch.cuda.is_available() else model

    return load, input_identity(model_path) or {"ref": cfg.model}


def _fit_completions(cfg: RunConfig, prepared, tokenizer, positions):
    """The config with --max-completion-length clamped to what the longest prompt leaves of the positions (and the
    note saying so); prompts that leave nothing are a UsageError (data/prompts.py)."""
    from posttrainllm.data import fit_completion_length

    length, note = fit_completion_length(prepared, tokenizer, positions, cfg.max_completion_length)
    return (dataclasses.replace(cfg, max_completion_length=length), [note]) if note else (cfg, [])


def _sampling_positions(cfg: RunConfig, positions: int | None, ref_path: str | None) -> int | None:
    """The positions a sampled prompt and completion must fit: the model's, and distill's teacher's (it reads them
    too); None when no config says."""
    from posttrainllm import models

    teacher = models.max_positions(ref_path, cfg.trust_remote_code) if ref_path else None
    limits = [p for p in (positions, teacher) if p]
    return min(limits) if limits else None


def _rewards(cfg: RunConfig, spec: CommandSpec):
    if not spec.rewards:
        return None
    from posttrainllm.rewards import build_rewards

    return build_rewards(cfg)


def _trainer_models(cfg: RunConfig, spec: CommandSpec, model, ref_path, precision, model_args, rewards):
    """The trainer's own models and rewards, by the trainer's keywords: never in the optimizer."""
    out: dict[str, Any] = {}
    if spec.reference == "ref_model":
        out["ref_model"] = _reference_model(cfg, model, ref_path, precision, model_args)
    elif spec.reference == "teacher":
        out["teacher_model"] = _teacher(cfg, ref_path, precision)
    if spec.rewards:
        out["reward_funcs"] = list(rewards or [])
    if (kl_base := _kl_base(cfg, model)) is not None:
        out["kl_base"] = kl_base  # the trainer's KL anchor pops it (training/kl_to_base.py)
    return out


def _kl_base(cfg: RunConfig, model):
    """--kl-to-base without LoRA: a frozen copy of the starting model, in eval mode (never in the optimizer). None at
    β = 0 (nothing is built) and under LoRA (the base is then the model with its adapters disabled)."""
    import copy

    if not cfg.kl_to_base or cfg.lora_r:
        return None
    return copy.deepcopy(model).requires_grad_(False).eval()


def _resolve_models(cfg: RunConfig, spec: CommandSpec):
    """--model (and the --ref-model or --teacher) as local directories: a GGUF file is converted once, cached."""
    from posttrainllm import models
    from posttrainllm.config.recipe import producing_recipe

    model_path, source = models.resolve_model(
        cfg.model, hint=lambda: producing_recipe(cfg.recipe, cfg.model), trust_remote_code=cfg.trust_remote_code
    )
    ref_path = ref_source = None
    other = getattr(cfg, spec.reference) if spec.reference else None
    if other:  # dpo's / kto's --ref-model, distill's --teacher
        ref_path, ref_source = models.resolve_model(
            other,
            "--" + spec.reference.replace("_", "-"),
            hint=lambda: producing_recipe(cfg.recipe, other),
            trust_remote_code=cfg.trust_remote_code,
        )
    return model_path, source, ref_path, ref_source


def _check_same_vocabulary(cfg: RunConfig, model_path: str, teacher_path: str) -> list[str]:
    """distill compares the teacher's full next-token distribution with the student's, id by id: the same vocabulary
    size (read from the configs) and the same vocabulary (the same tokens under the same ids, and one sample text
    tokenized alike: posttrainllm/models/vocab.py, as `eval --reference` requires), or a UsageError before either model
    loads. A teacher without a tokenizer of its own is compared by size only; the note returned says so."""
    from posttrainllm import models
    from posttrainllm.errors import ModelError
    from posttrainllm.models.vocab import vocabulary_difference

    student, teacher = (models.vocab_size(p, cfg.trust_remote_code) for p in (model_path, teacher_path))
    fix = "distillation compares the next-token distributions id by id, so pick a teacher of the same tokenizer family"
    if student and teacher and student != teacher:
        raise UsageError(
            f"--teacher {cfg.teacher} has a vocabulary of {teacher} tokens, --model {cfg.model} of {student}: {fix}"
        )
    student_tokenizer = models.load_tokenizer(model_path, cfg.trust_remote_code)
    try:
        teacher_tokenizer = models.load_tokenizer(teacher_path, cfg.trust_remote_code)
    except ModelError:
        return [f"--teacher {cfg.teacher} has no tokenizer of its own: only its vocabulary size was compared"]
    problem = vocabulary_difference(student_tokenizer, teacher_tokenizer, "--model", "--teacher")
    if problem:
        raise UsageError(
            f"--teacher {cfg.teacher} does not share the vocabulary of --model {cfg.model}: {problem}; {fix}"
        )
    return []


def _teacher(cfg: RunConfig, teacher_path, precision):
    """distill's teacher: loaded like the model, frozen, in eval mode (never in the optimizer)."""
    from posttrainllm import models

    teacher = models.load_model(teacher_path, trust_remote_code=cfg.trust_remote_code, precision=precision,
                                what="--teacher")  # fmt: skip
    return teacher.requires_grad_(False).eval()


def _reference_model(cfg: RunConfig, model, ref_path, precision, model_args):
    """dpo and kto without LoRA: --ref-model, or a frozen copy of the model (never in the optimizer; under FSDP it is
    sharded for its forward only). None with LoRA (its reference is the adapter-disabled base)."""
    from posttrainllm import models

    if cfg.lora_r:
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


def _apply_lora(model, cfg: RunConfig, spec: CommandSpec):
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
        task_type="SEQ_CLS" if spec.reward_head else "CAUSAL_LM",  # SEQ_CLS also trains the score head
    )
    try:
        return get_peft_model(model, lcfg)
    except ValueError as e:
        raise UsageError(f"--lora-targets {targets}: {str(e).splitlines()[0]}") from None


def _model_name(ref: str, source: dict | None) -> str:
    """The banner's name of the model: the reference as given, or a GGUF file with its quantization."""
    from posttrainllm.models import gguf

    return gguf.describe(source) if source else ref


BIG_VOCABULARY = 100_000  # from here the logits are the largest tensor of a step: the banner says what they take


def shape_notes(model, cfg: RunConfig) -> list[str]:
    """What the model's shape means for the run, from its config: a big vocabulary (what a step's logits take at
    the run's batch and length, and that the KL anchor and evaluation hold them a chunk at a time), and
    sliding-window attention (in how many blocks, and the window against --max-length)."""
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    notes = []
    vocab = getattr(text, "vocab_size", 0) or 0
    length = cfg.max_length or 0
    if vocab >= BIG_VOCABULARY and length:
        gib = vocab * length * cfg.batch_size * 4 / 2**30
        notes.append(
            f"vocabulary of {vocab:,} tokens: a step's logits take {gib:.2f} GiB in float32 at batch "
            f"{cfg.batch_size} × {length} (and as much for their gradient); the KL anchor and held-out evaluation "
            "hold them a chunk of positions at a time"
        )
    window, kinds = getattr(text, "sliding_window", None), list(getattr(text, "layer_types", None) or [])
    sliding = sum(1 for k in kinds if "sliding" in str(k))
    if window and sliding:
        beyond = f"; --max-length {length} is past it, so those blocks see the last {window} tokens only" if (
            length > window) else ""  # fmt: skip
        notes.append(
            f"sliding-window attention (window {window}) in {sliding} of {len(kinds)} blocks, full attention in the "
            f"rest{beyond}"
        )
    return notes


def gguf_note(source: dict) -> str | None:
    from posttrainllm.models import gguf

    return gguf.low_bit_note(source)


def _info(cfg: RunConfig, spec: CommandSpec, model, plan, prepared, source, ctx: Context, kl_base=None) -> dict:
    """The banner's rows: what trains on what (the command's own rows from its spec)."""
    from posttrainllm import models
    from posttrainllm.data import describe, pipeline
    from posttrainllm.lifecycle import device_name
    from posttrainllm.training.kl_to_base import banner_row

    n_total = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "model": f"{_model_name(cfg.model, source)} ({type(model).__name__}, {plan.num_layers} blocks, "
        f"{banner.fmt_count(n_total)} params, {banner.fmt_count(n_train)} trainable)",
        "data": describe(prepared),
        "loss on": prepared.loss.description if prepared.loss is not None else None,
        "steps": spec.steps(cfg, prepared.n_train) if spec.steps is not None else None,
        "base LR": f"{cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_ratio:g}, optim "
        f"{cfg.optim}, weight decay {cfg.weight_decay:g})",
        "LoRA": f"r={cfg.lora_r}, alpha={cfg.lora_alpha or 2 * cfg.lora_r}, targets={cfg.lora_targets}"
        if cfg.lora_r
        else None,
        **(spec.rows(cfg) if spec.rows is not None else {}),  # e.g. DPO, GRPO, distill, packing
        "replay": pipeline.replay_row(cfg, prepared),
        "KL to base": banner_row(cfg, kl_base),
        "precision": f"{ctx.precision} on {device_name()} ({models.precision_reason(cfg.precision, ctx.precision)})",
        "recipe": cfg.recipe,
        "output": cfg.output_dir + (f" (resuming from {ctx.resume_from.name})" if ctx.resume_from else ""),
    }
