"""`posttrainllm pretrain`: from scratch: a byte-level BPE tokenizer trained on the corpus, a preset model,
causal-LM training (the lifecycle of posttrainllm/lifecycle.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from posttrainllm.spec import CommandSpec

if TYPE_CHECKING:
    from posttrainllm.context import Context, Setup

SPEC = CommandSpec(
    name="pretrain",
    setup="posttrainllm.commands.pretrain:setup",
    help="Pre-train a small model from scratch (preset config + a byte-level BPE tokenizer trained on the corpus).",
    trainer="transformers:Trainer",
    trainer_config="transformers:TrainingArguments",
    collator="transformers:default_data_collator",
    data="text",
    from_scratch=True,
    lr=5e-4,
    max_length=256,
)


def setup(ctx: Context) -> Setup:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrainllm import data, models
    from posttrainllm.context import Setup
    from posttrainllm.data.pipeline import data_options
    from posttrainllm.lifecycle import device_name
    from posttrainllm.planning import bottom_scale_note, plan_param_groups
    from posttrainllm.reporting import banner
    from posttrainllm.training import steps_row

    cfg, precision, resume_from = ctx.cfg, ctx.precision, ctx.resume_from
    models.check_model_config(cfg.model_config)
    corpus = data.load_texts(cfg.dataset, streaming=cfg.streaming)  # checked to be plain text before any training
    tok_dir = Path(cfg.output_dir) / "tokenizer"
    if resume_from and tok_dir.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    else:  # trained from batches of text, never from one string holding the corpus
        tokenizer = models.train_bpe_tokenizer(data.iter_texts(corpus), cfg.vocab_size)
    prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, **data_options(cfg))
    config = models.scratch_config(cfg.model_config, len(tokenizer), cfg.max_length, tokenizer)
    model = AutoModelForCausalLM.from_config(config)
    plan = plan_param_groups(cfg, model)
    info = {
        "model": f"from scratch: {cfg.model_config} ({config.model_type}, "
        f"{plan.num_layers} blocks, "
        f"{banner.fmt_count(sum(p.numel() for p in model.parameters()))} params)",
        "tokenizer": f"byte-level BPE, {len(tokenizer)} tokens, trained on the corpus",
        "data": data.describe(prepared),
        "steps": steps_row(cfg, prepared.n_train, f"block length {cfg.max_length}"),
        "base LR": f"{cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_ratio:g}, optim "
        f"{cfg.optim}, weight decay {cfg.weight_decay:g})",
        "precision": f"{precision} on {device_name()} ({models.precision_reason(cfg.precision, precision)})",
        "recipe": cfg.recipe,
        "output": cfg.output_dir + (f" (resuming from {resume_from.name})" if resume_from else ""),
    }

    def save_tokenizer(run_dir) -> None:  # rank 0, once the plan is shown: the run's tokenizer beside its model
        run_dir.own(["tokenizer"])
        tokenizer.save_pretrained(str(tok_dir))

    notes = bottom_scale_note(cfg, plan) + models.precision_notes(precision)
    resolved = {"n_train": prepared.n_train, "n_eval": prepared.n_eval}
    return Setup(
        cfg=cfg, model=model, tokenizer=tokenizer, prepared=prepared, plan=plan, info=info, notes=notes,
        resolved=resolved, after_plan=save_tokenizer,
    )  # fmt: skip
