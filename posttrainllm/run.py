"""What a command does once its config is valid: build → plan → banner → hand off to the trainer → save.

This is the only module of the CLI path that imports torch/transformers/TRL (through its callees).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from posttrainllm import banner, checkpoints
from posttrainllm.checkpoints import is_rank0, write_json
from posttrainllm.errors import UsageError

TRAINER_KIND = {"sft": "sft", "dpo": "dpo", "finetune": "causal_lm", "pretrain": "causal_lm"}


def llrd_settings(cfg) -> dict:
    """Keyword arguments for llrd.build_param_groups from the run config (pretrain's key is lr_layer_decay)."""
    return dict(
        gamma=cfg.gamma,
        weight_decay=cfg.weight_decay,
        tied_policy=cfg.tied_embeddings,
        min_scale=cfg.llrd_min_scale,
        freeze_below=cfg.llrd_freeze_below,
        block_path=cfg.llrd_blocks,
    )


def _prepare_output(cfg) -> Path | None:
    """Output-dir safety before anything heavy; returns the checkpoint to resume from (or None)."""
    checkpoints.check_output_dir(cfg.output_dir, overwrite=cfg.overwrite, resume=cfg.resume, dry_run=cfg.dry_run)
    resume_from = None
    if cfg.resume:
        resume_from, skipped = checkpoints.resume_checkpoint(cfg.output_dir)
        checkpoints.check_resume_config(cfg.output_dir, cfg.to_dict(), cfg.allow_config_change)
        if skipped and is_rank0():
            banner.console.print(f"[yellow]note:[/] skipped incomplete checkpoint(s): {', '.join(d.name for d in skipped)}")
    elif cfg.overwrite and is_rank0() and not cfg.dry_run:
        checkpoints.clear_output_dir(cfg.output_dir)
    return resume_from


def _show_plan(cfg, info: dict, plan, notes: list[str], extra: dict) -> bool:
    """Banner + param_groups.json + run_config.json (rank 0). Returns True for a dry run (nothing to train)."""
    if not is_rank0():
        return cfg.dry_run
    banner.print_banner(cfg.command + (" (dry run)" if cfg.dry_run else ""), info, plan, notes)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "param_groups.json", plan.to_json())
    if not cfg.resume:
        write_json(out / checkpoints.RUN_CONFIG, {**cfg.to_dict(), **extra})
    if cfg.dry_run:
        banner.console.print(f"dry run: nothing trained; parameter groups written to {out / 'param_groups.json'}")
    return cfg.dry_run


def _apply_lora(model, cfg):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise UsageError("--lora-r needs PEFT: pip install 'posttrainllm[peft]'") from None
    targets = cfg.lora_targets.strip()
    target_modules = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_r, lora_dropout=cfg.lora_dropout, target_modules=target_modules, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, lcfg)
    except ValueError as e:
        raise UsageError(f"--lora-targets {targets}: {str(e).splitlines()[0]}") from None


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"


def _ood_eval(model, tokenizer, cfg) -> dict:
    from posttrainllm.evaluate import evaluate_files

    return evaluate_files(model, tokenizer, list(cfg.ood_eval), cfg.max_length, progress=is_rank0())


def _stream_rows(cfg) -> int | None:
    """Rows (or blocks) one streamed run reads: what --eval-split's fraction is taken of, from the head."""
    import os

    if not cfg.streaming or cfg.max_steps <= 0:
        return None
    return cfg.max_steps * cfg.batch_size * cfg.grad_accum * int(os.environ.get("WORLD_SIZE", "1"))


def _prepare_data(cfg, tokenizer):
    from posttrainllm import data

    common = dict(eval_split=cfg.eval_split, eval_source=cfg.eval_dataset, seed=cfg.seed, max_samples=cfg.max_samples,
                  num_proc=cfg.dataset_num_proc, streaming=cfg.streaming, stream_rows=_stream_rows(cfg))
    if cfg.command == "sft":
        prepared = data.prepare_sft(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    elif cfg.command == "dpo":
        prepared = data.prepare_dpo(cfg.dataset, tokenizer, **common)
    else:
        prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    if cfg.values.get("replay_dataset"):
        if cfg.command == "sft":  # replay rows take the SFT rows' shape, with the loss on the replayed text
            replay = data.load_texts(cfg.replay_dataset, streaming=cfg.streaming)
        else:  # finetune: replay token blocks of the same length beside the training blocks
            replay = data.prepare_text(cfg.replay_dataset, tokenizer, max_length=cfg.max_length, seed=cfg.seed,
                                       num_proc=cfg.dataset_num_proc, streaming=cfg.streaming).train
        prepared.train = data.mix_replay(prepared.train, replay, cfg.replay_ratio, cfg.seed)
        if not cfg.streaming:
            prepared.n_train = len(prepared.train)
    if cfg.command == "sft":  # after replay: replay rows are masked like the others (their text is all trained)
        prepared.loss = data.apply_loss_mask(prepared, tokenizer, train_on_prompt=cfg.train_on_prompt,
                                             num_proc=cfg.dataset_num_proc)
    return prepared


def _clamp_max_length(cfg, limit: int | None) -> list[str]:
    """--max-length above the model's positions would crash models with learned position embeddings: clamp it."""
    if limit is None or cfg.max_length <= limit:
        return []
    note = f"--max-length {cfg.max_length} is more than the model's {limit} positions: using {limit}"
    cfg.values["max_length"] = limit
    return [note]


def train(cfg) -> None:
    """sft / dpo / finetune."""
    resume_from = _prepare_output(cfg)

    from transformers import set_seed

    from posttrainllm import models
    from posttrainllm.data import describe
    from posttrainllm.llrd import build_param_groups
    from posttrainllm.trainers import check_optim_name, total_steps

    set_seed(cfg.seed)
    check_optim_name(cfg.optim)
    precision = models.pick_precision(cfg.precision)
    models.check_model_ref(cfg.model)
    if cfg.command == "dpo" and cfg.ref_model:
        models.check_model_ref(cfg.ref_model, "--ref-model")
    tokenizer = models.load_tokenizer(cfg.model, cfg.trust_remote_code)
    notes = _clamp_max_length(cfg, models.max_positions(cfg.model, cfg.trust_remote_code))
    prepared = _prepare_data(cfg, tokenizer)
    model = models.load_model(cfg.model, trust_remote_code=cfg.trust_remote_code, precision=precision)
    models.fit_embeddings_to_tokenizer(model, tokenizer)
    ref_model = None
    if cfg.command == "dpo" and not cfg.lora_r:
        ref_model = models.load_model(cfg.ref_model, trust_remote_code=cfg.trust_remote_code, precision=precision, what="--ref-model") if cfg.ref_model else copy.deepcopy(model)
    if cfg.lora_r:
        model = _apply_lora(model, cfg)

    plan = build_param_groups(model, cfg.lr, **llrd_settings(cfg))
    notes += [n for n in (prepared.template_note,) if n]
    if cfg.trust_remote_code:
        notes.append("--trust-remote-code is on: the model repository's own code runs")
    n_total = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info = {
        "model": f"{cfg.model} ({type(model).__name__}, {plan.num_layers} blocks, {banner.fmt_count(n_total)} params, {banner.fmt_count(n_train)} trainable)",
        "data": describe(prepared),
        "loss on": prepared.loss.description if prepared.loss is not None else None,
        "steps": f"{total_steps(cfg, prepared.n_train)} (batch {cfg.batch_size} × accum {cfg.grad_accum}, max length {cfg.max_length})",
        "base LR": f"{cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_ratio:g}, optim {cfg.optim}, weight decay {cfg.weight_decay:g})",
        "LoRA": f"r={cfg.lora_r}, alpha={cfg.lora_alpha or 2 * cfg.lora_r}, targets={cfg.lora_targets}" if cfg.lora_r else None,
        "DPO": f"β={cfg.beta}, reference={cfg.ref_model or ('adapter-disabled base' if cfg.lora_r else 'frozen copy of --model')}" if cfg.command == "dpo" else None,
        "replay": f"{cfg.replay_ratio:.0%} of rows from {cfg.replay_dataset}" if cfg.values.get("replay_dataset") else None,
        "precision": f"{precision} on {_device_name()}",
        "output": cfg.output_dir + (f" (resuming from {resume_from.name})" if resume_from else ""),
    }
    if _show_plan(cfg, info, plan, notes, {"data_format": prepared.format, "n_train": prepared.n_train, "n_eval": prepared.n_eval}):
        return

    before = _ood_eval(model, tokenizer, cfg) if cfg.ood_eval else None
    _run_trainer(cfg, TRAINER_KIND[cfg.command], model, tokenizer, prepared, precision, resume_from, ref_model=ref_model, before=before)


def _run_trainer(cfg, kind, model, tokenizer, prepared, precision, resume_from, *, ref_model=None, before=None) -> None:
    from posttrainllm.trainers import build_trainer

    guard = checkpoints.InterruptGuard()
    callbacks = [checkpoints.make_callback(guard)]
    trainer = build_trainer(kind, cfg, model=model, tokenizer=tokenizer, train=prepared.train, eval_ds=prepared.eval, precision=precision, llrd_settings=llrd_settings(cfg), ref_model=ref_model, callbacks=callbacks)
    t0 = time.time()
    with guard:
        result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if guard.signum is not None:
        if trainer.is_world_process_zero():
            resume_cmd = " ".join(a for a in sys.argv if a not in ("--overwrite",))
            if "--resume" not in sys.argv:
                resume_cmd += " --resume"
            banner.console.print(f"[yellow]interrupted[/] at step {trainer.state.global_step}: checkpoint saved in {cfg.output_dir}. Resume with:\n  {resume_cmd}")
        raise SystemExit(guard.exit_code)

    metrics = dict(result.metrics)
    if prepared.eval is not None:
        metrics.update(trainer.evaluate())
    checkpoints.save_final(trainer, tokenizer, cfg.output_dir)
    if trainer.is_world_process_zero():
        out = Path(cfg.output_dir)
        trainer.state.save_to_json(str(out / "trainer_state.json"))
        results = {"train": metrics, "wall_time_s": round(time.time() - t0, 2)}
        if before is not None:
            from posttrainllm.evaluate import forgetting_report

            after = _ood_eval(trainer.model, tokenizer, cfg)
            report = forgetting_report(before, after)
            results["ood"] = report
            banner.print_forgetting(report)
        write_json(out / "eval_results.json", results)
        write_json(out / checkpoints.FINAL_MARKER, {"global_step": trainer.state.global_step, "train_loss": metrics.get("train_loss"), "eval_loss": metrics.get("eval_loss")})
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items() if k in ("train_loss", "eval_loss", "train_runtime", "train_samples_per_second")}
        banner.console.print(f"done: {shown}; model saved to {cfg.output_dir}")


def pretrain(cfg) -> None:
    """From scratch: train a byte-level BPE tokenizer on the corpus, build a preset model, causal-LM training."""
    resume_from = _prepare_output(cfg)

    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from posttrainllm import data, models
    from posttrainllm.llrd import build_param_groups
    from posttrainllm.trainers import check_optim_name, total_steps

    set_seed(cfg.seed)
    check_optim_name(cfg.optim)
    precision = models.pick_precision(cfg.precision)
    models.check_model_config(cfg.model_config)
    corpus = data.load_texts(cfg.dataset, streaming=cfg.streaming)  # checked to be plain text before any training
    tok_dir = Path(cfg.output_dir) / "tokenizer"
    if resume_from and tok_dir.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    else:  # trained from batches of text, never from one string holding the corpus
        tokenizer = models.train_bpe_tokenizer(data.iter_texts(corpus), cfg.vocab_size)
    prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, eval_split=cfg.eval_split, eval_source=cfg.eval_dataset, seed=cfg.seed, max_samples=cfg.max_samples,
                                 num_proc=cfg.dataset_num_proc, streaming=cfg.streaming, stream_rows=_stream_rows(cfg))
    config = models.scratch_config(cfg.model_config, len(tokenizer), cfg.max_length, tokenizer)
    model = AutoModelForCausalLM.from_config(config)
    plan = build_param_groups(model, cfg.lr, **llrd_settings(cfg))
    info = {
        "model": f"from scratch: {cfg.model_config} ({config.model_type}, {plan.num_layers} blocks, {banner.fmt_count(sum(p.numel() for p in model.parameters()))} params)",
        "tokenizer": f"byte-level BPE, {len(tokenizer)} tokens, trained on the corpus",
        "data": data.describe(prepared),
        "steps": f"{total_steps(cfg, prepared.n_train)} (batch {cfg.batch_size} × accum {cfg.grad_accum}, block length {cfg.max_length})",
        "base LR": f"{cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_ratio:g}, optim {cfg.optim}, weight decay {cfg.weight_decay:g})",
        "precision": f"{precision} on {_device_name()}",
        "output": cfg.output_dir + (f" (resuming from {resume_from.name})" if resume_from else ""),
    }
    if _show_plan(cfg, info, plan, [], {"n_train": prepared.n_train, "n_eval": prepared.n_eval}):
        return
    if is_rank0():
        tokenizer.save_pretrained(str(tok_dir))
    _run_trainer(cfg, "causal_lm", model, tokenizer, prepared, precision, resume_from)


def evaluate(cfg) -> None:
    """posttrainllm eval: perplexity per text file, optional SFT completion loss; --json prints only JSON."""
    from posttrainllm import evaluate as ev

    model, tokenizer = ev.load_for_eval(cfg.model, trust_remote_code=cfg.trust_remote_code)
    from posttrainllm.models import max_positions

    for note in _clamp_max_length(cfg, max_positions(cfg.model, cfg.trust_remote_code)):
        print(f"note: {note}", file=sys.stderr)
    sft_examples = None
    if cfg.sft_dataset:
        from posttrainllm import data

        sft_examples = data.load(cfg.sft_dataset)  # memory-mapped; scored in chunks
    results = ev.evaluate_files(model, tokenizer, list(cfg.text), cfg.max_length, sft_examples=sft_examples, progress=not cfg.json)
    if cfg.json:
        print(json.dumps(results))
        return
    from rich.table import Table

    t = Table(title=f"eval: {cfg.model} (windows of {cfg.max_length} tokens)", title_justify="left")
    for col in ("input", "perplexity", "tokens"):
        t.add_column(col, justify="left" if col == "input" else "right")
    for name, r in results.items():
        if "perplexity" in r:
            t.add_row(name, f"{r['perplexity']:.4f}", str(r["tokens"]))
        else:
            t.add_row(name + " (completion loss)", f"{r['loss']:.4f}", str(r.get("completion_tokens", "")))
    banner.console.print(t)
