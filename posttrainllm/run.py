"""What a command does once its config is valid: build → plan → banner → hand off to the trainer → save.

This is the only module of the CLI path that imports torch/transformers/TRL (through its callees).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

from posttrainllm import banner
from posttrainllm.errors import ModelStructureError, TrainingError, UsageError
from posttrainllm.rundir import checkpoints, layout, outdir, signals
from posttrainllm.rundir.layout import is_rank0, write_json

TRAINER_KIND = {"sft": "sft", "dpo": "dpo", "finetune": "causal_lm", "pretrain": "causal_lm"}
# the library's argument (LLRDArgumentError.field) -> the option that sets it; any other: "layer-wise LR decay"
LLRD_FLAGS = {"block_path": "--llrd-blocks", "lr_groups": "--lr-group", "loraplus_ratio": "--loraplus-ratio"}


def plan_param_groups(cfg, model):
    """The run's one LLRD plan (llrd.build_param_groups), with freezing applied; library errors get the CLI's words.

    The plan printed in the banner and saved as param_groups.json is the plan the trainer's optimizer receives."""
    from posttrainllm import llrd

    try:
        gamma = cfg.llrd
        if cfg.llrd_bottom_scale:
            gamma = bottom_scale_gamma(cfg, llrd.count_blocks(model, cfg.llrd_blocks))
        plan = llrd.build_param_groups(
            model,
            cfg.lr,
            gamma,
            cfg.weight_decay,
            tied_policy=cfg.tied_embeddings,
            min_scale=cfg.llrd_min_scale,
            freeze_below=cfg.llrd_freeze_below,
            block_path=cfg.llrd_blocks,
            lr_groups=cfg.lr_groups,
            loraplus_ratio=cfg.loraplus_ratio or 1.0,
        )
    except llrd.BlockStructureError as e:
        example = e.candidates[0][0] if e.candidates else "model.layers"
        raise ModelStructureError(
            f"LLRD: {e}. Fix: name the block list with --llrd-blocks PATH (recipe key `llrd_blocks`), "
            f"e.g. --llrd-blocks {example}; or use γ = 1 (no layer-wise decay)"
        ) from None
    except llrd.LLRDArgumentError as e:
        raise UsageError(f"{LLRD_FLAGS.get(e.field, 'layer-wise LR decay')}: {e}") from None
    llrd.apply_freeze(plan)
    return plan


def bottom_scale_gamma(cfg, num_blocks: int) -> float:
    """--llrd-bottom-scale S: the γ that gives block 0 (and the embeddings) the LR scale S on `num_blocks` blocks,
    γ = S^(1/(N-1)); a UsageError when that γ is outside the CLI's range."""
    from posttrainllm.config import LLRD_MAX, LLRD_MIN, LLRD_RANGE
    from posttrainllm.llrd import gamma_for_bottom_scale

    s = cfg.llrd_bottom_scale
    gamma = gamma_for_bottom_scale(s, num_blocks)
    if not LLRD_MIN <= gamma <= LLRD_MAX:
        raise UsageError(
            f"--llrd-bottom-scale {s:g} on a {num_blocks}-block model means γ = {gamma:.4g}, outside {LLRD_RANGE}: "
            f"use a bottom scale of at least {LLRD_MIN ** (num_blocks - 1):.3g} (0.5^{num_blocks - 1})"
        )
    return gamma


def bottom_scale_note(cfg, plan) -> list[str]:
    """The banner's line saying which γ --llrd-bottom-scale gave."""
    n, s = plan.num_layers, cfg.llrd_bottom_scale
    if not s or n < 2:
        return []
    return [f"--llrd-bottom-scale {s:g} on {n} blocks: γ = {s:g}^(1/{n - 1}) = {plan.gamma:.4f}"]


def _prepare_output(cfg):
    """Output-dir safety before anything heavy (posttrainllm/rundir/outdir.py): checks, the directory's lock (rank 0)
    and the checkpoint to resume from. Returns (run_dir, resume_from), or None when --resume finds the run complete."""
    run_dir = outdir.prepare(cfg)
    if run_dir is None:
        if is_rank0():
            done = layout.finished_run(Path(cfg.output_dir).expanduser()) or {}
            banner.console.print(
                f"already complete: {cfg.output_dir} holds the finished run (step "
                f"{done.get('global_step', '?')}); nothing to do"
            )
        return None
    resume_from = None
    if cfg.resume:
        try:
            resume_from, skipped = checkpoints.resume_checkpoint(cfg.output_dir)
        except BaseException:
            run_dir.release()
            raise
        if skipped and is_rank0():
            banner.note(f"skipped incomplete checkpoint(s): {checkpoints.describe_skipped(skipped)}")
    return run_dir, resume_from


def _show_plan(cfg, info: dict, plan, notes: list[str], extra: dict, run_dir) -> bool:
    """Banner + param_groups.json + run_config.json (rank 0). Returns True for a dry run (nothing to train).

    A real run first lets --overwrite move the previous contents aside (run_dir.start). A dry run writes its plan
    only into a directory that holds no run (it leaves a previous run exactly as it is)."""
    if not is_rank0():
        return cfg.dry_run
    if cfg.llrd_bottom_scale:
        extra = {**extra, "llrd_gamma_from_bottom_scale": plan.gamma}
    banner.print_banner(cfg.command + (" (dry run)" if cfg.dry_run else ""), info, plan, notes)
    out = Path(cfg.output_dir)
    if cfg.dry_run:
        if outdir.only_pre_training_records(out):
            write_json(out / "param_groups.json", plan.to_json())
            write_json(out / layout.RUN_CONFIG, {**cfg.to_dict(), **extra})
            banner.console.print(f"dry run: nothing trained; parameter groups written to {out / 'param_groups.json'}")
        else:
            banner.console.print(
                f"dry run: nothing trained; {out} holds a previous run, which a dry run "
                "leaves as it is (param_groups.json not written)"
            )
        return True
    run_dir.start()
    write_json(out / "param_groups.json", plan.to_json())
    checkpoints.write_run_config(out, {**cfg.to_dict(), **extra}, resume=cfg.resume)
    return False


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
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, lcfg)
    except ValueError as e:
        raise UsageError(f"--lora-targets {targets}: {str(e).splitlines()[0]}") from None


def _default_reference(cfg) -> str:
    return "adapter-disabled base" if cfg.lora_r else "frozen copy of --model"


def _device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"


def _ood_eval(model, tokenizer, cfg, reference=None) -> dict:
    from posttrainllm.evaluate import evaluate_files

    return evaluate_files(
        model, tokenizer, list(cfg.ood_eval), cfg.max_length, progress=is_rank0(), reference=reference
    )


def _kl_reference(cfg, model_path: str | None, precision: str):
    """The base model again, for the forgetting report's KL column: loaded from --model after training (no second
    copy is held while training), on the tuned model's device, in eval mode."""
    from posttrainllm import models

    if not model_path:
        return None
    import torch

    ref = models.load_model(model_path, trust_remote_code=cfg.trust_remote_code, precision=precision)
    if torch.cuda.is_available():
        ref = ref.to("cuda")
    return ref.eval()


def _stream_rows(cfg) -> int | None:
    """Rows (or blocks) one streamed run reads: what --eval-split's fraction is taken of, from the head."""
    import os

    if not cfg.streaming or cfg.max_steps <= 0:
        return None
    return cfg.max_steps * cfg.batch_size * cfg.grad_accum * int(os.environ.get("WORLD_SIZE", "1"))


def _data_options(cfg) -> dict:
    """The options every data preparation takes from the run's config."""
    return dict(
        eval_split=cfg.eval_split,
        eval_source=cfg.eval_dataset,
        seed=cfg.seed,
        max_samples=cfg.max_samples,
        num_proc=cfg.dataset_num_proc,
        streaming=cfg.streaming,
        stream_rows=_stream_rows(cfg),
    )


def _prepare_data(cfg, tokenizer):
    from posttrainllm import data

    common = _data_options(cfg)
    if cfg.command == "sft":
        prepared = data.prepare_sft(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    elif cfg.command == "dpo":
        prepared = data.prepare_dpo(cfg.dataset, tokenizer, **common)
    else:
        prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, **common)
    if cfg.replay_dataset:
        if cfg.command == "sft":  # replay rows take the SFT rows' shape, with the loss on the replayed text
            replay = data.load_texts(cfg.replay_dataset, streaming=cfg.streaming)
        else:  # finetune: replay token blocks of the same length beside the training blocks
            replay = data.prepare_text(
                cfg.replay_dataset,
                tokenizer,
                max_length=cfg.max_length,
                seed=cfg.seed,
                num_proc=cfg.dataset_num_proc,
                streaming=cfg.streaming,
            ).train
        prepared.train = data.mix_replay(prepared.train, replay, cfg.replay_ratio, cfg.seed)
        if not cfg.streaming:
            prepared.n_train = len(prepared.train)
    if cfg.command == "sft":  # after replay: replay rows are masked like the others (their text is all trained)
        prepared.loss = data.apply_loss_mask(
            prepared, tokenizer, train_on_prompt=cfg.train_on_prompt, num_proc=cfg.dataset_num_proc
        )
    return prepared


def _check_trainer_args(cfg, kind: str, precision: str) -> dict:
    """--trainer-arg values checked (and the whole trainer config built once) before any model is loaded."""
    from posttrainllm.trainers import check_trainer_args, trainer_config

    trainer_config(kind, cfg, precision, has_eval=bool(cfg.eval_split or cfg.eval_dataset))
    return check_trainer_args(kind, cfg.trainer_args or {})


def _clamp_max_length(cfg, limit: int | None):
    """--max-length above the model's positions would crash models with learned position embeddings: clamp it
    (with a note when the user asked for more; the default simply becomes the model's limit). Returns the
    (possibly new) config and the notes."""
    if limit is None or cfg.max_length <= limit:
        return cfg, []
    asked = cfg.sources.get("max_length") != "default"
    note = f"--max-length {cfg.max_length} is more than the model's {limit} positions: using {limit}"
    return dataclasses.replace(cfg, max_length=limit), ([note] if asked else [])


def train(cfg) -> None:
    """sft / dpo / finetune."""
    prepared_output = _prepare_output(cfg)
    if prepared_output is None:
        return
    run_dir, resume_from = prepared_output
    with run_dir:  # holds the output directory's lock; puts replaced contents back if the run fails early
        _across_ranks(cfg, lambda: _train(cfg, run_dir, resume_from))


def _across_ranks(cfg, fn) -> None:
    """fn() under torchrun/accelerate: the CPU process group with --ddp-timeout, and another rank's failure (a closed
    connection, a timeout) as one clear message (posttrainllm/distributed.py)."""
    from posttrainllm import distributed

    distributed.stop_with_launcher()
    distributed.init_process_group(cfg.ddp_timeout)
    try:
        fn()
    except RuntimeError as e:  # torch.distributed's errors (DistBackendError, DistStoreError, gloo's) are RuntimeErrors
        lost = distributed.lost_rank_error(e, cfg.ddp_timeout, cfg.output_dir)
        if lost is None:
            raise
        raise lost from e


def _train(cfg, run_dir, resume_from) -> None:
    from transformers import set_seed

    from posttrainllm import models
    from posttrainllm.config import producing_recipe
    from posttrainllm.trainers import quiet_progress_bars

    quiet_progress_bars()
    from posttrainllm.data import describe
    from posttrainllm.trainers import check_optim_name, total_steps

    set_seed(cfg.seed)
    check_optim_name(cfg.optim)
    precision = models.pick_precision(cfg.precision)
    trainer_args = _check_trainer_args(cfg, TRAINER_KIND[cfg.command], precision)
    model_path, source = models.resolve_model(
        cfg.model, hint=lambda: producing_recipe(cfg.recipe, cfg.model), trust_remote_code=cfg.trust_remote_code
    )
    model_args = models.check_model_args(model_path, cfg.model_args, cfg.trust_remote_code)
    ref_path = None
    if cfg.command == "dpo" and cfg.ref_model:
        ref_path, ref_source = models.resolve_model(
            cfg.ref_model,
            "--ref-model",
            hint=lambda: producing_recipe(cfg.recipe, cfg.ref_model),
            trust_remote_code=cfg.trust_remote_code,
        )
    notes: list[str] = models.precision_notes(precision)
    if source and (low := gguf_note(source)):
        notes.append(low)
    tokenizer = models.load_tokenizer(
        model_path, cfg.trust_remote_code, need_eos=cfg.command in ("sft", "dpo"), notes=notes
    )
    cfg, clamped = _clamp_max_length(cfg, models.max_positions(model_path, cfg.trust_remote_code))
    notes += clamped
    if cfg.llrd_bottom_scale and (n_cfg := models.num_layers(model_path, cfg.trust_remote_code)):
        bottom_scale_gamma(cfg, n_cfg)  # a bottom scale out of range stops here, before the model loads
    prepared = _prepare_data(cfg, tokenizer)
    model = models.load_model(
        model_path, trust_remote_code=cfg.trust_remote_code, precision=precision, model_args=model_args
    )
    models.fit_embeddings_to_tokenizer(model, tokenizer)
    ref_model = None
    if cfg.command == "dpo" and not cfg.lora_r:
        ref_model = (
            models.load_model(
                ref_path,
                trust_remote_code=cfg.trust_remote_code,
                precision=precision,
                what="--ref-model",
                model_args=model_args,
            )
            if cfg.ref_model
            else copy.deepcopy(model)
        )
        ref_model.requires_grad_(
            False
        )  # frozen: never in the optimizer (under FSDP it is sharded for its forward only)
    if cfg.lora_r:
        model = _apply_lora(model, cfg)

    plan = plan_param_groups(cfg, model)
    notes += bottom_scale_note(cfg, plan) + [n for n in (prepared.template_note,) if n]
    if cfg.trust_remote_code:
        notes.append("--trust-remote-code is on: the model repository's own code runs")
    n_total = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    info = {
        "model": f"{_model_name(cfg.model, source)} ({type(model).__name__}, {plan.num_layers} blocks, "
        f"{banner.fmt_count(n_total)} params, {banner.fmt_count(n_train)} trainable)",
        "data": describe(prepared),
        "loss on": prepared.loss.description if prepared.loss is not None else None,
        "steps": f"{total_steps(cfg, prepared.n_train)} (batch {cfg.batch_size} × accum "
        f"{cfg.grad_accum}, max length {cfg.max_length})",
        "base LR": f"{cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_ratio:g}, optim "
        f"{cfg.optim}, weight decay {cfg.weight_decay:g})",
        "LoRA": f"r={cfg.lora_r}, alpha={cfg.lora_alpha or 2 * cfg.lora_r}, targets={cfg.lora_targets}"
        if cfg.lora_r
        else None,
        "DPO": f"β={cfg.beta}, reference={cfg.ref_model or _default_reference(cfg)}" if cfg.command == "dpo" else None,
        "replay": f"{cfg.replay_ratio:.0%} of rows from {cfg.replay_dataset}" if cfg.replay_dataset else None,
        "precision": f"{precision} on {_device_name()} ({models.precision_reason(cfg.precision, precision)})",
        "recipe": cfg.recipe,
        "output": cfg.output_dir + (f" (resuming from {resume_from.name})" if resume_from else ""),
    }
    resolved = {
        "data_format": prepared.format,
        "n_train": prepared.n_train,
        "n_eval": prepared.n_eval,
        "trainer_args": trainer_args,
        "model_args": {k: str(v) for k, v in model_args.items()},
    }
    if source:
        resolved["model_source"] = {**source, "converted_to": model_path}
    if ref_path and ref_source:
        resolved["ref_model_source"] = {**ref_source, "converted_to": ref_path}
    if _show_plan(cfg, info, plan, notes, resolved, run_dir):
        return

    before = _ood_eval(model, tokenizer, cfg) if cfg.ood_eval else None
    _run_trainer(
        cfg,
        TRAINER_KIND[cfg.command],
        model,
        tokenizer,
        prepared,
        precision,
        resume_from,
        run_dir,
        plan,
        ref_model=ref_model,
        before=before,
        model_path=model_path,
    )


def _at_last_step(trainer, checkpoint: Path) -> int | None:
    """The checkpoint's step when it is already at the run's last step (a crash hit the final save), else None."""
    try:
        step = int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    *_, max_steps = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())
    return step if step >= max_steps else None


def _run_trainer(
    cfg,
    kind,
    model,
    tokenizer,
    prepared,
    precision,
    resume_from,
    run_dir,
    plan,
    *,
    ref_model=None,
    before=None,
    model_path: str | None = None,
) -> None:
    from posttrainllm.trainers import build_trainer

    guard = signals.InterruptGuard()
    callbacks = [signals.make_callback(guard)]
    trainer = build_trainer(
        kind,
        cfg,
        model=model,
        tokenizer=tokenizer,
        train=prepared.train,
        eval_ds=prepared.eval,
        precision=precision,
        plan=plan,
        ref_model=ref_model,
        callbacks=callbacks,
        loss=prepared.loss,
    )
    if cfg.report_to in ("tensorboard", "all"):
        run_dir.own(["runs"])  # TensorBoard's event files: OUT/runs/<date>_<host>/
    baseline = None
    if cfg.command != "pretrain":  # the weights before training, for the drift report (files on disk, no second model)
        from posttrainllm import drift

        baseline = drift.Baseline(trainer.model, model_path or cfg.model)
    t0 = time.time()
    last = _at_last_step(trainer, resume_from) if resume_from else None
    if last is not None:  # training had ended; only the final save is missing: no extra step
        from transformers import TrainerState

        if trainer.is_world_process_zero():
            banner.console.print(f"{resume_from.name} is at the last step ({last}): writing the final model from it")
        trainer._load_from_checkpoint(str(resume_from))
        trainer.state = TrainerState.load_from_json(str(resume_from / "trainer_state.json"))
        metrics = {
            k: v for h in trainer.state.log_history for k, v in h.items() if k in ("train_loss", "train_runtime")
        }
    else:
        with guard:
            result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        if guard.signum is not None:
            _report_interrupt(cfg, trainer, guard)
            raise SystemExit(guard.exit_code)
        metrics = dict(result.metrics)
        if not math.isfinite(metrics.get("train_loss", 0.0)):
            raise TrainingError(
                f"training diverged: the mean training loss is {metrics['train_loss']}; "
                f"no final model was written. Try a lower --lr (now {cfg.lr:g}), a "
                "warmup (--warmup-ratio 0.05) or --precision fp32"
            )

    if prepared.eval is not None:
        metrics.update(trainer.evaluate())
    sizes = checkpoints.save_final(trainer, tokenizer, cfg.output_dir)
    report = None
    drift_report = None
    if baseline is not None:
        from posttrainllm import drift

        drift_report = drift.measure(trainer.model, baseline, plan)  # every rank: FSDP gathers sharded tensors
    # every rank: the forward pass of a sharded model (FSDP, ZeRO-3) is collective
    after = None
    if before is not None:
        reference = _kl_reference(cfg, model_path, precision)
        after = _ood_eval(trainer.model, tokenizer, cfg, reference=reference)
        del reference
    if trainer.is_world_process_zero():
        out = Path(cfg.output_dir)
        trainer.state.save_to_json(str(out / "trainer_state.json"))
        results = {"train": metrics, "wall_time_s": round(time.time() - t0, 2)}
        if before is not None:
            from posttrainllm.evaluate import forgetting_report

            report = forgetting_report(before, after)
            results["ood"] = report
            _log_forgetting(trainer, report)
        if drift_report is not None:
            results["drift"] = drift_report
            _write_drift(run_dir, out, drift_report)
        write_json(out / "eval_results.json", results)
        _write_model_card(cfg, run_dir, plan, prepared, metrics, report, drift_report, model_path)
        write_json(
            out / layout.FINAL_MARKER,
            {
                "global_step": trainer.state.global_step,
                "train_loss": metrics.get("train_loss"),
                "eval_loss": metrics.get("eval_loss"),
                "files": sizes,
            },
        )
    run_dir.finish()  # the new final save is complete: what --overwrite moved aside can go
    if trainer.is_world_process_zero():
        if report:
            banner.print_forgetting(report)
        if drift_report is not None:
            banner.print_drift(drift_report)
        first = int(resume_from.name.split("-")[1]) if resume_from and last is None else 0
        banner.print_summary(metrics, cfg.output_dir, first_step=first, last_step=trainer.state.global_step)


_TOKENIZER_PROBE = "The quick brown fox, 1234 times.\ndef f(x):\n    return {'a': x}  # ünïcode"


def _eval_reference(cfg, tokenizer):
    """eval --reference: the reference model, checked to tokenize like the model (KL compares token by token)."""
    from posttrainllm import evaluate as ev

    ref_model, ref_tok = ev.load_for_eval(cfg.reference, trust_remote_code=cfg.trust_remote_code)
    ids = tokenizer(_TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    if ref_tok(_TOKENIZER_PROBE, add_special_tokens=False)["input_ids"] != ids:
        raise UsageError(
            f"--reference {cfg.reference} tokenizes text differently from --model {cfg.model}: the KL compares "
            "token by token, so pass the model's own base"
        )
    return ref_model


def _model_name(ref: str, source: dict | None) -> str:
    """The banner's name of the model: the reference as given, or a GGUF file with its quantization."""
    from posttrainllm import gguf

    return gguf.describe(source) if source else ref


def gguf_note(source: dict) -> str | None:
    from posttrainllm import gguf

    return gguf.low_bit_note(source)


def _gguf_record(model_path: str | None) -> dict | None:
    from posttrainllm import gguf

    return gguf.read_source(model_path) if model_path else None


def _report_interrupt(cfg, trainer, guard) -> None:
    """Where the interrupt checkpoint is and the command that resumes (rank 0); a note from any other rank that
    stopped because another one received the signal."""
    import shlex
    import signal

    from posttrainllm import distributed

    step = trainer.state.global_step
    why = f" (another rank received {signal.Signals(guard.signum).name})" if guard.from_other_rank else ""
    if not trainer.is_world_process_zero():
        if guard.from_other_rank:
            print(
                f"rank {os.environ.get('RANK', '?')}: stopped at step {step}{why}; "
                f"checkpoint saved in {cfg.output_dir}",
                file=sys.stderr,
                flush=True,
            )
        return
    args = [a for a in cfg.argv if a != "--overwrite"]
    resume_cmd = "posttrainllm " + " ".join(shlex.quote(a) for a in args + ([] if "--resume" in args else ["--resume"]))
    where = " (under the same launcher, on every node)" if distributed.world_size() > 1 else ""
    banner.console.print(
        banner.styled(
            ("interrupted", "yellow"),
            f" at step {step}{why}: checkpoint saved in {cfg.output_dir}. Resume with{where}:\n  {resume_cmd}",
        )
    )


def _log_forgetting(trainer, report: dict) -> None:
    """The forgetting report to the experiment trackers too (ood/<file>/ppl_before, ppl_after, change_pct)."""
    logs = {}
    for name, r in report.items():
        for key, value in (
            ("ppl_before", r.get("before")),
            ("ppl_after", r.get("after")),
            ("change_pct", r.get("change_pct")),
        ):
            if isinstance(value, (int, float)) and math.isfinite(value):
                logs[f"ood/{name}/{key}"] = value
    if logs and trainer.args.report_to not in (None, "none", [], ["none"]):
        trainer.log(logs)


def _write_drift(run_dir, out: Path, report: dict) -> None:
    from posttrainllm import drift

    run_dir.own(["drift.json", "drift.png"])
    write_json(out / "drift.json", report)
    note = drift.plot(report, out / "drift.png", title=f"weight drift per depth: {out.name}")
    if note:
        banner.note(note)


def _write_model_card(
    cfg,
    run_dir,
    plan,
    prepared,
    metrics: dict,
    forgetting: dict | None,
    drift_report: dict | None,
    model_path: str | None = None,
) -> None:
    from posttrainllm import model_card

    run_dir.own(["README.md"])
    data = {
        "source": prepared.source,
        "format": prepared.format,
        "n_train": prepared.n_train,
        "n_eval": prepared.n_eval,
        "eval_source": prepared.eval_source,
    }
    text = model_card.render(
        command=cfg.command,
        argv=cfg.argv,
        recipe=cfg.recipe,
        base_model=None if cfg.command == "pretrain" else cfg.model,
        plan=plan,
        data=data,
        metrics=metrics,
        forgetting=forgetting,
        drift=drift_report,
        output_dir=cfg.output_dir,
        model_source=_gguf_record(model_path),
    )
    tmp = Path(cfg.output_dir) / "README.md.tmp"
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(Path(cfg.output_dir) / "README.md")


def pretrain(cfg) -> None:
    """From scratch: train a byte-level BPE tokenizer on the corpus, build a preset model, causal-LM training."""
    prepared_output = _prepare_output(cfg)
    if prepared_output is None:
        return
    run_dir, resume_from = prepared_output
    with run_dir:
        _across_ranks(cfg, lambda: _pretrain(cfg, run_dir, resume_from))


def _pretrain(cfg, run_dir, resume_from) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from posttrainllm import data, models
    from posttrainllm.trainers import quiet_progress_bars

    quiet_progress_bars()
    from posttrainllm.trainers import check_optim_name, total_steps

    set_seed(cfg.seed)
    check_optim_name(cfg.optim)
    precision = models.pick_precision(cfg.precision)
    trainer_args = _check_trainer_args(cfg, "causal_lm", precision)
    models.check_model_config(cfg.model_config)
    corpus = data.load_texts(cfg.dataset, streaming=cfg.streaming)  # checked to be plain text before any training
    tok_dir = Path(cfg.output_dir) / "tokenizer"
    if resume_from and tok_dir.is_dir():
        tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    else:  # trained from batches of text, never from one string holding the corpus
        tokenizer = models.train_bpe_tokenizer(data.iter_texts(corpus), cfg.vocab_size)
    prepared = data.prepare_text(cfg.dataset, tokenizer, max_length=cfg.max_length, **_data_options(cfg))
    config = models.scratch_config(cfg.model_config, len(tokenizer), cfg.max_length, tokenizer)
    model = AutoModelForCausalLM.from_config(config)
    plan = plan_param_groups(cfg, model)
    info = {
        "model": f"from scratch: {cfg.model_config} ({config.model_type}, "
        f"{plan.num_layers} blocks, "
        f"{banner.fmt_count(sum(p.numel() for p in model.parameters()))} params)",
        "tokenizer": f"byte-level BPE, {len(tokenizer)} tokens, trained on the corpus",
        "data": data.describe(prepared),
        "steps": f"{total_steps(cfg, prepared.n_train)} (batch {cfg.batch_size} × accum "
        f"{cfg.grad_accum}, block length {cfg.max_length})",
        "base LR": f"{cfg.lr:g} ({cfg.lr_scheduler}, warmup {cfg.warmup_ratio:g}, optim "
        f"{cfg.optim}, weight decay {cfg.weight_decay:g})",
        "precision": f"{precision} on {_device_name()} ({models.precision_reason(cfg.precision, precision)})",
        "recipe": cfg.recipe,
        "output": cfg.output_dir + (f" (resuming from {resume_from.name})" if resume_from else ""),
    }
    if _show_plan(
        cfg,
        info,
        plan,
        bottom_scale_note(cfg, plan) + models.precision_notes(precision),
        {"n_train": prepared.n_train, "n_eval": prepared.n_eval, "trainer_args": trainer_args},
        run_dir,
    ):
        return
    if is_rank0():
        run_dir.own(["tokenizer"])
        tokenizer.save_pretrained(str(tok_dir))
    _run_trainer(cfg, "causal_lm", model, tokenizer, prepared, precision, resume_from, run_dir, plan)


def evaluate(cfg) -> None:
    """posttrainllm eval: perplexity per text file, optional SFT completion loss; --json prints only JSON."""
    from posttrainllm import evaluate as ev
    from posttrainllm.config import producing_recipe
    from posttrainllm.models import resolve_model
    from posttrainllm.trainers import quiet_progress_bars

    quiet_progress_bars()
    model_path, _ = resolve_model(
        cfg.model, hint=lambda: producing_recipe(cfg.recipe, cfg.model), trust_remote_code=cfg.trust_remote_code
    )
    model, tokenizer = ev.load_for_eval(model_path, trust_remote_code=cfg.trust_remote_code)
    from posttrainllm.models import max_positions

    cfg, clamped = _clamp_max_length(cfg, max_positions(model_path, cfg.trust_remote_code))
    for note in clamped:
        print(f"note: {note}", file=sys.stderr)
    reference = _eval_reference(cfg, tokenizer) if cfg.reference else None
    sft_examples = None
    if cfg.sft_dataset:
        from posttrainllm import data

        sft_examples = data.load(cfg.sft_dataset)  # memory-mapped; scored in chunks
    results = ev.evaluate_files(
        model,
        tokenizer,
        list(cfg.text),
        cfg.max_length,
        sft_examples=sft_examples,
        progress=not cfg.json,
        batch_size=cfg.eval_batch_size,
        reference=reference,
    )
    if cfg.json:
        print(json.dumps(ev.json_ready(results), allow_nan=False))
        return
    from rich.table import Table

    t = Table(title=f"eval: {cfg.model} (windows of {cfg.max_length} tokens)", title_justify="left")
    cols = ("input", "perplexity", "tokens") + (("KL(reference ‖ model)/token",) if reference is not None else ())
    for col in cols:
        t.add_column(col, justify="left" if col == "input" else "right")
    for name, r in results.items():
        kl = [f"{r['kl']:.4f}" if r.get("kl") is not None else "-"] if reference is not None else []
        if "perplexity" in r:
            t.add_row(name, f"{r['perplexity']:.4f}", str(r["tokens"]), *kl)
        else:
            t.add_row(name + " (completion loss)", f"{r['loss']:.4f}", str(r.get("completion_tokens", "")), *kl)
    banner.console.print(t)
