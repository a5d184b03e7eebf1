"""The lifecycle every training command shares (sft, dpo, finetune, pretrain), like torchtune's recipe
setup → train → cleanup:

    prepare the output dir (ownership, lock, resume point)          posttrainllm/rundir/
    → across the ranks: seed, precision, --trainer-arg checked and the trainer config built, before any model loads
    → setup(ctx): the command's own part (model, tokenizer, data, plan, banner rows)   posttrainllm/commands/
    → banner, param_groups.json, run_config.json (a dry run stops here)
    → train (or, at the last step already, only the final save)     posttrainllm/training/
    → finalize: final save, drift, forgetting (PPL, KL), records, model card, summary

This is where the CLI path first imports torch/transformers/TRL (through its callees). What differs between the
commands is read off the command's spec (posttrainllm/spec.py), handed in by the CLI: `main(cfg, spec)` is every
training command's main.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from posttrainllm.context import Context, Setup
from posttrainllm.errors import DataError, TrainingError, UsageError
from posttrainllm.reporting import banner, records
from posttrainllm.rundir import checkpoints, fingerprint, layout, outdir, signals
from posttrainllm.rundir.layout import is_rank0, write_json
from posttrainllm.spec import load
from posttrainllm.training.forgetting import (
    StartingModel,
    meet_budget,
    ood_after,
    ood_before,
    probe_after,
    probe_texts,
)

if TYPE_CHECKING:
    from posttrainllm.config.runconfig import RunConfig
    from posttrainllm.spec import CommandSpec


def main(cfg: RunConfig, spec: CommandSpec) -> None:
    """Every training command's main: the lifecycle, with the setup its spec names (`CommandSpec.setup`)."""
    assert spec.setup, f"{spec.name} trains nothing"
    run(cfg, spec, load(spec.setup))


def run(cfg: RunConfig, spec: CommandSpec, setup: Callable[[Context], Setup]) -> None:
    """The whole lifecycle of one training command (module docstring)."""
    prepared_output = prepare_output(cfg)
    if prepared_output is None:
        return
    run_dir, resume_from = prepared_output
    with run_dir:  # holds the output directory's lock; puts replaced contents back if the run fails early
        across_ranks(cfg, lambda: _lifecycle(cfg, spec, setup, run_dir, resume_from))


def _lifecycle(cfg: RunConfig, spec: CommandSpec, setup, run_dir, resume_from) -> None:
    from transformers import set_seed

    from posttrainllm import models
    from posttrainllm.training import (
        check_optim_name,
        check_trainer_args,
        quiet_progress_bars,
        trainer_config,
    )

    quiet_progress_bars()
    set_seed(cfg.seed)
    check_optim_name(cfg.optim)
    precision = models.pick_precision(cfg.precision)
    # --trainer-arg checked once (names, owners, types), before any model loads
    trainer_args = check_trainer_args(spec, cfg.trainer_args or {})
    has_eval = bool(cfg.eval_split or cfg.eval_dataset)
    s = setup(Context(cfg=cfg, spec=spec, precision=precision, trainer_args=trainer_args, resume_from=resume_from))
    # the run's trainer config, built once from what the setup settled (a clamped --max-length, fitted completion
    # lengths, what the loss falls on): nothing patches it afterwards
    conf = trainer_config(spec, s.cfg, precision, has_eval=has_eval, extra=trainer_args, loss=s.prepared.loss)
    if show_plan(s.cfg, s.info, s.plan, s.notes, {**s.resolved, "trainer_args": trainer_args}, run_dir):
        return
    if s.after_plan is not None and is_rank0():
        s.after_plan(run_dir)
    with signals.stop_on_signal("the steps before training"):  # the base's evaluation, the probe: minutes, maybe
        before = ood_before(s, precision) if s.cfg.ood_eval else None
        probe = probe_texts(s, spec, run_dir) if before is None else None
        if s.cfg.max_forgetting is not None and before is None and not probe:
            raise UsageError("--max-forgetting needs --ood-eval FILE or the forgetting probe, which this run "
                "cannot draw (a vision-language model, or no sample to predict): give --ood-eval FILE")  # fmt: skip
    train_and_finalize(s, spec, conf, precision, resume_from, run_dir, before, probe)


def prepare_output(cfg: RunConfig):
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
            banner.note(f"skipped checkpoint(s): {checkpoints.describe_skipped(skipped)}")
    return run_dir, resume_from


def show_plan(cfg: RunConfig, info: dict, plan, notes: list[str], extra: dict, run_dir) -> bool:
    """Banner + param_groups.json + run_config.json (rank 0). Returns True for a dry run (nothing to train).

    A real run first lets --overwrite move the previous contents aside (run_dir.start). A dry run writes its plan
    only into a directory that holds no run (it leaves a previous run exactly as it is)."""
    if not is_rank0():
        return cfg.dry_run
    if cfg.llrd_bottom_scale:
        extra = {**extra, "llrd_gamma_from_bottom_scale": plan.gamma}
    extra = {**extra, fingerprint.RESOLVED: fingerprint.resolved_record(cfg.to_dict(), plan.gamma, plan.num_layers)}
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


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"


def across_ranks(cfg: RunConfig, fn) -> None:
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


def _at_last_step(trainer, checkpoint: Path) -> int | None:
    """The checkpoint's step when it is already at the run's last step (a crash hit the final save), else None."""
    try:
        step = int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    *_, max_steps = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())
    return step if step >= max_steps else None


def train_and_finalize(s: Setup, spec: CommandSpec, conf, precision: str, resume_from, run_dir, before, probe=None):
    """Build the trainer (with `conf`, the run's trainer config), train (or finish a run that already reached its
    last step), then finalize."""
    from posttrainllm.training import build_trainer

    cfg = s.cfg
    guard = signals.InterruptGuard()
    with signals.stop_on_signal("the trainer's setup"):  # until training's own guard takes the signals over
        trainer = build_trainer(
            spec,
            cfg,
            args=conf,
            model=s.model,
            tokenizer=s.tokenizer,
            train=s.prepared.train,
            eval_ds=s.prepared.eval,
            plan=s.plan,
            callbacks=[signals.make_callback(guard)],
            **s.trainer_models,
        )
        if cfg.report_to in ("tensorboard", "all"):
            run_dir.own(["runs"])  # TensorBoard's event files: OUT/runs/<date>_<host>/
        baseline = None
        if not spec.from_scratch:  # the weights before training, for the drift report (files on disk)
            from posttrainllm.reporting import drift

            baseline = drift.Baseline(trainer.model, s.model_path or cfg.model)
        t0 = time.time()
        last = _at_last_step(trainer, resume_from) if resume_from else None
        if last is None:
            check_batches(trainer, cfg)
    metrics = _finish_from(trainer, resume_from, last) if last is not None else _train(cfg, trainer, guard, resume_from)
    if s.prepared.eval is not None:
        metrics.update(trainer.evaluate())
    _finalize(s, trainer, metrics, precision, run_dir, baseline, (before, probe), t0)
    if trainer.is_world_process_zero():
        first = int(resume_from.name.split("-")[1]) if resume_from and last is None else 0
        banner.print_summary(metrics, cfg.output_dir, first_step=first, last_step=trainer.state.global_step)


def check_batches(trainer, cfg: RunConfig) -> None:
    """Training data that fills no batch trains nothing (transformers would stop at step 0, or fail on a length of
    0): a DataError saying how many rows a step needs. A stream has no length and is not checked."""
    data = trainer.train_dataset
    if not hasattr(data, "__len__") or len(data) == 0:
        return  # an empty dataset is reported by the builder
    sampler = trainer._get_train_sampler()  # not the dataloader: preparing one would draw from the global RNG
    if sampler is None or not hasattr(sampler, "__len__") or len(sampler) > 0:
        return
    need = getattr(sampler, "batch_size", None) or cfg.batch_size
    what = "prompt" if hasattr(sampler, "mini_repeat_count") else "row"
    raise DataError(
        f"nothing left to train on: {len(data)} training {what}(s), but one step takes {need} {what}s "
        "(--batch-size × --grad-accum × ranks, over --num-generations for sampled completions); add data or lower "
        "--batch-size / --grad-accum"
    )


def _check_trained(trainer, cfg: RunConfig, resume_from) -> None:
    """A run that asked for training (--max-steps or --epochs) but made no optimizer step is no success: a
    TrainingError (exit 1), before anything is saved as the final model."""
    first = int(resume_from.name.split("-")[1]) if resume_from else 0
    if trainer.state.global_step > first:
        return
    asked = f"--max-steps {cfg.max_steps}" if cfg.max_steps > 0 else f"--epochs {cfg.epochs:g}"
    raise TrainingError(
        f"nothing was trained: {asked} was asked for, but the run ended at step {trainer.state.global_step} without "
        "an optimizer step (no batch of training data); no final model was written. Add data or lower --batch-size"
    )


def _finish_from(trainer, checkpoint: Path, last: int) -> dict:
    """Training had ended at `checkpoint`; only the final save is missing: load it, no extra step."""
    from transformers import TrainerState

    if trainer.is_world_process_zero():
        banner.console.print(f"{checkpoint.name} is at the last step ({last}): writing the final model from it")
    trainer._load_from_checkpoint(str(checkpoint))
    trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    return {k: v for h in trainer.state.log_history for k, v in h.items() if k in ("train_loss", "train_runtime")}


def _train(cfg: RunConfig, trainer, guard, resume_from) -> dict:
    """trainer.train under the signal guard; an interrupt exits with its code, a NaN/inf mean loss is an error."""
    with guard:
        result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    if guard.signum is not None:
        records.report_interrupt(cfg, trainer, guard)
        raise SystemExit(guard.exit_code)
    _check_trained(trainer, cfg, resume_from)
    metrics = dict(result.metrics)
    if not math.isfinite(metrics.get("train_loss", 0.0)):
        raise TrainingError(
            f"training diverged: the mean training loss is {metrics['train_loss']}; "
            f"no final model was written. Try a lower --lr (now {cfg.lr:g}), a "
            "warmup (--warmup-ratio 0.05) or --precision fp32"
        )
    return metrics


def _finalize(s: Setup, trainer, metrics: dict, precision: str, run_dir, baseline, measures, t0: float) -> None:
    """Final save, drift, forgetting (every rank: sharded models gather collectively; `measures`: the held-out
    results before training and the probe's texts), then rank 0's records; the replaced contents go once the final
    save is complete."""
    cfg = s.cfg
    before, probe = measures
    sizes = checkpoints.save_final(trainer, s.tokenizer, cfg.output_dir)
    drift_report = None
    if baseline is not None:
        from posttrainllm.reporting import drift

        drift_report = drift.measure(trainer.model, baseline, s.plan)  # every rank: FSDP gathers sharded tensors
    after, budget = None, None
    starting = StartingModel(s, precision)  # loaded again once, if a measurement below needs it
    if before is not None:  # every rank: the forward pass of a sharded model (FSDP, ZeRO-3) is collective
        after = ood_after(s, trainer.model, precision, starting)
        if cfg.max_forgetting is not None:
            measured = {"before": before, "after": after}
            budget, after, sizes = meet_budget(s, trainer, metrics, measured, precision, run_dir, sizes, starting)
    probed = probe_after(s, trainer.model, probe, precision, starting) if probe else None
    if probe and cfg.max_forgetting is not None:  # no --ood-eval: the budget is on the probe
        measured = {"probe": probe, "probed": probed}
        budget, probed, sizes = meet_budget(s, trainer, metrics, measured, precision, run_dir, sizes, starting)
    del starting  # its memory goes before the records are written
    report = None
    if trainer.is_world_process_zero():
        extra = {"budget": budget, "probe": probed}
        report = _write_records(s, trainer, metrics, sizes, run_dir, before, after, drift_report, t0, extra)
    run_dir.finish()  # the new final save is complete: what --overwrite moved aside can go
    if trainer.is_world_process_zero():
        if report:
            banner.print_forgetting(report)
        if drift_report is not None:
            banner.print_drift(drift_report)
        if budget is not None:
            banner.print_budget(budget)
        if probed is not None:
            banner.print_probe(probed)
    if budget is not None and budget["only_base"]:
        from posttrainllm.errors import BudgetNotMet

        raise BudgetNotMet(
            f"--max-forgetting {cfg.max_forgetting:g}: only the starting model meets it (every merge toward it that "
            f"was measured, down to α {min(t['alpha'] for t in budget['tried']):g}, forgets more); the trained model "
            f"is in {cfg.output_dir}. Raise the budget, lower --lr, or add replay"
        )


def peak_memory() -> int:
    """The run's peak memory in bytes: the GPU's allocated peak on a GPU, else the process's peak RSS."""
    import resource
    import sys

    import torch

    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


def _write_records(s: Setup, trainer, metrics, sizes, run_dir, before, after, drift_report, t0, extra: dict):
    """trainer_state.json, eval_results.json (with forgetting, drift, and `extra`: the budget and the probe), the
    model card, then the final marker. Returns the forgetting report (None without --ood-eval)."""
    cfg = s.cfg
    out = Path(cfg.output_dir)
    trainer.state.save_to_json(str(out / "trainer_state.json"))
    results = {"train": metrics, "wall_time_s": round(time.time() - t0, 2), "peak_memory_bytes": peak_memory()}
    results.update({k: v for k, v in extra.items() if v is not None})
    report = None
    if before is not None:
        from posttrainllm.evaluate import forgetting_report

        report = forgetting_report(before, after)
        results["ood"] = report
        records.log_forgetting(trainer, report)
    if drift_report is not None:
        results["drift"] = drift_report
        records.write_drift(run_dir, out, drift_report)
    write_json(out / "eval_results.json", results)
    records.write_model_card(cfg, run_dir, s.plan, s.prepared, metrics, report, drift_report, s.model_path, extra)
    write_json(
        out / layout.FINAL_MARKER,
        {
            "global_step": trainer.state.global_step,
            "train_loss": metrics.get("train_loss"),
            "eval_loss": metrics.get("eval_loss"),
            "files": sizes,
        },
    )
    return report
