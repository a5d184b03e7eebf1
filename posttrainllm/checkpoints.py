"""Nothing lost on a crash: output-dir safety, complete-checkpoint markers, SIGTERM/SIGINT → checkpoint, atomic final save.

- A checkpoint counts as complete only once `checkpoint-N/COMPLETE` exists. The marker is written by a callback
  after transformers has finished writing every file of the checkpoint, so a crash mid-save leaves a checkpoint
  without the marker, which `--resume` skips.
- SIGTERM/SIGINT during training: the current step finishes, a checkpoint is saved, the run exits with
  143 (SIGTERM) or 130 (SIGINT) after printing the resume command. A second signal aborts at once.
- The final model is written to `OUT/.final-tmp/`, then moved into `OUT/` with `config.json` last and
  `training_complete.json` after it: a crash mid-save never leaves a directory that loads as a model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

from posttrainllm.errors import UsageError

MARKER = "COMPLETE"
FINAL_MARKER = "training_complete.json"
RUN_CONFIG = "run_config.json"
EXIT_SIGTERM, EXIT_SIGINT = 143, 130
_CKPT = re.compile(r"^checkpoint-(\d+)$")

# keys that change what a resumed optimizer would do; resuming with other values is refused by default
RESUME_KEYS = ("model", "lr", "llrd", "lr_layer_decay", "llrd_min_scale", "llrd_freeze_below", "llrd_blocks", "tied_embeddings", "lr_groups", "loraplus_ratio", "weight_decay", "optim", "lr_scheduler", "warmup_ratio", "lora_r", "lora_alpha", "lora_targets", "batch_size", "grad_accum", "max_steps", "epochs", "seed", "model_config")

# files a run writes that are not a trained model (a dry run may overwrite these)
PLAN_FILES = {"param_groups.json", RUN_CONFIG}


def is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def check_output_dir(out: str, *, overwrite: bool, resume: bool, dry_run: bool) -> None:
    """Refuse a non-empty output dir unless --overwrite or --resume (a dry run may reuse a dir holding only a plan)."""
    p = Path(out).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(f"--output-dir {out} is a file")
    entries = {e.name for e in p.iterdir()} if p.is_dir() else set()
    if resume:
        if not entries:
            raise UsageError(f"--resume: {out} has no checkpoints to resume from")
        return
    if not entries or overwrite:
        return
    if dry_run and entries <= PLAN_FILES:
        return
    raise UsageError(f"--output-dir {out} is not empty; pass --overwrite to replace it or --resume to continue its run")


def clear_output_dir(out: str) -> None:
    """--overwrite: remove what a previous posttrainllm run left, so nothing stale is mistaken for this run's output.

    Only a directory that a run of this tool wrote (it holds run_config.json or checkpoints) is emptied; any other
    non-empty directory is written into as it is, never wiped.
    """
    p = Path(out)
    if not p.is_dir() or not ((p / RUN_CONFIG).exists() or any(p.glob("checkpoint-*"))):
        return
    for e in p.iterdir():
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()


def complete_checkpoints(out: str) -> tuple[list[Path], list[Path]]:
    """(complete, incomplete) checkpoint dirs, oldest first."""
    p = Path(out)
    found = sorted(((int(m.group(1)), d) for d in p.glob("checkpoint-*") if d.is_dir() and (m := _CKPT.match(d.name))), key=lambda t: t[0]) if p.is_dir() else []
    done = [d for _, d in found if (d / MARKER).is_file()]
    partial = [d for _, d in found if not (d / MARKER).is_file()]
    return done, partial


def resume_checkpoint(out: str) -> tuple[Path, list[Path]]:
    done, partial = complete_checkpoints(out)
    if not done:
        extra = f" ({len(partial)} incomplete checkpoint(s) skipped: {', '.join(d.name for d in partial)})" if partial else ""
        raise UsageError(f"--resume: no complete checkpoint in {out}{extra}")
    newest = done[-1]
    skipped = [d for d in partial if int(d.name.split("-")[1]) > int(newest.name.split("-")[1])]
    return newest, skipped


def check_resume_config(out: str, current: dict, allow_change: bool) -> None:
    """Refuse to resume with a different LR / γ / grouping (PyTorch would silently keep the old group LRs)."""
    path = Path(out) / RUN_CONFIG
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    diffs = [f"{k}: {saved.get(k)!r} → {current.get(k)!r}" for k in RESUME_KEYS if k in saved and k in current and saved.get(k) != current.get(k)]
    if diffs and not allow_change:
        raise UsageError(f"--resume with a different configuration than the checkpoint's run ({'; '.join(diffs)}); the resumed optimizer would keep its old per-group LRs. Resume with the original values, or pass --allow-config-change to apply the new ones")


def write_json(path: Path, data) -> None:
    """Write JSON atomically (temp file + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def save_final(trainer_or_model, tokenizer, out: str) -> None:
    """Save model + tokenizer (safetensors) so that a crash mid-save never leaves a model that looks whole.

    Call on every rank (FSDP/DeepSpeed gather weights collectively); only rank 0 writes and moves files."""
    outp = Path(out)
    tmp = outp / ".final-tmp"
    if is_rank0() and tmp.exists():
        shutil.rmtree(tmp)
    if hasattr(trainer_or_model, "save_model"):  # every rank: FSDP/DeepSpeed gather the weights collectively
        trainer_or_model.save_model(str(tmp))
    elif is_rank0():
        trainer_or_model.save_pretrained(str(tmp), safe_serialization=True)
    if not is_rank0():
        return
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    files = sorted(tmp.iterdir(), key=lambda f: (f.name in ("config.json", "adapter_config.json"), f.name))
    (outp / FINAL_MARKER).unlink(missing_ok=True)
    for f in files:  # weights first, config last
        os.replace(f, outp / f.name)
    tmp.rmdir()


class InterruptGuard:
    """Context manager: the first SIGTERM/SIGINT asks the trainer to checkpoint and stop; a second one aborts."""

    def __init__(self):
        self.signum: int | None = None
        self._old = {}

    def _handle(self, signum, frame):
        if self.signum is not None:
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        return False

    @property
    def exit_code(self) -> int:
        return EXIT_SIGINT if self.signum == signal.SIGINT else EXIT_SIGTERM


def make_callback(guard: InterruptGuard):
    """A TrainerCallback that checkpoints+stops on a signal and marks checkpoints complete after each save."""
    from transformers import TrainerCallback

    class SafetyCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if guard.signum is not None:
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if ckpt.is_dir():
                    write_json(ckpt / MARKER, {"step": state.global_step})
            return control

    return SafetyCallback()
